"""Adaptive over what a framework prepared (autotune.adapt.prepared): a Lightning Fabric loop
(litgpt's scripts) and an Accelerate loop (transformers' ``run_*_no_trainer.py``) are trained
inside their wrappers; a model wrapped for several ranks is refused."""

from __future__ import annotations

import functools
import os
import re
import socket
import warnings
from collections.abc import Iterator
from typing import Any

import lightning as L
import pytest
import torch

from autotune import TrainConfig, Workload
from autotune.adapt import Adaptive
from autotune.adapt.prepared import framework_inner, is_fabric_module
from autotune.errors import ConfigError, UnsupportedError
from tests.conftest import make_resmlp

BATCH = 32
FIXED = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None)


def _fabric(precision: str) -> L.Fabric:
    with warnings.catch_warnings():  # "bf16-mixed on the CPU": what a Fabric user on a laptop sees
        warnings.simplefilter("ignore")
        return L.Fabric(accelerator="cpu", devices=1, precision=precision)  # type: ignore[arg-type]


def _seconds_out(line: str) -> str:
    return re.sub(r"\d+\.\d s\)$", "s)", line)


@functools.cache  # the plain run (precision None) is the reference of several tests
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
    prepared = framework_inner(model, optimizer)
    inner, inner_optimizer, line = prepared.model, prepared.optimizer, prepared.line
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
    prepared = framework_inner(model, wrapped)
    assert (prepared.model, prepared.optimizer) == (wl.model, user)
    plain = framework_inner(wl.model, user)
    assert (plain.model, plain.optimizer, plain.line) == (wl.model, user, None)  # nothing wrapped: nothing said
    run = Adaptive(model, wrapped, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=FIXED, progress=False)
    with run:
        run.step()
    assert user.state_dict()["state"][0]["step"] == 1  # the user's AdamW took the step


def test_a_precision_autotune_cannot_take_over_is_refused_in_one_line() -> None:
    wl = make_resmlp()
    model = _fabric("64-true").setup(wl.model)
    with pytest.raises(UnsupportedError) as e:
        framework_inner(model, torch.optim.AdamW(model.parameters()))
    assert str(e.value) == (
        "Adaptive cannot take over Fabric's precision '64-true' (DoublePrecision): it runs Fabric(precision=...) "
        "in '32-true', 'bf16-mixed', '16-mixed', 'bf16-true', '16-true'."
    )


@pytest.fixture
def ddp_fabric(monkeypatch: pytest.MonkeyPatch) -> Iterator[L.Fabric]:
    """Fabric's DDP strategy in this process, one rank (its process group taken down after, and the
    environment it set: Accelerate reads WORLD_SIZE and LOCAL_RANK as a launcher's)."""
    environ = dict(os.environ)
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fabric = L.Fabric(accelerator="cpu", devices=1, strategy="ddp")
        fabric.launch()
    yield fabric
    torch.distributed.destroy_process_group()
    os.environ.clear()
    os.environ.update(environ)


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


