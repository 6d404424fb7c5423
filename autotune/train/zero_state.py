"""A DeepSpeed engine's training state, whole: taken from one engine, put into another.

A ZeRO stage change cannot happen inside an engine (the stage decides how parameters, gradients
and optimizer state are laid out), so :class:`~autotune.train.zero.ZeroTrainer` builds a new
engine and carries the state over through :class:`TrainingState`: every parameter's fp32 value
(the master copy where there is one), the optimizer's element-wise state (Adam's ``exp_avg`` and
``exp_avg_sq``) and its scalar state (Adam's ``step``), all unpartitioned, plus the module's buffers.

Where the values live, per engine:

==================  =========================================================================
engine              fp32 parameter and optimizer state
==================  =========================================================================
ZeRO 1-2            partitioned flat fp32 groups: DeepSpeed's tensor-fragment API
                    (``deepspeed.utils.safe_get_full_fp32_param`` / ``safe_get_full_optimizer_state``
                    and their ``safe_set_`` twins) gathers and scatters them per parameter
ZeRO 3              the same API (``param._z3_optimizer``); the module's parameters are partitions
ZeRO 0, fp32        the module's parameters and the torch optimizer's ``state[param]``
ZeRO 0, bf16/fp16   ``FP16_UnfusedOptimizer``: an fp32 master per parameter (``fp32_groups``),
                    the torch optimizer's state keyed by the masters; the fragment API does not
                    cover it (no ``_hp_mapping``)
==================  =========================================================================

The fragment API reads existing optimizer state only, and both ZeRO 1-2 and ZeRO 3 create theirs
lazily at the first step. :func:`restore_state` therefore creates the state entries first (zeros,
the shape of each flat partition, as the torch optimizer would), links DeepSpeed's fragments to
them, and only then sets each parameter's values.

Every function here is a collective at ZeRO 1-3 (an all-reduce or all-gather per parameter): all
ranks call it, with the same engine kind, in the same order.

Cost: while the engines are switched every rank holds the whole state (12 bytes per parameter with
Adam: the fp32 value and two moments) next to the old engine. That is what ZeRO exists to avoid:
a model whose full state does not fit on one rank would need a sharded hand-over (the fragment
API's ``safe_get_local_*`` functions, partition by partition) or DeepSpeed's universal checkpoint
on disk.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autotune.errors import UnsupportedError

__all__ = ["TrainingState", "gather_state", "load_into_module", "load_state", "restore_state", "save_state"]


@dataclass(frozen=True, kw_only=True)
class TrainingState:
    """Unpartitioned training state, the same on every rank (buffers: this rank's own)."""

    parameters: Mapping[str, torch.Tensor]  # fp32, full shape, by parameter name
    optimizer_state: Mapping[str, Mapping[str, torch.Tensor]]  # element-wise state, full shape
    optimizer_scalars: Mapping[str, torch.Tensor]  # e.g. Adam's step: one value for all parameters
    buffers: Mapping[str, torch.Tensor]


# ---- which engine holds the state where ---------------------------------------------------------


def _zero_optimizer(engine: Any) -> Any | None:
    """DeepSpeed's ZeRO optimizer (stages 1-3), or None at stage 0."""
    return engine.optimizer if engine.zero_optimization_stage() > 0 else None


def _masters(engine: Any) -> Iterator[tuple[str, torch.nn.Parameter, torch.Tensor]]:
    """Stage 0: (name, module parameter, fp32 tensor the torch optimizer updates and keys state by)."""
    named = list(engine.module.named_parameters())
    fp32_groups = getattr(engine.optimizer, "fp32_groups", None)
    if fp32_groups is None:  # fp32 engine: the torch optimizer updates the parameters themselves
        yield from ((name, p, p) for name, p in named)
        return
    master = {
        id(lp): hp
        for lps, hps in zip(engine.optimizer.fp16_groups, fp32_groups, strict=True)
        for lp, hp in zip(lps, hps, strict=True)
    }
    yield from ((name, p, master[id(p)]) for name, p in named if id(p) in master)


def _flat_partitions(zero: Any) -> list[torch.Tensor]:
    """Stages 1-3: the fp32 flat partitions the torch optimizer keys its state by."""
    for attr in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):  # stages 1-2, stage 3
        flats = getattr(zero, attr, None)
        if flats is not None:
            return list(flats)
    raise UnsupportedError(
        f"carrying training state over needs a DeepSpeed ZeRO optimizer with flat fp32 partitions, "
        f"but got {type(zero).__name__}."
    )


