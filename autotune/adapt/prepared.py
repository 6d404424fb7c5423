"""A model and optimizer a framework prepared for the user's loop, handed to :class:`~autotune.Adaptive`.

Two frameworks set up what a plain loop then trains: Lightning Fabric (``fabric.setup``; litgpt's
pretraining and fine-tuning scripts) and Hugging Face Accelerate (``accelerator.prepare``;
transformers' ``run_*_no_trainer.py`` examples). Their loop is the user's own, so ``Adaptive``
takes the step over in it as in any plain loop. Both put their mixed precision and their loss
scaling where ``Adaptive`` cannot leave them: ``Adaptive`` owns the forward's precision, the
backward and the optimizer step, so each framework's precision is where autotune's knobs take
over, and the parameters and optimizer state trained are the user's own, which the framework's
objects keep seeing (``fabric.save``, ``accelerator.save_state``, the user's evaluation).

* Fabric wraps the model in a ``_FabricModule`` (its forward runs the precision plugin: its
  autocast, its input casts; its outputs refuse a backward that is not ``fabric.backward(loss)``
  under any precision but ``"32-true"``) and the optimizer in a ``_FabricOptimizer`` (``16-mixed``:
  its own loss scaler). ``Adaptive`` trains the objects inside the wrappers:

  - ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``: the weights are fp32 and every precision knob
    is autotune's (its fp16 keeps its own loss scaler);
  - ``"bf16-true"``, ``"16-true"`` (litgpt's fine-tuning default): ``fabric.setup`` made the weights
    16-bit, so the model trains in that dtype as any model held in 16 bits
    (:attr:`autotune.Workload.held_in_16_bits`): recompute and the split are searched.

  Any other precision plugin (``"64-true"``, Transformer Engine, bitsandbytes) changes the model
  in ways no ``TrainConfig`` says: refused in one line.
* Accelerate keeps the model object and replaces its ``forward`` with one under its autocast
  (``mixed_precision="bf16"`` / ``"fp16"``; the original is kept as ``_original_forward``), and
  wraps the optimizer in an ``AcceleratedOptimizer`` whose step runs its own ``GradScaler`` under
  fp16. Left alone, every configuration autotune ran would compute in Accelerate's precision
  while reporting its own (an "fp32" trial in bf16), and under fp16 Accelerate's scaler would
  unscale gradients autotune never scaled. So while autotune uses the model (its setup and each
  :meth:`~autotune.Adaptive.step`) the model's own forward is back; the user's calls between
  steps (evaluation, generation) keep Accelerate's autocast; the optimizer inside the wrapper is
  the one stepped. Accelerate's fp8 (Transformer Engine or MS-AMP layers) is refused in one line.

A model wrapped for several ranks (``DistributedDataParallel``, FSDP, a DeepSpeed engine: what
``torchrun`` / ``accelerate launch`` scripts and Fabric's multi-device strategies give) is refused
in one line: each process would decide on its own, and nothing keeps the ranks on one
configuration.

Nothing here imports Lightning or Accelerate: their objects are recognised by class and module
names and by the attributes they set.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from autotune.errors import ConfigError, UnsupportedError
from autotune.optimizers import unwrapped

__all__ = ["FABRIC_PRECISIONS", "Prepared", "framework_inner", "is_fabric_module"]

#: Fabric's precisions whose model Adaptive trains as it is (the module docstring says why).
FABRIC_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")

# Where Fabric's wrappers are defined: the ``lightning`` package and the standalone ``lightning_fabric``.
_FABRIC_MODULES = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")

# Wrappers that run a model on several ranks, by class name (FSDPModule: the class fully_shard makes).
_RANK_WRAPPERS = ("DistributedDataParallel", "FullyShardedDataParallel", "FSDPModule", "DeepSpeedEngine")


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """What ``Adaptive`` trains of a model and optimizer a framework prepared.

    Attributes:
        model: The module whose forward autotune runs (Fabric's inner module; Accelerate's model
            itself), with the user's parameters.
        optimizer: The optimizer autotune steps (the one inside the framework's wrapper).
        line: One line for the run's progress saying what was found (None: nothing prepared).
        in_use: A context entered around every use autotune makes of ``model`` (its setup, each
            step): Accelerate's model gets its own forward back in it; else nothing.
    """

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    line: str | None = None
    in_use: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext


def _is_named(obj: object, name: str, modules: tuple[str, ...]) -> bool:
    # The MRO: _FabricOptimizer's instances are of a class made at setup ("FabricAdamW").
    return any(c.__name__ == name and c.__module__ in modules for c in type(obj).__mro__)


def is_fabric_module(model: object) -> bool:
    """Whether ``model`` is what ``fabric.setup`` returned (a ``_FabricModule``)."""
    return _is_named(model, "_FabricModule", _FABRIC_MODULES)


def framework_inner(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared:
    """What ``Adaptive`` trains of ``model`` and ``optimizer``: the objects inside Fabric's or
    Accelerate's wrappers (the module docstring says what each case does), or the two as they are.

    Raises:
        UnsupportedError: the model is wrapped for several ranks, or set up with a precision
            autotune cannot take over (Fabric's outside :data:`FABRIC_PRECISIONS`, Accelerate's fp8).
        ConfigError: Accelerate's ``gradient_accumulation_steps`` is not 1 (autotune's split is
            the accumulation).
    """
    if is_fabric_module(model):
        return _fabric(model, optimizer)
    _refuse_ranks(model)
    return _accelerate(model, optimizer)


def _refuse_ranks(model: torch.nn.Module) -> None:
    wrapper = next((c.__name__ for c in type(model).__mro__ if c.__name__ in _RANK_WRAPPERS), None)
    if wrapper is not None:
        raise UnsupportedError(
            f"Adaptive trains one process's model on one device, but this model is a {wrapper}, which trains "
            "it on several ranks: each rank would decide on its own. Give Adaptive the model itself in one "
            "process, or use Adaptive.on_ranks for DeepSpeed ranks."
        )


def _fabric(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared:
    inner_optimizer = unwrapped(optimizer) if _is_named(optimizer, "_FabricOptimizer", _FABRIC_MODULES) else optimizer
    wrapper: Any = model
    strategy, forward, original = wrapper._strategy, wrapper._forward_module, wrapper._original_module
    if forward is not original and getattr(forward, "_orig_mod", None) is not original:
        # fabric.setup gave the strategy's wrapper (DistributedDataParallel, FSDP, a DeepSpeed engine).
        raise UnsupportedError(
            f"Adaptive trains one process's model on one device, but this model is set up by Fabric's "
            f"{type(strategy).__name__}, which wraps it in {type(forward).__name__} for its ranks: use "
            "Fabric(devices=1) (one device), or Adaptive.on_ranks for DeepSpeed ranks."
        )
    precision = str(getattr(strategy.precision, "precision", "?"))
    if precision not in FABRIC_PRECISIONS:
        raise UnsupportedError(
            f"Adaptive cannot take over Fabric's precision {precision!r} ({type(strategy.precision).__name__}): "
            f"it runs Fabric(precision=...) in {', '.join(map(repr, FABRIC_PRECISIONS))}."
        )
    if precision == "32-true":
        how = "Fabric's precision '32-true'"
    elif precision.endswith("-true"):
        how = f"its weights are {precision.split('-')[0]} (Fabric's {precision!r}): they train as they are held"
    else:
        how = f"Fabric's {precision!r} autocast gives way to autotune's precision knobs"
    line = f"a Fabric module on one device: autotune trains the model inside it; {how}"
    return Prepared(model=forward, optimizer=inner_optimizer, line=line)


def _accelerate(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Prepared:
    wrapped_optimizer = _is_named(optimizer, "AcceleratedOptimizer", ("accelerate.optimizer",))
    inner_optimizer = unwrapped(optimizer) if wrapped_optimizer else optimizer
    # accelerate's dynamo_backend compiles the model after patching it: the patch is on _orig_mod.
    target: torch.nn.Module = getattr(model, "_orig_mod", model)
    patched = "_original_forward" in vars(target) and "forward" in vars(target)
    if not (patched or wrapped_optimizer):
        return Prepared(model=model, optimizer=optimizer)
    steps = getattr(getattr(optimizer, "gradient_state", None), "num_steps", 1)
    if steps != 1:
        raise ConfigError(
            f"Accelerate's gradient_accumulation_steps={steps} makes {steps} batches one optimizer step, but each "
            "Adaptive.step(batch) is one optimizer step over the batch it is given (autotune splits it into "
            "micro-batches itself): create the Accelerator with gradient_accumulation_steps=1 and give Adaptive "
            "the whole effective batch (batch_size)."
        )
    precision = _accelerate_precision()
    if precision == "fp8" or getattr(target, "_converted_to_transformer_engine", False):
        raise UnsupportedError(
            "Adaptive cannot take over Accelerate's mixed_precision 'fp8': its fp8 layers (Transformer Engine, "
            "MS-AMP) change the model in ways no configuration says. Prepare the model with mixed_precision "
            "'no', 'bf16' or 'fp16'."
        )
    if patched:
        how = (
            f"its {precision!r} autocast gives way to autotune's precision knobs in the steps autotune runs "
            "(your own calls of the model keep it)"
        )
    else:
        how = f"mixed_precision {precision!r}"
    line = f"a model Accelerate prepared: autotune steps the optimizer inside AcceleratedOptimizer; {how}"
    in_use = (lambda: _own_forward(target)) if patched else contextlib.nullcontext
    return Prepared(model=model, optimizer=inner_optimizer, line=line, in_use=in_use)


def _accelerate_precision() -> str:
    """Accelerate's ``mixed_precision`` ("no", "bf16", "fp16", "fp8"), from its process-wide state
    (set by the ``Accelerator`` that prepared the model), or "?" where it is not set."""
    state = sys.modules.get("accelerate.state")
    shared = getattr(getattr(state, "AcceleratorState", None), "_shared_state", None)
    if not shared:  # AcceleratorState() itself would initialise a fresh state
        return "?"
    return str(state.AcceleratorState().mixed_precision)  # type: ignore[union-attr]


@contextlib.contextmanager
def _own_forward(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s forward as it was before ``accelerator.prepare`` replaced it, for the block.
    A copy made inside (the memory model's) has that forward too: ``copy.deepcopy`` binds an
    instance's method to the copy."""
    own = vars(module)
    patched = own["forward"]
    own["forward"] = own["_original_forward"]
    try:
        yield
    finally:
        own["forward"] = patched
