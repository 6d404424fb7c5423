"""Adaptive in a Lightning Fabric loop (litgpt's scripts are such loops): what ``fabric.setup``
returns on one device is trained inside its wrappers (autotune.adapt.fabric)."""

from __future__ import annotations

import re
import socket
import warnings
from collections.abc import Iterator

import lightning as L
import pytest
import torch

from autotune import TrainConfig
from autotune.adapt import Adaptive
from autotune.adapt.fabric import fabric_inner, is_fabric_module
from autotune.errors import UnsupportedError
from tests.conftest import make_resmlp

BATCH = 32
FIXED = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None)


def _fabric(precision: str) -> L.Fabric:
    with warnings.catch_warnings():  # "bf16-mixed on the CPU": what a Fabric user on a laptop sees
        warnings.simplefilter("ignore")
        return L.Fabric(accelerator="cpu", devices=1, precision=precision)  # type: ignore[arg-type]


def _seconds_out(line: str) -> str:
    return re.sub(r"\d+\.\d s\)$", "s)", line)


def _losses(precision: str | None, policy: TrainConfig = FIXED, steps: int = 3) -> tuple[list[float], list[str]]:
    """The losses of ``steps`` adaptive steps of the seeded resmlp, set up by Fabric at ``precision``
    (None: no Fabric), and the run's progress lines."""
    wl = make_resmlp()
    model: torch.nn.Module = wl.model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if precision is not None:
        fabric = _fabric(precision)
        model = fabric.setup(model)
        optimizer = fabric.setup_optimizers(optimizer)
    lines: list[str] = []
    run = Adaptive(model, optimizer, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=policy, progress=lines.append)
    with run:
        losses = [run.step().loss for _ in range(steps)]
    return losses, lines


def test_a_fabric_32_true_run_trains_as_the_plain_model_does() -> None:
    plain, plain_lines = _losses(None)
    wrapped, lines = _losses("32-true")
    assert wrapped == plain
    assert lines[0] == (
        "a Fabric module on one device: autotune trains the model inside it; Fabric's precision '32-true'"
    )
    assert [_seconds_out(x) for x in lines[1:]] == [_seconds_out(x) for x in plain_lines]


def test_bf16_mixed_no_longer_refuses_autotunes_backward() -> None:
    # Before: Fabric's backward hook raised "The current strategy and precision selection requires
    # you to call `fabric.backward(loss)` instead of `loss.backward()`" from the memory model's first
    # fake step, and the run could not start.
    bf16 = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None, precision="bf16", outer_precision="bf16")
    losses, lines = _losses("bf16-mixed", policy=bf16)
    plain, _ = _losses(None, policy=bf16)
    assert losses == plain  # autotune's autocast, not Fabric's: the same step as without Fabric
    assert lines[0] == (
        "a Fabric module on one device: autotune trains the model inside it; "
        "Fabric's 'bf16-mixed' autocast gives way to autotune's precision knobs"
    )


def test_bf16_true_weights_train_as_they_are_held() -> None:
    wl = make_resmlp()
    fabric = _fabric("bf16-true")
    model = fabric.setup(wl.model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    inner, inner_optimizer, line = fabric_inner(model, optimizer)
    assert inner is wl.model and type(inner_optimizer) is torch.optim.AdamW
    assert {p.dtype for p in inner.parameters()} == {torch.bfloat16}
    assert line == (
        "a Fabric module on one device: autotune trains the model inside it; "
        "its weights are bf16 (Fabric's 'bf16-true'): they train as they are held"
    )
    data = [(x.bfloat16(), y) for x, y in wl.dataset]  # type: ignore[attr-defined]
    run = Adaptive(model, optimizer, wl.loss_fn, data, batch_size=BATCH, policy=FIXED, progress=False)  # type: ignore[arg-type]
    with run:
        before = next(inner.parameters()).detach().clone()
        run.step()
    assert run.workload.held_in_16_bits is not None
    assert not torch.equal(next(inner.parameters()), before)  # trained, in bf16
    assert next(inner.parameters()).dtype == torch.bfloat16


def test_the_optimizer_inside_fabrics_wrapper_is_the_one_stepped() -> None:
    wl = make_resmlp()
    fabric = _fabric("32-true")
    model = fabric.setup(wl.model)
    user = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapped = fabric.setup_optimizers(user)
    assert is_fabric_module(model) and not is_fabric_module(wl.model)
    assert fabric_inner(model, wrapped)[:2] == (wl.model, user)
    assert fabric_inner(wl.model, user) == (wl.model, user, None)  # nothing wrapped: nothing said
    run = Adaptive(model, wrapped, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=FIXED, progress=False)
    with run:
        run.step()
    assert user.state_dict()["state"][0]["step"] == 1  # the user's AdamW took the step


def test_a_precision_autotune_cannot_take_over_is_refused_in_one_line() -> None:
    wl = make_resmlp()
    model = _fabric("64-true").setup(wl.model)
    with pytest.raises(UnsupportedError) as e:
        fabric_inner(model, torch.optim.AdamW(model.parameters()))
    assert str(e.value) == (
        "Adaptive cannot take over Fabric's precision '64-true' (DoublePrecision): it runs Fabric(precision=...) "
        "in '32-true', 'bf16-mixed', '16-mixed', 'bf16-true', '16-true'."
    )


@pytest.fixture
def ddp_fabric(monkeypatch: pytest.MonkeyPatch) -> Iterator[L.Fabric]:
    """Fabric's DDP strategy in this process, one rank (its process group taken down after)."""
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fabric = L.Fabric(accelerator="cpu", devices=1, strategy="ddp")
        fabric.launch()
    yield fabric
    torch.distributed.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_model_wrapped_for_ranks_is_refused_in_one_line(ddp_fabric: L.Fabric) -> None:
    wl = make_resmlp()
    model = ddp_fabric.setup(wl.model)
    with pytest.raises(UnsupportedError) as e:
        Adaptive(model, torch.optim.AdamW(wl.model.parameters()), wl.loss_fn, wl.dataset, batch_size=BATCH)
    assert str(e.value) == (
        "Adaptive trains one process's model on one device, but this model is set up by Fabric's "
        "DDPStrategy, which wraps it in DistributedDataParallel for its ranks: use Fabric(devices=1) "
        "(one device), or Adaptive.on_ranks for DeepSpeed ranks."
    )