def _split_state(
    state: Mapping[str, Any], like: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(element-wise entries: the shape of ``like``; the others), DeepSpeed's own rule for fragments."""
    elementwise: dict[str, torch.Tensor] = {}
    scalars: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise UnsupportedError(
                f"carrying optimizer state over supports tensor state only, but state {key!r} is {value!r}."
            )
        (elementwise if value.shape == like.shape else scalars)[key] = value
    return elementwise, scalars


def _common_scalars(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The scalar state shared by every state entry (Adam's step: all parameters step together)."""
    if not states:
        return {}
    first = states[0]
    for s in states[1:]:
        if s.keys() != first.keys() or not all(torch.equal(s[k], first[k]) for k in first):
            raise UnsupportedError(
                "carrying optimizer state over needs the same scalar state (e.g. Adam's step) for every "
                f"parameter, but got {sorted((k, v.item()) for k, v in first.items())} and "
                f"{sorted((k, v.item()) for k, v in s.items())}."
            )
    return {k: v.clone() for k, v in first.items()}


# ---- gather -----------------------------------------------------------------------------------------


def gather_state(engine: Any, optimizer: torch.optim.Optimizer) -> TrainingState:
    """The engine's full training state (a collective at ZeRO 1-3). ``optimizer``: the torch one."""
    buffers = {name: b.detach().clone() for name, b in engine.module.named_buffers()}
    zero = _zero_optimizer(engine)
    if zero is None:
        params, elementwise, scalar_states = {}, {}, []
        for name, _, hp in _masters(engine):
            params[name] = hp.detach().float().clone()
            per_param, scalars = _split_state(optimizer.state.get(hp, {}), hp)
            if per_param:
                elementwise[name] = {k: v.detach().clone() for k, v in per_param.items()}
            if scalars:
                scalar_states.append(scalars)
        return TrainingState(
            parameters=params,
            optimizer_state=elementwise,
            optimizer_scalars=_common_scalars(scalar_states),
            buffers=buffers,
        )
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    flats = _flat_partitions(zero)
    splits = [_split_state(optimizer.state.get(flat, {}), flat) for flat in flats]
    keys = sorted({k for per_param, _ in splits for k in per_param})
    params, elementwise = {}, {}
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:  # not in the optimizer: the module holds it (at ZeRO 3, partitioned)
            params[name] = _frozen_parameter(p)
            continue
        params[name] = safe_get_full_fp32_param(p).detach().clone()  # sync point: a collective
        if keys:
            elementwise[name] = {k: safe_get_full_optimizer_state(p, k).detach().clone() for k in keys}
    return TrainingState(
        parameters=params,
        optimizer_state=elementwise,
        optimizer_scalars=_common_scalars([s for _, s in splits if s]),
        buffers=buffers,
    )


def _frozen_parameter(p: torch.nn.Parameter) -> torch.Tensor:
    if not hasattr(p, "ds_id"):
        return p.detach().float().clone()
    import deepspeed

    with deepspeed.zero.GatheredParameters([p]):  # ZeRO 3 partitions it: gather (a collective)
        return p.detach().float().clone()


# ---- restore ----------------------------------------------------------------------------------------


def load_into_module(module: torch.nn.Module, state: TrainingState) -> None:
    """Copy the parameters and buffers into a fresh module, before ``deepspeed.initialize``.

    The engine then starts from these values: it partitions them (ZeRO 3), casts them (bf16/fp16)
    and copies its fp32 masters from them. A master copied from a 16-bit cast is not the carried
    fp32 value, so :func:`restore_state` sets the masters again after initialization.
    """
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(state.parameters[name])
        for name, b in module.named_buffers():
            if name in state.buffers:
                b.copy_(state.buffers[name])


def restore_state(engine: Any, optimizer: torch.optim.Optimizer, state: TrainingState) -> None:
    """Set a new engine's fp32 parameters and optimizer state to ``state`` (a collective at ZeRO 1-3)."""
    zero = _zero_optimizer(engine)
    if zero is None:
        _restore_stage0(engine, optimizer, state)
        return
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    keys = sorted({k for per_param in state.optimizer_state.values() for k in per_param})
    if keys or state.optimizer_scalars:
        # The state entries the torch optimizer would create at its first step (so it will not).
        for flat in _flat_partitions(zero):
            optimizer.state[flat] = {k: torch.zeros_like(flat) for k in keys} | {
                k: v.clone() for k, v in state.optimizer_scalars.items()
            }
        if hasattr(zero, "_lazy_init_hp_params_optimizer_state"):
            # ZeRO 1-2 point each parameter's fragment at the optimizer state lazily, at the first
            # step; safe_set_full_optimizer_state needs the link now. (ZeRO 3 looks state up per call.)
            zero._hp_optimizer_states_linked = False
            zero._lazy_init_hp_params_optimizer_state()
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        safe_set_full_fp32_param(p, state.parameters[name])
        for k, value in state.optimizer_state.get(name, {}).items():
            safe_set_full_optimizer_state(p, value, k)


def _restore_stage0(engine: Any, optimizer: torch.optim.Optimizer, state: TrainingState) -> None:
    keys = sorted({k for per_param in state.optimizer_state.values() for k in per_param})
    with torch.no_grad():
        for name, p, hp in _masters(engine):
            if hp is not p:  # an fp32 master next to a 16-bit parameter: load_into_module set only p
                hp.copy_(state.parameters[name])
            if not p.requires_grad or not (keys or state.optimizer_scalars):
                continue
            # A parameter without state of its own (it never had a gradient at stage 0) gets zeros,
            # as it has in a ZeRO 1-3 flat partition.
            per_param = state.optimizer_state.get(name, {})
            optimizer.state[hp] = {
                k: per_param[k].to(hp.device, copy=True) if k in per_param else torch.zeros_like(hp) for k in keys
            } | {k: v.clone() for k, v in state.optimizer_scalars.items()}


# ---- files (safetensors: tensors only, no pickle) ---------------------------------------------------


def save_state(state: TrainingState, path: Path) -> None:
    """Write ``state`` as a safetensors file.

    Keys: ``param/NAME``, ``optim/NAME/KEY``, ``scalar/KEY``, ``buffer/NAME``.
    """
    from safetensors.torch import save_file

    tensors = {f"param/{n}": t for n, t in state.parameters.items()}
    tensors |= {f"optim/{n}/{k}": t for n, per in state.optimizer_state.items() for k, t in per.items()}
    tensors |= {f"scalar/{k}": t for k, t in state.optimizer_scalars.items()}
    tensors |= {f"buffer/{n}": t for n, t in state.buffers.items()}
    save_file({k: t.detach().cpu().contiguous() for k, t in tensors.items()}, str(path))


def load_state(path: Path) -> TrainingState:
    """Read a file written by :func:`save_state`."""
    from safetensors.torch import load_file

    params: dict[str, torch.Tensor] = {}
    optim: dict[str, dict[str, torch.Tensor]] = {}
    scalars: dict[str, torch.Tensor] = {}
    buffers: dict[str, torch.Tensor] = {}
    for key, t in load_file(str(path)).items():
        kind, _, rest = key.partition("/")
        if kind == "param":
            params[rest] = t
        elif kind == "optim":
            name, _, k = rest.rpartition("/")
            optim.setdefault(name, {})[k] = t
        elif kind == "scalar":
            scalars[rest] = t
        else:
            buffers[rest] = t
    return TrainingState(parameters=params, optimizer_state=optim, optimizer_scalars=scalars, buffers=buffers)
