"""Fake-tensor kernels that get a real run wrong, answered by :class:`RealWorkspaces`: a mixture of
experts (transformers' grouped-matmul experts, whose meta kernel refuses fp32) predicted exactly."""

from __future__ import annotations

import pytest
import torch

from autotune import TrainConfig, Workload, measure, predict_memory
from autotune.memory.fake_workspaces import RealWorkspaces

transformers = pytest.importorskip("transformers")


def _mixtral() -> Workload:
    config = transformers.MixtralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    torch.manual_seed(0)
    tokens = torch.randint(0, 64, (16, 24), generator=torch.Generator().manual_seed(0))
    return Workload(
        name="mixtral-tiny",
        model=transformers.MixtralForCausalLM(config),
        dataset=torch.utils.data.TensorDataset(tokens),
        loss_fn=lambda model, batch: model(input_ids=batch[0], labels=batch[0]).loss,
        batch_size=8,
    )


def test_the_grouped_matmul_meta_kernel_refuses_fp32_so_the_mode_answers_it() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no grouped matmul")
    a, b = torch.randn(10, 8), torch.randn(3, 8, 4)  # rows of 16 bytes: the kernel's alignment
    offs = torch.tensor([4, 7, 10], dtype=torch.int32)
    real = torch._grouped_mm(a, b, offs=offs)  # the CPU kernel takes fp32
    with FakeTensorMode() as fake:
        fa, fb, fo = fake.from_tensor(a), fake.from_tensor(b), fake.from_tensor(offs)
        with pytest.raises(RuntimeError, match="Expected inputs of BF16 type"):
            torch._grouped_mm(fa, fb, offs=fo)
        with RealWorkspaces():
            out = torch._grouped_mm(fa, fb, offs=fo)
    assert (out.shape, out.dtype) == (real.shape, real.dtype)


@pytest.mark.parametrize("checkpoint", [False, "selective"])
def test_a_mixture_of_experts_in_fp32_is_predicted_exactly(checkpoint: bool | str) -> None:
    workload = _mixtral()
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=checkpoint)
    estimate = predict_memory(workload, config)
    measured = measure(workload, config, steps=1, warmup=1)
    assert estimate.verified
    # Within 32 bytes, not exact: the router's data-dependent index tensors (which tokens each
    # expert takes) are sized from fake values in the profile.
    assert abs(estimate.total - measured.peak_bytes) <= 32, (estimate.total, measured.peak_bytes)
