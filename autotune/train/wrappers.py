"""Turn a config's per-block knobs into wrappers on a live model, reversibly.

Each block's ``forward`` is shadowed by an instance attribute that runs the original forward
under ``torch.autocast`` (per-block precision) and/or inside ``torch.utils.checkpoint``
(per-block recompute). Removing the wrappers deletes the instance attributes, so the model is
exactly as it was: same parameters, same hooks. The Gymnasium environment relies on this to
reconfigure a model mid-training without touching its weights or optimizer state.

A module that sits at two block positions (shared weights, ALBERT-style: ``layers[3] is
layers[0]``) is wrapped once, with the knobs :func:`effective_block_knobs` gives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import checkpoint

from autotune.config import Precision
from autotune.train.recompute import RecomputeKeepsState, has_running_state

__all__ = ["BlockWrappers", "apply_block_knobs", "effective_block_knobs", "AUTOCAST_DTYPES"]

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

_SENTINEL = object()


@dataclass
class BlockWrappers:
    """Handle to the wrappers installed by :func:`apply_block_knobs`; ``remove()`` undoes them."""

    _blocks: list[tuple[torch.nn.Module, Any]]

    @property
    def modules(self) -> tuple[torch.nn.Module, ...]:
        """The wrapped modules, each once, in the order they were wrapped (forward order)."""
        return tuple(block for block, _ in self._blocks)

    def remove(self) -> None:
        # Last installed, first removed: the one order that unwinds any stack of wrappers.
        for block, previous in reversed(self._blocks):
            if previous is _SENTINEL:
                del block.forward
            else:
                block.forward = previous
        self._blocks.clear()


def effective_block_knobs(
    block_modules: Sequence[torch.nn.Module], precisions: Sequence[Precision], checkpoints: Sequence[bool]
) -> tuple[tuple[Precision, ...], tuple[bool, ...]]:
    """The knobs each block position really runs with, once positions holding the same module
    object (shared weights) are merged: such a module has one forward, so one wrapper.

    Its precision is the first non-fp32 precision among its positions (fp32 if none), and it is
    checkpointed if any of its positions is. Returns per-position precisions and checkpoints:
    :func:`apply_block_knobs` installs these, and the memory model must count these.
    """
    assert len(block_modules) == len(precisions) == len(checkpoints)
    precision: dict[int, Precision] = {}
    checkpointed: dict[int, bool] = {}
    for module, p, c in zip(block_modules, precisions, checkpoints, strict=True):
        key = id(module)
        if precision.get(key, "fp32") == "fp32":
            precision[key] = p
        checkpointed[key] = checkpointed.get(key, False) or c
    return (
        tuple(precision[id(m)] for m in block_modules),
        tuple(checkpointed[id(m)] for m in block_modules),
    )


def apply_block_knobs(
    model: torch.nn.Module,
    block_names: Sequence[str],
    precisions: Sequence[Precision],
    checkpoints: Sequence[bool],
    *,
    device_type: str,
) -> BlockWrappers:
    """Wrap each named block of ``model`` with its precision and checkpointing.

    Blocks that name the same module object are wrapped once, with their
    :func:`effective_block_knobs`.
    """
    assert len(block_names) == len(precisions) == len(checkpoints)
    blocks = [model.get_submodule(name) for name in block_names]
    precisions, checkpoints = effective_block_knobs(blocks, precisions, checkpoints)
    installed: list[tuple[torch.nn.Module, Any]] = []
    wrapped: set[int] = set()
    for block, precision, ckpt in zip(blocks, precisions, checkpoints, strict=True):
        if (precision == "fp32" and not ckpt) or id(block) in wrapped:
            continue
        wrapped.add(id(block))
        previous = block.__dict__.get("forward", _SENTINEL)
        dtype = AUTOCAST_DTYPES.get(precision)
        block.forward = _wrapped_forward(block, dtype, ckpt, device_type)
        installed.append((block, previous))
    return BlockWrappers(installed)


def _wrapped_forward(
    block: torch.nn.Module, dtype: torch.dtype | None, ckpt: bool, device_type: str
) -> Callable[..., Any]:
    inner = block.forward

    def run(*args: Any, **kwargs: Any) -> Any:
        if dtype is None:
            return inner(*args, **kwargs)
        with torch.autocast(device_type, dtype=dtype):
            out = inner(*args, **kwargs)
        # A block is a precision island: its outputs go back to fp32 so the next block (maybe
        # fp32, outside autocast) and the fp32 head accept them. Activations saved *inside* the
        # block stay in low precision, which is where the memory saving comes from.
        return tree_map_only(torch.Tensor, _to_fp32, out)

    def forward(*args: Any, **kwargs: Any) -> Any:
        if ckpt and torch.is_grad_enabled():
            # Non-reentrant checkpointing (the recommended mode): works with kwargs, autocast
            # inside the region is replayed on recompute, RNG state is restored. Its recompute
            # would update running state (BatchNorm's) a second time: RecomputeKeepsState, one
            # per invocation, prevents it (see autotune/train/recompute.py).
            fn = RecomputeKeepsState(block, run) if has_running_state(block) else run
            return checkpoint(fn, *args, use_reentrant=False, **kwargs)
        return run(*args, **kwargs)

    return forward


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.float()
    return t
