"""A model and optimizer set up by Lightning Fabric (``fabric.setup``), handed to :class:`~autotune.Adaptive`.

Fabric's loop is the user's own (litgpt's pretraining and fine-tuning scripts are one), so
``Adaptive`` takes the step over in it as in a plain loop. ``fabric.setup`` wraps the model in a
``_FabricModule`` whose forward runs Fabric's precision plugin (its autocast, its input casts)
and whose outputs refuse a backward that is not ``fabric.backward(loss)`` under any precision but
``"32-true"``; its ``_FabricOptimizer`` steps through the plugin (``16-mixed``: its own loss
scaler). ``Adaptive`` owns the forward's precision, the backward and the optimizer step, so on one
device it trains the objects inside the wrappers: the same parameters and optimizer state, which
the wrappers keep seeing. Fabric's precision is where autotune's precision knobs take over:

* ``"32-true"``, ``"bf16-mixed"``, ``"16-mixed"``: the weights are fp32 and every precision knob is
  autotune's (its fp16 keeps its own loss scaler).
* ``"bf16-true"``, ``"16-true"`` (litgpt's fine-tuning default): ``fabric.setup`` made the weights
  16-bit, so the model trains in that dtype as any model held in 16 bits
  (:attr:`autotune.Workload.held_in_16_bits`): recompute and the split are searched.

A strategy over several devices or processes (DDP, FSDP, DeepSpeed) wraps the model for its
ranks, and any other precision plugin (``"64-true"``, Transformer Engine, bitsandbytes) changes
the model in ways no ``TrainConfig`` says: both are refused in one line.

Nothing here imports Lightning: a Fabric wrapper is recognised by its class and module names.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.errors import UnsupportedError
from autotune.optimizers import unwrapped

__all__ = ["FABRIC_PRECISIONS", "is_fabric_module", "fabric_inner"]

#: Fabric's precisions whose model Adaptive trains as it is (the module docstring says why).
FABRIC_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


# Where Fabric's wrappers are defined: the ``lightning`` package and the standalone ``lightning_fabric``.
_FABRIC_MODULES = ("lightning.fabric.wrappers", "lightning_fabric.wrappers")


def _is_fabric(obj: object, name: str) -> bool:
    # The MRO: _FabricOptimizer's instances are of a class made at setup ("FabricAdamW").
    return any(c.__name__ == name and c.__module__ in _FABRIC_MODULES for c in type(obj).__mro__)


def is_fabric_module(model: object) -> bool:
    """Whether ``model`` is what ``fabric.setup`` returned (a ``_FabricModule``)."""
    return _is_fabric(model, "_FabricModule")


def fabric_inner(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[torch.nn.Module, torch.optim.Optimizer, str | None]:
    """The model and optimizer inside Fabric's wrappers, and the line that says so.

    Args:
        model: The user's model; a ``_FabricModule`` is unwrapped, any other model returned as it is.
        optimizer: The user's optimizer; a ``_FabricOptimizer`` is unwrapped.

    Returns:
        The module Fabric's wrapper runs (a compiled one stays compiled), the optimizer it steps,
        and one line for the run's progress (None where nothing was wrapped).

    Raises:
        UnsupportedError: the model is set up for several devices or processes, or with a
            precision outside :data:`FABRIC_PRECISIONS`.
    """
    inner_optimizer = unwrapped(optimizer) if _is_fabric(optimizer, "_FabricOptimizer") else optimizer
    if not is_fabric_module(model):
        return model, inner_optimizer, None
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
    return forward, inner_optimizer, f"a Fabric module on one device: autotune trains the model inside it; {how}"