@pytest.fixture
def accelerate_state() -> Iterator[None]:
    """Accelerate's process-wide state, fresh for the test and taken down after (another test's
    ``Accelerator`` may ask for another precision)."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _accelerated(
    mixed_precision: str, optimizer_class: type[torch.optim.Optimizer] = torch.optim.AdamW
) -> tuple[Workload, Any, Any, torch.optim.Optimizer]:
    """The seeded resmlp workload with its model and an optimizer as ``accelerator.prepare`` gives them."""
    from accelerate import Accelerator

    wl = make_resmlp()
    accelerator = Accelerator(mixed_precision=mixed_precision, cpu=True)
    optimizer = optimizer_class(wl.model.parameters(), lr=1e-3)
    model, wrapped = accelerator.prepare(wl.model, optimizer)
    return wl, model, wrapped, optimizer


@pytest.mark.usefixtures("accelerate_state")
def test_an_accelerate_bf16_model_trains_in_the_configurations_precision() -> None:
    wl, model, wrapped, user = _accelerated("bf16")
    patched = vars(model)["forward"]
    lines: list[str] = []
    run = Adaptive(model, wrapped, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=FIXED, progress=lines.append)
    with run:
        losses = [run.step().loss for _ in range(3)]
        seen: list[torch.dtype] = []
        hook = model.blocks[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        model(wl.dataset[:2][0])  # the user's own call between steps: Accelerate's autocast
        hook.remove()
    # Before: every "fp32" step ran under Accelerate's bf16 autocast; these are the plain run's.
    assert losses == _losses(None)[0]
    assert seen == [torch.bfloat16]
    assert vars(model)["forward"] is patched  # Accelerate's forward, as it was given
    assert user.state_dict()["state"][0]["step"] == 3
    assert lines[0] == (
        "a model Accelerate prepared: autotune steps the optimizer inside AcceleratedOptimizer; its 'bf16' "
        "autocast gives way to autotune's precision knobs in the steps autotune runs (your own calls of the "
        "model keep it)"
    )


@pytest.mark.usefixtures("accelerate_state")
def test_accelerates_fp16_loss_scaler_never_unscales_autotunes_gradients() -> None:
    # On a GPU, mixed_precision="fp16" gives the AcceleratedOptimizer a GradScaler that its step runs:
    # it would divide by 2**16 gradients autotune never multiplied (here, a CPU stand-in for it).
    wl, model, wrapped, _ = _accelerated("no")
    wrapped.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    run = Adaptive(model, wrapped, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=FIXED, progress=False)
    with run:
        losses = [run.step().loss for _ in range(3)]
    assert losses == _losses(None)[0]  # the plain run's: AdamW's update saw the gradients unscaled
    assert wrapped.scaler._get_growth_tracker() == 0  # Accelerate's scaler never stepped (update() counts)


@pytest.mark.usefixtures("accelerate_state")
def test_accelerates_fp8_layers_are_refused_in_one_line() -> None:
    wl, model, wrapped, _ = _accelerated("bf16")
    model._converted_to_transformer_engine = True  # what mixed_precision="fp8" leaves on the model
    with pytest.raises(UnsupportedError) as e:
        Adaptive(model, wrapped, wl.loss_fn, wl.dataset, batch_size=BATCH)
    assert str(e.value) == (
        "Adaptive cannot take over Accelerate's mixed_precision 'fp8': its fp8 layers (Transformer Engine, "
        "MS-AMP) change the model in ways no configuration says. Prepare the model with mixed_precision "
        "'no', 'bf16' or 'fp16'."
    )


def test_a_distributed_data_parallel_model_is_refused_in_one_line(ddp_fabric: L.Fabric) -> None:
    # torchrun / accelerate launch scripts hand their model over wrapped: before, a fake-tensor error.
    wl = make_resmlp()
    model = torch.nn.parallel.DistributedDataParallel(wl.model)
    with pytest.raises(UnsupportedError) as e:
        Adaptive(model, torch.optim.AdamW(model.parameters()), wl.loss_fn, wl.dataset, batch_size=BATCH)
    assert str(e.value) == (
        "Adaptive trains one process's model on one device, but this model is a DistributedDataParallel, which "
        "trains it on several ranks: each rank would decide on its own. Give Adaptive the model itself in one "
        "process, or use Adaptive.on_ranks for DeepSpeed ranks."
    )


@pytest.mark.usefixtures("accelerate_state")
def test_accelerates_own_accumulation_is_refused_in_one_line() -> None:
    from accelerate import Accelerator

    wl = make_resmlp()
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=4)
    model, optimizer = accelerator.prepare(wl.model, torch.optim.AdamW(wl.model.parameters()))
    with pytest.raises(ConfigError) as e:
        Adaptive(model, optimizer, wl.loss_fn, wl.dataset, batch_size=BATCH)
    assert str(e.value) == (
        "Accelerate's gradient_accumulation_steps=4 makes 4 batches one optimizer step, but each Adaptive.step(batch) "
        "is one optimizer step over the batch it is given (autotune splits it into micro-batches itself): create "
        "the Accelerator with gradient_accumulation_steps=1 and give Adaptive the whole effective batch (batch_size)."
    )
