from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint

from autotune.train.selective import SAVED_OPS, saved_output, selective_contexts, selective_policy

aten = torch.ops.aten


def test_the_matmul_like_operations_are_kept_and_the_rest_recomputed() -> None:
    for op in (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.convolution.default):
        assert saved_output(op)
        assert selective_policy(None, op) is CheckpointPolicy.MUST_SAVE
    assert aten._scaled_dot_product_flash_attention_for_cpu.default in SAVED_OPS  # sdpa on the host
    for op in (aten.gelu.default, aten.native_layer_norm.default, aten.add.Tensor, aten._to_copy.default):
        assert not saved_output(op)
        assert selective_policy(None, op) is CheckpointPolicy.PREFER_RECOMPUTE


class _Counted(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the operations run (pushed before checkpoint's own modes: it sees the recompute too)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_backward_recomputes_the_elementwise_operations_but_not_the_matmuls() -> None:
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def block(h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(h @ w) @ w

    with _Counted() as counted:
        out = checkpoint(block, x, use_reentrant=False, context_fn=selective_contexts)
        forward = list(counted.ops)
        counted.ops.clear()
        out.sum().backward()
    assert forward.count("aten.mm.default") == 2 and forward.count("aten.tanh.default") == 1
    recompute = counted.ops[: counted.ops.index("aten.tanh.default") + 1]
    # Backward recomputes tanh from its kept input (the first mm's output) before any mm runs again.
    assert "aten.mm.default" not in recompute
    expected_w, expected_x = torch.autograd.grad(block(x).sum(), (w, x))
    assert torch.equal(w.grad, expected_w) and torch.equal(x.grad, expected_x)
