"""A checkpointed block's recompute leaves its running state (BatchNorm statistics, a user's EMA
or counter: any buffer its forward updates) exactly as one plain forward would.

Non-reentrant ``torch.utils.checkpoint`` re-runs a block's forward in train mode during backward,
so every buffer that forward updates is updated twice per micro-batch: BatchNorm counts two
batches and moves its running means twice as far (pytorch/pytorch#96136, open: checkpoint offers
no switch for it; its docs only warn that a recompute that differs from the forward is not
equivalent). A selective recompute (:mod:`autotune.train.selective`) re-runs the norms too. The
ways out we read:

* fairscale's ``patch_batchnorm`` skips BatchNorm's update while grad is disabled. That fits
  reentrant checkpointing only (its forward runs under no_grad; ours records the graph), moves
  the update from the forward to the backward (so a forward without backward updates nothing,
  fairscale#1035), and covers BatchNorm only.
* Lowering BatchNorm's momentum so two updates equal one (pytorch-pfn-extras#117): approximate.
* Snapshot the block's buffers before the forward; around the recompute, restore them (so the
  recompute sees what the forward saw: an EMA that feeds the output gives the same activations,
  hence the same gradients) and then put back what they held just before it. Exact for any
  module, at the cost of a copy of the buffers per checkpointed block per micro-batch, held from
  forward to backward, plus a transient copy during the recompute.

We take the snapshot, in checkpoint's own hook around the forward and the recompute (its
``context_fn`` pair, which selective recompute's contexts nest inside), except where it is not
needed: a standard BatchNorm (its forward is
torch's own) in train mode normalizes with the batch's statistics, never its running ones, so its
recompute is the forward bit for bit whatever those hold: it needs no copy held from forward to
backward, only its running statistics put back after the recompute (a transient copy). A ResNet's
blocks thus hold no extra bytes between forward and backward (the memory model does not count
snapshots). A BatchNorm cannot simply skip its update on the recompute (``track_running_stats``
off, fairscale's way): it then saves fewer tensors for backward and checkpoint refuses the
recompute ("A different number of tensors was saved").
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from torch.nn.modules.batchnorm import SyncBatchNorm, _BatchNorm

__all__ = ["RecomputeKeepsState", "has_running_state"]

_BufferRef = tuple[torch.nn.Module, str]  # (owning module, buffer name): read afresh at each use


def has_running_state(block: torch.nn.Module) -> bool:
    """Whether ``block`` holds any buffer (only then does its checkpointing need the guard)."""
    return next(block.buffers(), None) is not None


class RecomputeKeepsState:
    """The running-state guard of one checkpoint invocation of ``block``: :meth:`contexts` wraps
    the invocation's (forward, recompute) context pair, checkpoint's ``context_fn``. The forward
    context takes the snapshot before the forward; the recompute context restores it around each
    recompute and then puts back what the buffers held just before.

    Create one per invocation: the snapshot belongs to that invocation's inputs. The guard's own
    copies run outside the inner contexts, so a selective recompute's cache (which replays the
    forward's operations in order) never sees them.
    """

    def __init__(self, block: torch.nn.Module) -> None:
        self._block = block
        self._kept: list[_BufferRef] = []  # restored to their values before the forward
        self._reset: list[_BufferRef] = []  # running statistics only: put back after the recompute
        self._before: list[torch.Tensor] = []

    def contexts(
        self, forward: AbstractContextManager[Any], recompute: AbstractContextManager[Any]
    ) -> tuple[AbstractContextManager[Any], AbstractContextManager[Any]]:
        """``(forward, recompute)``, each with the guard around it."""
        return self._forward(forward), self._recompute(recompute)

    @contextmanager
    def _forward(self, inner: AbstractContextManager[Any]) -> Iterator[None]:
        self._kept, self._reset = _split(self._block)
        self._before = _values(self._kept)
        with inner:
            yield

    @contextmanager
    def _recompute(self, inner: AbstractContextManager[Any]) -> Iterator[None]:
        # What the buffers hold *now*, not right after our forward: a module shared by two block
        # positions has run again since, and that later state must survive this recompute.
        touched = self._kept + self._reset
        now = _values(touched)
        _restore(self._kept, self._before)
        try:
            with inner:
                yield
        finally:  # also when checkpoint's early stop ends the recompute midway
            _restore(touched, now)


def _split(block: torch.nn.Module) -> tuple[list[_BufferRef], list[_BufferRef]]:
    """Every buffer of ``block`` once: (those to snapshot, the running statistics of standard
    BatchNorms in train mode). An eval-mode standard BatchNorm changes none of its buffers."""
    kept: list[_BufferRef] = []
    reset: list[_BufferRef] = []
    seen: set[int] = set()
    for module in block.modules():
        standard = _is_standard_norm(module)
        into = reset if standard and module.training else kept
        for name, buffer in module.named_buffers(recurse=False):
            if id(buffer) not in seen and not (standard and not module.training):
                seen.add(id(buffer))
                into.append((module, name))
    return kept, reset


def _is_standard_norm(module: torch.nn.Module) -> bool:
    """A BatchNorm whose forward is torch's own (a subclass may use its statistics differently)."""
    return isinstance(module, _BatchNorm) and type(module).forward in (_BatchNorm.forward, SyncBatchNorm.forward)


def _values(buffers: list[_BufferRef]) -> list[torch.Tensor]:
    with torch.no_grad():
        return [module.get_buffer(name).clone() for module, name in buffers]


def _restore(buffers: list[_BufferRef], values: list[torch.Tensor]) -> None:
    # In place: the module keeps its tensor objects (an optimizer, a DeepSpeed engine or the user
    # may hold them). Looked up by name: a module that reassigns a buffer in its forward gets the
    # values in the tensor it holds now.
    with torch.no_grad():
        for (module, name), value in zip(buffers, values, strict=True):
            module.get_buffer(name).copy_(value)
