"""Exact memory by category of one step on a DeepSpeed engine (:class:`~autotune.train.zero.ZeroTrainer`).

:func:`tracked_zero_step` counts storages with MemTracker, as the local runner does, but
DeepSpeed keeps model states in buffers MemTracker does not know: flat parameter groups, fp32
master partitions, gradient partitions, communication buckets. Before the tracked step every
tensor reachable from the engine's optimizer is labelled (:func:`_label_model_states`):

* parameters: the module's parameters (at ZeRO-3 their partitions, ``ds_tensor``, plus the full
  copies DeepSpeed gathers for a module's forward/backward while they live);
* optimizer state: the torch optimizer's state (Adam moments) *and* the fp32 master weights it
  updates, i.e. Rajbhandari et al. (SC'20)'s "optimizer states" (K = 12 bytes/parameter with Adam);
* gradients: ``.grad`` tensors and DeepSpeed's gradient partitions/accumulators;
* other: DeepSpeed's remaining buffers (reduce/all-gather buckets).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_map_only

from autotune.measurement.tracker import TrackedStep, breakdown, collector_paused, tracker_class
from autotune.train.zero import ZeroTrainer

if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker

__all__ = ["tracked_zero_step"]


def tracked_zero_step(trainer: ZeroTrainer) -> TrackedStep:
    """One real optimizer step under exact memory tracking, with DeepSpeed's buffers labelled."""
    tracker = tracker_class()(device=trainer.device)
    _label_model_states(tracker, trainer)
    resident = breakdown(tracker.device_snapshot("current"))
    # Fetched (collated, moved to the device) before tracking, then counted as activations: the
    # batch is training memory, the data loader's work on the dataset is not.
    batches = trainer.next_batches()
    tree_map_only(torch.Tensor, lambda t: _label(tracker, t, "ACT"), batches)
    with collector_paused(collect=True), tracker, _gathered_parameters_stay_parameters(tracker):
        # MemTracker needs reset_mod_stats before each forward of the same modules (accumulation).
        result = trainer.step(batches=batches, before_micro_batch=tracker.reset_mod_stats)
    del batches
    at_peak = breakdown(tracker.device_snapshot("peak"))
    return TrackedStep(
        result=result, at_peak=at_peak, category_peaks=breakdown(tracker.category_peaks), resident=resident
    )


def _label_model_states(tracker: MemTracker, trainer: ZeroTrainer) -> None:
    """Label every storage the engine holds; later labels win (a master copy may be a parameter)."""
    for path, t in _tensors_of(trainer.engine.optimizer, "optimizer"):
        _label(tracker, t, _kind_by_name(path.lower()))
    masters = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    for p in masters:
        _label(tracker, p, "OPT")
    for state in trainer.optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                _label(tracker, value, "OPT")
    module = trainer.engine.module
    for p in module.parameters():
        _label(tracker, p, "PARAM")
        _label(tracker, getattr(p, "ds_tensor", None), "PARAM")  # ZeRO-3: this rank's partition
    for b in module.buffers():
        _label(tracker, b, "BUFFER")
    for p in [*module.parameters(), *masters]:
        _label(tracker, p.grad, "GRAD")


def _label(tracker: MemTracker, t: torch.Tensor | None, kind: str) -> None:
    """Count ``t``'s storage under ``kind`` (a ``_MemRefType`` name), relabelling it if counted already.

    MemTracker's public ``track_external`` knows modules, optimizers and "other" tensors only;
    gradients, partitions and batches need its labelling method.
    """
    from torch.distributed._tools.mem_tracker import _MemRefType

    if t is not None and t.device.type != "meta" and t.untyped_storage().nbytes() > 0:
        tracker._update_and_maybe_create_winfos(t, _MemRefType[kind])


def _kind_by_name(path: str) -> str:
    """DeepSpeed's names: ``*grad*`` gradients; ``*fp32*`` master weights (``single_partition_of_fp32_groups``
    at stages 1-2, ``fp32_partitioned_groups_flat`` at 3, which ZeRO-3 hands the torch optimizer
    only during its step); the rest buckets."""
    if "grad" in path:
        return "GRAD"
    return "OPT" if "fp32" in path else "OTH"


def _tensors_of(
    obj: Any, path: str, depth: int = 0, seen: set[int] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors reachable from a DeepSpeed/torch optimizer object, with their attribute paths."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        yield path, obj
        if obj.grad is not None:
            yield f"{path}.grad", obj.grad
        return
    if depth > 6 or id(obj) in seen or isinstance(obj, torch.nn.Module):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        items: Any = ((f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[*]", v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple, set)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    elif type(obj).__module__.startswith(("deepspeed.", "torch.optim")) and hasattr(obj, "__dict__"):
        items = ((f"{path}.{k}", v) for k, v in vars(obj).items())
    else:
        return
    for sub_path, value in items:
        yield from _tensors_of(value, sub_path, depth + 1, seen)


@contextlib.contextmanager
def _gathered_parameters_stay_parameters(tracker: MemTracker) -> Iterator[None]:
    """At ZeRO-3, count the full parameters DeepSpeed gathers for a module as parameters.

    The gathered copy is created inside the forward (or backward), so MemTracker would call it an
    activation (temporary). DeepSpeed gathers in ``fetch_sub_module``, for forward and backward
    alike: relabel the module's parameters right after it.
    """
    try:
        from deepspeed.runtime.zero import partitioned_param_coordinator as ppc
    except ImportError:  # a DeepSpeed without ZeRO-3's coordinator: nothing gathered to relabel
        yield
        return
    original = ppc.PartitionedParameterCoordinator.fetch_sub_module

    def fetch_sub_module(self: Any, current_submodule: torch.nn.Module, forward: bool) -> None:
        original(self, current_submodule, forward)
        for p in ppc.iter_params(current_submodule):
            _label(tracker, p, "PARAM")

    ppc.PartitionedParameterCoordinator.fetch_sub_module = fetch_sub_module
    try:
        yield
    finally:
        ppc.PartitionedParameterCoordinator.fetch_sub_module = original
