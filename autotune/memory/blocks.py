"""Per-block activation profile: how many bytes each block saves for backward, per sample.

Counted with ``torch.autograd.graph.saved_tensors_hooks`` around each block's forward: every
tensor autograd saves inside the block is seen once, and its storage bytes are summed (storages,
not tensors, so views of one buffer count once). This is exact and cheap (one forward pass of a
fake-tensor copy: shapes only, so nothing is computed or allocated on the host whatever the
model's size; a real forward where the fake one cannot run), and it is what checkpointing a
block removes and autocast shrinks. The search ranks blocks by it ("checkpoint the N hungriest
blocks").

The fake forward itself (a fake copy of the model and of a batch, run with torch's logs of a failing
pass silenced and transformers' value checks answered from the real batch) is :func:`fake_forward`,
which the skip scan (:mod:`autotune.memory.structure`) and the study's selective screen
(:mod:`autotune.search.selective_screen`) run too; :func:`block_positions` is the blocks as modules
(a module at two block positions is one), which each of them hooks.

The memory model's profile (every category, stretch by stretch, under ``FakeTensorMode``) is
:func:`autotune.memory.profile.fake_profile`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from autotune.config import Precision
from autotune.errors import WorkloadError
from autotune.train.base import check_loss
from autotune.train.wrappers import apply_block_knobs
from autotune.workload import Workload
from autotune.worst_case import profile_batch

__all__ = ["BlockProfile", "block_positions", "fake_forward", "profile_blocks"]


@dataclass(frozen=True, kw_only=True)
class BlockProfile:
    """Bytes saved for backward by each block, in forward order, for one precision.

    ``saved_bytes[i]`` is for a micro-batch of ``micro_batch_size`` samples. Under autocast it
    includes the low-precision weight copies autograd saves, which do not grow with the batch:
    profile at two micro-batch sizes to separate the per-sample part.
    """

    names: tuple[str, ...]
    precision: Precision
    micro_batch_size: int
    saved_bytes: tuple[int, ...]

    def ranked(self) -> tuple[int, ...]:
        """Block indices from most to least activation bytes (ties: earlier block first)."""
        return tuple(sorted(range(len(self.names)), key=lambda i: (-self.saved_bytes[i], i)))


def block_positions(model: torch.nn.Module, names: tuple[str, ...]) -> list[tuple[torch.nn.Module, list[int]]]:
    """Each distinct block module of ``model`` with the positions in ``names`` it holds, in the
    order of first appearance: a module at two block positions (shared weights, ALBERT-style) is
    one module, one forward per call, and a hook on it must stand for every position it holds.

    Example:
        >>> import torch
        >>> layer = torch.nn.Linear(2, 2)
        >>> model = torch.nn.Sequential(layer, torch.nn.ReLU(), layer)
        >>> [(type(m).__name__, p) for m, p in block_positions(model, ("0", "1", "2"))]
        [('Linear', [0, 2]), ('ReLU', [1])]
    """
    groups: dict[int, tuple[torch.nn.Module, list[int]]] = {}
    for i, name in enumerate(names):
        module = model.get_submodule(name)
        groups.setdefault(id(module), (module, []))[1].append(i)
    return list(groups.values())


@contextmanager
def fake_forward(workload: Workload, batch: Any) -> Iterator[tuple[torch.nn.Module, Any]]:
    """A fake-tensor copy of the model and of ``batch``, for one forward the caller runs on them.

    Inside the block the fake mode is active (the forward computes shapes only: nothing is
    allocated, whatever the model's size), torch's log records of an error raised in the pass are
    silenced, transformers' value checks on the batch are answered from the real ``batch``, and the
    kernels whose meta kernels get a real run wrong are answered as the profile answers them
    (:class:`autotune.memory.fake_workspaces.RealWorkspaces`).
    The caller installs its own hooks or dispatch mode on the copy and calls the workload's loss
    on the two. What the copy or the forward raises goes through unchanged: a model the fake pass
    cannot go through (a data-dependent operation, an operator without a meta kernel) raises
    torch's error, and the caller decides what that means (the block profile runs the model for
    real, the selective screen concludes nothing).

    Args:
        workload: The model to copy; the model itself is untouched.
        batch: A real batch of the workload (:func:`autotune.worst_case.profile_batch`).

    Yields:
        The fake copy of the model, in training mode, and the fake copy of ``batch``.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.memory.fake_branches import RealBranches
    from autotune.memory.fake_logs import quiet_fake_logs
    from autotune.memory.fake_values import RealValues, batch_pairs
    from autotune.memory.fake_workspaces import RealWorkspaces

    fake = FakeTensorMode(allow_non_fake_inputs=False)
    model = workload.model_copy(fake=fake)
    with quiet_fake_logs(), fake:
        fake_batch = tree_map_only(torch.Tensor, fake.from_tensor, batch)
        with RealBranches(batch), RealValues(batch_pairs(fake_batch, batch)), RealWorkspaces():
            yield model, fake_batch


