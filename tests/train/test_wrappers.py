from __future__ import annotations

import torch

from autotune.train.wrappers import apply_block_knobs
from tests.conftest import make_resmlp


def _hooks(model: torch.nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()]


def test_apply_then_remove_restores_the_model_exactly() -> None:
    model = make_resmlp().model
    names = [f"blocks.{i}" for i in range(4)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = _hooks(model)
    x = torch.randn(2, 32, 16)
    reference = model(x)
    wrappers = apply_block_knobs(
        model, names, ["bf16", "fp16", "fp32", "fp32"], [True, False, True, False], device_type="cpu"
    )
    assert sum("forward" in model.get_submodule(n).__dict__ for n in names) == 3  # fp32 + no ckpt: untouched
    wrapped = model(x)
    assert wrapped.dtype == torch.float32  # blocks hand fp32 back to the fp32 rest of the model
    assert not torch.equal(wrapped, reference)  # low precision really ran
    wrappers.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert _hooks(model) == hooks
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(x), reference)


def test_checkpointing_gives_identical_loss_and_gradients() -> None:
    model = make_resmlp().model
    x = torch.randn(4, 32, 16)
    model(x).square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    wrappers = apply_block_knobs(model, [f"blocks.{i}" for i in range(4)], ["fp32"] * 4, [True] * 4, device_type="cpu")
    model(x).square().mean().backward()
    wrappers.remove()
    recomputed = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed, strict=True))
