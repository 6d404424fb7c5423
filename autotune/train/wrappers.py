"""Turn a config's per-block knobs into wrappers on a live model, reversibly.

Each block's ``forward`` is shadowed by an instance attribute that runs the original forward
under ``torch.autocast`` (per-block precision) and/or inside ``torch.utils.checkpoint``
(per-block recompute). Removing the wrappers deletes the instance attributes, so the model is
exactly as it was: same parameters, same hooks. The Gymnasium environment relies on this to
reconfigure a model mid-training without touching its weights or optimizer state.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import checkpoint

from autotune.config import Precision

__all__ = ["BlockWrappers", "apply_block_knobs", "AUTOCAST_DTYPES"]

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

_SENTINEL = object()


@dataclass
class BlockWrappers:
    """Handle to the wrappers installed by :func:`apply_block_knobs`; ``remove()`` undoes them."""

    _blocks: list[tuple[torch.nn.Module, Any]]

    def remove(self) -> None:
        for block, previous in self._blocks:
            if previous is _SENTINEL:
                del block.forward
            else:
                block.forward = previous
        self._blocks.clear()


def apply_block_knobs(
    model: torch.nn.Module,
    block_names: Sequence[str],
    precisions: Sequence[Precision],
    checkpoints: Sequence[bool],
    *,
    device_type: str,
) -> BlockWrappers:
    """Wrap each named block of ``model`` with its precision and checkpointing."""
    assert len(block_names) == len(precisions) == len(checkpoints)
    installed: list[tuple[torch.nn.Module, Any]] = []
    for name, precision, ckpt in zip(block_names, precisions, checkpoints, strict=True):
        if precision == "fp32" and not ckpt:
            continue
        block = model.get_submodule(name)
        previous = block.__dict__.get("forward", _SENTINEL)
        dtype = AUTOCAST_DTYPES.get(precision)
        block.forward = _wrapped_forward(block.forward, dtype, ckpt, device_type)
        installed.append((block, previous))
    return BlockWrappers(installed)


def _wrapped_forward(
    inner: Callable[..., Any], dtype: torch.dtype | None, ckpt: bool, device_type: str
) -> Callable[..., Any]:
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
            # inside the region is replayed on recompute, RNG state is restored.
            return checkpoint(run, *args, use_reentrant=False, **kwargs)
        return run(*args, **kwargs)

    return forward


def _to_fp32(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.float()
    return t