def profile_blocks(workload: Workload, *, micro_batch_size: int = 2, precision: Precision = "fp32") -> BlockProfile:
    """Count each block's saved bytes in one forward pass of a copy of the model, on the host.

    The pass runs on fake tensors (no compute, no activation memory); a model the fake pass
    cannot go through (a data-dependent operation, an operator without a meta kernel) is run for
    real instead, at ``micro_batch_size``.
    """
    batch = profile_batch(workload, micro_batch_size)
    try:
        # torch logs an error it raises in the fake pass with its traceback (silenced in
        # fake_forward): the real pass below is the answer to it.
        with fake_forward(workload, batch) as (model, fake_batch):
            counts = _count(workload, model, fake_batch, precision)
    except WorkloadError:
        raise
    # The fake pass executes the user's model code: whatever it raises there means "run it for
    # real", which a broken model then raises again with its own error.
    except Exception:
        counts = _count(workload, workload.model_copy(), batch, precision)
    return BlockProfile(
        names=workload.block_names(), precision=precision, micro_batch_size=micro_batch_size, saved_bytes=counts
    )


def _count(workload: Workload, model: torch.nn.Module, batch: Any, precision: Precision) -> tuple[int, ...]:
    names = workload.block_names()
    wrappers = apply_block_knobs(model, names, [precision] * len(names), ["none"] * len(names), device_type="cpu")
    counts = [0] * len(names)
    state = itertools.chain(model.parameters(), model.buffers())  # BatchNorm saves its running stats
    params = {t.untyped_storage()._cdata for t in state}
    # One pair of hooks per module: a module at two block positions (shared weights) runs once per
    # position, and its k-th call in the forward is its k-th position.
    blocks = block_positions(model, names)
    handles = [m.register_forward_pre_hook(_enter(counts, at, params), with_kwargs=True) for m, at in blocks] + [
        # always_call: a block that raises (the fake pass refusing the model) still pops its hooks,
        # which would otherwise stay pushed in the process and pack every later step's tensors.
        m.register_forward_hook(_exit, with_kwargs=True, always_call=True)
        for m, _ in blocks
    ]
    try:
        check_loss(workload.loss_fn(model, batch), workload.name)  # a broken loss_fn: one line, before any run
    finally:
        for h in handles:
            h.remove()
        wrappers.remove()
    return tuple(counts)


def _enter(counts: list[int], positions: list[int], params: set[int]) -> Any:
    # Storages are told apart by their StorageImpl (``_cdata``): fake tensors have no data pointer.
    calls = itertools.count()

    def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        index = positions[next(calls) % len(positions)]
        seen = set(params)  # parameters and buffers saved for backward are model state, not activations

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage._cdata not in seen:
                seen.add(storage._cdata)
                counts[index] += storage.nbytes()
            return t.detach()  # the same storage; a saved output as itself would hold its grad_fn (a cycle)

        ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        ctx.__enter__()
        module.__dict__["_autotune_profile_ctx"] = ctx

    return hook


def _exit(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
    ctx = module.__dict__.pop("_autotune_profile_ctx", None)
    if ctx is not None:
        ctx.__exit__(None, None, None)
