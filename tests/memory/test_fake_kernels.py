"""A profile for a CUDA run saves what CUDA's kernels save (:mod:`autotune.memory.fake_kernels`):
its fused attention keeps no dropout mask, and its dropout keeps a bool mask, where the host's
kernels keep the attention matrix and masks in the activations' dtype."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autotune import TrainConfig, Workload, predict_memory
from autotune.memory.fake_kernels import kernels_for
from autotune.memory.profile import fake_profile

VOCAB, SEQ, WIDTH, HEADS, BLOCKS, MICRO = 64, 128, 32, 2, 3, 4


class _Block(nn.Module):
    def __init__(self, attention_dropout: float, dropout: float) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.attention_dropout, self.dropout = attention_dropout, nn.Dropout(dropout)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        b, s, _ = h.shape
        q, k, v = (t.view(b, s, HEADS, -1).transpose(1, 2) for t in self.qkv(h).chunk(3, dim=-1))
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return h + self.dropout(self.proj(y.transpose(1, 2).reshape(b, s, WIDTH)))


class _LM(nn.Module):
    def __init__(self, attention_dropout: float, dropout: float) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB)
        self.blocks = nn.ModuleList(_Block(attention_dropout, dropout) for _ in range(BLOCKS))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _loss(model: nn.Module, batch: Any) -> torch.Tensor:
    (ids,) = batch
    return F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())


def _workload(attention_dropout: float = 0.0, dropout: float = 0.0) -> Workload:
    torch.manual_seed(0)
    ids = torch.randint(0, VOCAB, (16, SEQ), generator=torch.Generator().manual_seed(0))
    return Workload(
        name="attention",
        model=_LM(attention_dropout, dropout),
        dataset=torch.utils.data.TensorDataset(ids),
        loss_fn=_loss,
        batch_size=MICRO,
    )


def _peak(workload: Workload, kernels: str, config: TrainConfig | None = None) -> int:
    profile = fake_profile(workload, device_type=kernels)
    assert profile.device_type == kernels
    config = config or TrainConfig(micro_batch_size=MICRO)
    return predict_memory(workload, config, profile=profile, device_type="cuda").total


def test_cuda_s_fused_attention_keeps_no_dropout_mask_where_the_host_keeps_the_attention_matrix() -> None:
    with_dropout = _peak(_workload(attention_dropout=0.1), "cuda")
    # Exactly what the same attention without dropout saves: the output and its log-sum-exp.
    assert with_dropout == _peak(_workload(attention_dropout=0.0), "cuda")
    assert with_dropout == _peak(_workload(attention_dropout=0.0), "cpu")
    # The host's kernels decompose it instead: each block keeps its attention matrix (micro x
    # heads x sequence^2 in fp32), its mask and the masked matrix, at least.
    matrix = MICRO * HEADS * SEQ * SEQ * 4
    assert _peak(_workload(attention_dropout=0.1), "cpu") - with_dropout >= BLOCKS * 3 * matrix


def test_cuda_s_dropout_keeps_a_bool_mask_where_the_host_keeps_one_in_the_activations_dtype() -> None:
    elements = MICRO * SEQ * WIDTH  # one dropout's mask: 4 bytes each in fp32 on the host, 1 on CUDA
    host, cuda = _peak(_workload(dropout=0.1), "cpu"), _peak(_workload(dropout=0.1), "cuda")
    assert host - cuda == BLOCKS * elements * 3
    assert cuda - _peak(_workload(), "cuda") == BLOCKS * elements  # the bool masks alone
    # Recomputed blocks keep neither: the same prediction, whichever kernels.
    recomputed = TrainConfig(micro_batch_size=MICRO, checkpoint=True)
    assert _peak(_workload(dropout=0.1), "cpu", recomputed) == _peak(_workload(dropout=0.1), "cuda", recomputed)


def test_a_transformers_gpt2_s_attention_dropout_costs_nothing_on_cuda() -> None:
    pytest.importorskip("transformers")
    from autotune.zoo import CORPUS

    sizes = {"layers": 2, "width": 64, "heads": 2, "seq_len": 128, "vocab": 256, "num_samples": 8, "batch_size": 4}
    dropped, plain = CORPUS["hf-gpt2"].build(**sizes), CORPUS["hf-gpt2"].build(**sizes)
    assert dropped.model.config.attn_pdrop == 0.1  # GPT-2's own default
    for module in plain.model.modules():  # the same model with attention dropout off
        if hasattr(module, "attn_dropout"):
            module.attn_dropout.p = 0.0
    config = TrainConfig(micro_batch_size=4)
    cuda = predict_memory(dropped, config, profile=fake_profile(dropped, device_type="cuda"), device_type="cuda")
    off = predict_memory(plain, config, profile=fake_profile(plain, device_type="cuda"), device_type="cuda")
    host = predict_memory(dropped, config, profile=fake_profile(dropped, device_type="cpu"), device_type="cuda")
    assert cuda.total == off.total
    assert host.total - cuda.total >= 2 * 3 * (4 * 2 * 128 * 128 * 4)  # per layer: matrix, mask, masked


def test_a_profile_is_reused_only_for_the_same_kernels_and_an_unknown_device_type_is_refused() -> None:
    workload = _workload(attention_dropout=0.1)
    host = fake_profile(workload)
    assert host.device_type == "cpu"
    again = fake_profile(workload, device_type="cuda", reuse=host)
    assert again.modes["fp32"] != host.modes["fp32"]
    assert fake_profile(workload, device_type="cuda", reuse=again).modes["fp32"] is again.modes["fp32"]
    message = "device_type must be one of ('cpu', 'cuda'), but got 'xla'."
    with pytest.raises(ValueError) as e:
        fake_profile(workload, device_type="xla")
    assert str(e.value) == message
    with pytest.raises(ValueError) as e:
        kernels_for("xla")
    assert str(e.value) == message


def test_real_tensors_keep_the_host_s_kernels_while_a_cuda_profile_runs_and_the_functions_come_back() -> None:
    attention, dropout = F.scaled_dot_product_attention, F.dropout
    q = torch.randn(1, 2, 8, 4)
    with kernels_for("cuda") or contextlib.nullcontext():
        assert F.scaled_dot_product_attention is not attention and F.dropout is not dropout
        torch.manual_seed(0)
        inside = (F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), F.dropout(q, 0.5))
    assert (F.scaled_dot_product_attention, F.dropout) == (attention, dropout)
    torch.manual_seed(0)
    outside = (F.scaled_dot_product_attention(q, q, q, dropout_p=0.5), F.dropout(q, 0.5))
    assert all(torch.equal(a, b) for a, b in zip(inside, outside, strict=True))  # the same draws, the same values
