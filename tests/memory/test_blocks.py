from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensor

from autotune import load_workload
from autotune.memory.blocks import fake_forward, profile_blocks
from autotune.memory.predict import profile_memory
from autotune.worst_case import profile_batch
from tests.conftest import make_resmlp
from tests.paths import DATA

DATA_DEPENDENT = f"{DATA / 'data_dependent.py'}:build"


def test_block_saved_bytes_are_exact_and_scale_with_the_batch() -> None:
    wl = make_resmlp()  # 4 identical blocks, d=64, seq 32
    one, two = profile_blocks(wl, micro_batch_size=1), profile_blocks(wl, micro_batch_size=2)
    # Per block and sample: LayerNorm input, LN output + mean + rstd, up-proj output, GELU output:
    # 32 tokens x (64 + 64 + 1 + 1 + 256 + 256) fp32 values = 82,176 bytes.
    assert one.saved_bytes == (82_176,) * 4
    assert two.saved_bytes == (2 * 82_176,) * 4
    assert one.names == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")


def test_the_fake_forward_runs_on_fake_copies_and_leaves_the_model_and_the_mode() -> None:
    wl = make_resmlp()
    batch = profile_batch(wl, 2)
    weight = wl.model.get_submodule("blocks.0.up").weight
    with fake_forward(wl, batch) as (model, fake_batch):
        assert all(isinstance(t, FakeTensor) for t in (*model.parameters(), *fake_batch))
        assert [t.shape for t in fake_batch] == [torch.Size([2, 32, 16]), torch.Size([2, 32])]
        assert model.training
        loss = wl.loss_fn(model, fake_batch)
        assert isinstance(loss, FakeTensor) and loss.shape == torch.Size([])
    # The user's model is not the copy and keeps its real weights; the fake mode ends with the block.
    assert model is not wl.model and not isinstance(weight, FakeTensor)
    assert wl.model.get_submodule("blocks.0.up").weight is weight
    assert not isinstance(torch.zeros(1), FakeTensor)


def test_the_fake_forward_lets_the_caller_answer_what_the_pass_raises() -> None:
    wl = load_workload(DATA_DEPENDENT)  # a forward that branches on a value (.item())
    batch = profile_batch(wl, 2)
    raised = pytest.raises(DataDependentOutputException, match=r"^aten\._local_scalar_dense\.default$")
    with raised, fake_forward(wl, batch) as (model, fake_batch):
        wl.loss_fn(model, fake_batch)
    assert not isinstance(torch.zeros(1), FakeTensor)


def test_a_model_the_fake_pass_cannot_run_is_profiled_for_real() -> None:
    wl = load_workload(DATA_DEPENDENT)
    # Each block's Linear saves its input: 8 fp32 features per sample.
    assert profile_blocks(wl, micro_batch_size=2).saved_bytes == (2 * 8 * 4,) * 2
    assert profile_blocks(wl, micro_batch_size=4).saved_bytes == (4 * 8 * 4,) * 2


def test_bf16_blocks_save_fewer_bytes_per_sample() -> None:
    wl = load_workload("gpt-tiny")
    fp32 = profile_blocks(wl, micro_batch_size=4, precision="fp32")
    bf16_4 = profile_blocks(wl, micro_batch_size=4, precision="bf16")
    bf16_8 = profile_blocks(wl, micro_batch_size=8, precision="bf16")
    per_sample_bf16 = [(b - a) / 4 for a, b in zip(bf16_4.saved_bytes, bf16_8.saved_bytes, strict=True)]
    assert all(s < f / 4 for s, f in zip(per_sample_bf16, fp32.saved_bytes, strict=True))


def test_ranking_puts_hungriest_blocks_first() -> None:
    wl = load_workload("resnet-tiny")  # early stages run at higher resolution: more activations
    prof = profile_blocks(wl, micro_batch_size=2)
    order = prof.ranked()
    assert [prof.saved_bytes[i] for i in order] == sorted(prof.saved_bytes, reverse=True)
    assert prof.names[order[0]].startswith("layer1")


def test_memory_profile_tells_who_keeps_each_block_input() -> None:
    # resnet-tiny, micro-batch 4: block i's input is the final ReLU output of block i - 1 (of the
    # stem for block 0), fp32 whatever the precisions (a bf16 island casts its output back): one
    # storage that either side may save. Composing mixed configs depends on telling who does.
    wl = load_workload("resnet-tiny")
    profile = profile_memory(wl, modes=("fp32", "bf16"), micro_batch_sizes=(2, 4), checkpointed=False)
    fp32, bf16 = profile.modes["fp32"].blocks[1], profile.modes["bf16"].blocks[1]
    # 16, 16, 16, 32, 32, 64 channels of 32x32, 32x32, 32x32, 16x16, 16x16, 8x8, 4 samples, 4 bytes.
    inputs = (262_144,) * 3 + (131_072,) * 2 + (65_536,)
    assert fp32.inputs == bf16.inputs == inputs
    assert fp32.saved_inputs == inputs  # an fp32 first convolution saves its input...
    assert bf16.saved_inputs == (0,) * 6  # ...a bf16 one the bf16 cast it makes
    assert fp32.external == bf16.external == (inputs[0], 0, 0, 0, 0, 0)  # the stem's ReLU
    # The final ReLU saves the block's output, the next block's input (the last one's goes to the
    # head: not counted). In bf16 it does so in fp32 after a residual add with the fp32 input, but
    # the downsampling blocks (2 and 4) add two bf16 branches: their bf16 ReLU output is theirs,
    # and the fp32 cast they return is kept by no one unless the next block is fp32.
    assert fp32.outputs == (*inputs[1:], 0)
    assert bf16.outputs == (inputs[1], inputs[2], 0, inputs[4], 0, 0)


def test_a_block_that_raises_leaves_no_saved_tensor_hooks_behind() -> None:
    # The block profile pushes its saved-tensor hooks as a block starts and popped them only as it
    # returned: a block that raised in the fake pass (which then profiles for real) left them pushed
    # for the rest of the process, and every later step packed its saved tensors through them.
    class Raising(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(x)[x.sum(-1) > 0]  # a data-dependent shape: the fake pass refuses it

    from autotune import Workload

    model = torch.nn.Sequential(Raising(), Raising())
    wl = Workload(
        name="raising",
        model=model,
        dataset=torch.utils.data.TensorDataset(torch.randn(8, 4)),
        loss_fn=lambda m, b: m(b[0]).sum(),
        batch_size=4,
        blocks=["0", "1"],
    )
    profile_blocks(wl, micro_batch_size=4)  # the fake pass raises in block 0, then it is profiled for real
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
