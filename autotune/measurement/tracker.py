"""Exact peak tensor memory of one training step, by category.

``torch.distributed._tools.mem_tracker.MemTracker`` is a TorchDispatchMode that sees every
storage created and freed, and classifies it (parameter, gradient, optimizer state, activation,
temporary). Counting storages is exact and repeatable, unlike process RSS, which on CPU jumps by
tens of MiB between identical steps. It costs ~2x a step (more on deep attention models), so we
track one dedicated step and time the others untracked.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from autotune.errors import UnsupportedError
from autotune.measurement.record import MemoryBreakdown
from autotune.train.base import StepResult

if TYPE_CHECKING:
    from autotune.train.local import Trainer

__all__ = ["TrackedStep", "breakdown", "collector_paused", "tracked_step", "tracker_class"]

# MemTracker's category names (``_MemRefType`` values) -> our fields.
_CATEGORIES = {
    "Parameter": "parameters",
    "Gradient": "gradients",
    "Optstate": "optimizer_state",
    "Activation": "activations",
    "Temp": "temporaries",
    "Buffer": "buffers",
    "Other": "other",
}
_TOTAL = "Total"  # the key of a MemTracker snapshot's sum over its categories


if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker as _MemTrackerBase
else:
    _MemTrackerBase = object  # MemTracker itself is imported by tracker_class, where torch may lack it


class _CategoryPeaks(_MemTrackerBase):
    """MemTracker's additions (a mixin: :func:`tracker_class` puts it before MemTracker, imported
    there): each category's own maximum over the step, and what follows.

    MemTracker's "peak" snapshot is the breakdown at the moment of peak *total*. On a small
    model that moment is often the optimizer step, after activations are freed, so the
    activation saving of checkpointing or autocast would not show in it. The per-category
    maxima do show it. Cost: one pass over ~8 counters per dispatched op, next to MemTracker's own.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        super().__init__()
        # The device whose memory the budget is about. MemTracker keeps one snapshot per
        # device it sees, and a CUDA step also touches host tensors (Adam's `step` counters
        # live on the CPU unless `capturable`/`fused`; the DataLoader's batch before its copy):
        # host memory is not the accelerator's, so only this device's snapshot counts.
        self.device = None if device is None else torch.device(device)
        self.category_peaks: dict[str, int] = {}

    def counts(self, device: torch.device) -> bool:
        if self.device is None:
            return True
        return device.type == self.device.type and (device.index or 0) == (self.device.index or 0)

    def device_snapshot(self, kind: str = "peak") -> dict[Any, int]:
        """The tracked device's snapshot (``kind`` as in ``get_tracker_snapshot``), {} if unseen."""
        snapshots = {d: snap for d, snap in self.get_tracker_snapshot(kind).items() if self.counts(d)}
        assert len(snapshots) <= 1, f"one device per rank expected, got {list(snapshots)}"
        return next(iter(snapshots.values()), {})

    # A module created inside forward (Hugging Face models build a CrossEntropyLoss() there) is
    # gone by backward: MemTracker skips its per-module backward hooks, with a UserWarning
    # each time. Skip them quietly: they only feed per-module stats, never the totals.
    def _pre_bw_hook(self, module: torch.nn.Module | None, args: Any) -> None:
        if module is not None:
            super()._pre_bw_hook(module, args)

    def _post_bw_hook(self, module: torch.nn.Module | None, args: Any) -> None:
        if module is not None:
            super()._post_bw_hook(module, args)

    # MemTracker registers a gradient hook on every parameter of every module it meets, and
    # ``register_hook`` raises on a frozen one (``requires_grad=False``: frozen embeddings, a
    # frozen backbone, the base weights under LoRA adapters). A frozen parameter never gets a
    # gradient, so only the others are hooked, with MemTracker's own two hooks.
    def _track_module_params_and_buffers(
        self, module: torch.nn.Module, install_grad_hooks: bool = True
    ) -> tuple[int, int]:
        from torch.distributed._tools.mem_tracker import _MemRefType

        memory: tuple[int, int] = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if not install_grad_hooks:
            return memory

        def grad_hook(grad: torch.Tensor) -> None:
            self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

        for param in module.parameters():
            if param.requires_grad and self._param_to_grad_hook_handles.get(param, None) is None:
                self._param_to_grad_hook_handles[param] = (
                    param.register_hook(grad_hook),
                    param.register_post_accumulate_grad_hook(lambda p: grad_hook(p.grad)),
                )
        return memory

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if getattr(func, "is_view", False):
            # A view allocates nothing: its storage is its base's. MemTracker would count a
            # view of a storage it never saw (a dataset tensor indexed by the DataLoader) as
            # a new allocation of the *whole* base storage, alive for the rest of the step
            # (measured: +48 MB of "activations" on resnet-tiny, whatever the batch size).
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)

    # ModTracker puts multi-grad hooks on every module's inputs and outputs; those whose
    # gradient is never computed (an output off the loss path, a recomputed block's) keep a
    # cycle through C++ (autograd node -> hook -> closure -> node) the cyclic collector cannot
    # see, and with it the node's AccumulateGrad edges, i.e. the parameters (pytorch PR
    # #139214). Left alone, the model copy of every configuration measured earlier in the
    # process stays allocated, and a study's trials that fit fail on the budget. The handles
    # are collected while the tracker is entered and removed when it exits, after the step's
    # backward.
    def __enter__(self) -> Any:
        self._grad_hooks: list[Any] = []
        # What the tracker holds while entered, left in reverse order on exit (or on a failed enter).
        contexts = contextlib.ExitStack()
        contexts.enter_context(_collect_grad_hooks(self._grad_hooks))
        # Compiled code runs eagerly while tracked: Dynamo does not trace into a dispatch mode
        # (this tracker is one), so a compiled model falls back to eager here anyway, and a
        # function compiled with fullgraph=True (nanochat's MuonAdamW compiles its fused updates
        # so) raised "Attempted to call function marked as skipped" instead. The eager step is
        # what is counted.
        contexts.enter_context(torch.compiler.set_stance("force_eager"))
        # ModTracker's module hooks are global ones, and a compiled module called while any is
        # registered warns that they "fire an extra time for the OptimizedModule": once per
        # tracked step of a compiled model, in the user's output. The extra call only adds the
        # wrapper's own per-module entry, which this tracker never reads (_update_peak_stats).
        contexts.enter_context(warnings.catch_warnings())
        warnings.filterwarnings("ignore", message=r"Using `torch\.compile\(module\)` when there are global hooks")
        try:
            entered = super().__enter__()
        except BaseException:
            contexts.close()
            raise
        self._contexts = contexts
        return entered

    def __exit__(self, *args: Any) -> Any:
        try:
            return super().__exit__(*args)
        finally:
            self._contexts.close()
            for handle in self._grad_hooks:
                handle.remove()
            self._grad_hooks.clear()

    def _update_peak_stats(self, peak_state: Any) -> None:
        # Called after every dispatched op. MemTracker's own also walks every module tracked
        # so far to keep per-module peaks (deep copies of snapshots) that autotune never reads:
        # O(modules) per op, the largest single cost of a fake-tensor profile of a
        # transformers model (1.3 million weak-dictionary reads for 28 thousand ops of a
        # tiny T5's profile). Only the step-wide peak (MemTracker's "peak" snapshot, as it
        # keeps it) and each category's maximum are kept here.
        for device, dev_snap in self._curr_mem_snap.items():
            total = dev_snap[_TOTAL]
            if self._peak_mem.get(device, 0) < total:
                self._peak_mem[device] = total
                self._peak_mem_snap[device] = dict(dev_snap)  # ints: a copy is a deep copy
            if not self.counts(device):
                continue
            for key, nbytes in dev_snap.items():
                name = getattr(key, "value", key)
                if nbytes > self.category_peaks.get(name, 0):
                    self.category_peaks[name] = nbytes


@functools.cache
def tracker_class() -> type[Any]:
    try:
        from torch.distributed._tools.mem_tracker import MemTracker
    except ImportError:
        raise UnsupportedError(
            f"exact memory tracking needs torch>=2.5 (torch.distributed._tools.mem_tracker), "
            f"but torch {torch.__version__} is installed."
        ) from None

    class _CategoryPeakTracker(_CategoryPeaks, MemTracker):
        """MemTracker that also keeps each category's own maximum over the step (:class:`_CategoryPeaks`)."""

    return _CategoryPeakTracker


_REGISTER = "register_multi_grad_hook"


@contextlib.contextmanager
def _collect_grad_hooks(handles: list[Any]) -> Iterator[None]:
    """While entered, every multi-grad hook ModTracker registers also lands in ``handles``.

    ModTracker keeps no handles of its own; it calls the ``register_multi_grad_hook`` its module
    imported, so that name is wrapped there and restored on exit (a nested tracker restores the
    outer one's wrapper). A torch without that name is left as it is."""
    from torch.distributed._tools import mod_tracker

    register = getattr(mod_tracker, _REGISTER, None)
    if register is None:
        yield
        return

    def collecting(*args: Any, **kwargs: Any) -> Any:
        handle = register(*args, **kwargs)
        handles.append(handle)
        return handle

    setattr(mod_tracker, _REGISTER, collecting)
    try:
        yield
    finally:
        setattr(mod_tracker, _REGISTER, register)


@dataclass(frozen=True, kw_only=True)
class TrackedStep:
    """One real optimizer step under exact memory tracking."""

    result: StepResult
    at_peak: MemoryBreakdown  # at the moment of the peak total
    category_peaks: MemoryBreakdown  # each category's own maximum over the step
    resident: MemoryBreakdown | None = None  # held between steps, counted before it (ranks only)


@contextlib.contextmanager
def collector_paused(*, collect: bool = False) -> Iterator[None]:
    """Python's cycle collector off inside (after a collection first, with ``collect``).

    A model whose tensors sit in reference cycles (PEFT's DoRA layers) frees them only when the
    collector runs, which it does after some number of allocations: whenever it happened to run
    inside a step, its peak moved (a DoRA Qwen2: three tracked steps of one configuration 5,669,932,
    5,669,932 and 5,686,316 bytes, three fake profiles 5,604,392 to 5,735,464). Paused, a step's
    peak is the one of a step the collector does not run in: the worst case a budget must hold,
    the same every time, and the same in the fake run (5,768,236 measured, 5,768,232 predicted)."""
    import gc

    if collect:
        gc.collect()  # what earlier steps left in cycles is not this step's
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def tracked_step(trainer: Trainer) -> TrackedStep:
    """Run one real optimizer step of the local trainer under exact memory tracking (the cycle
    collector paused: :func:`collector_paused`)."""
    tracker = tracker_class()(device=trainer.device)
    tracker.track_external(trainer.model, trainer.optimizer)
    # A compiled configuration's step runs eagerly under the tracker (Dynamo steps aside under a
    # dispatch mode): its tracked peak is the eager forward's (docs/study.md, "torch.compile").
    with collector_paused(collect=True), trainer.eagerly(), tracker:
        # MemTracker's module stats raise on a module seen twice ("multiple iterative calls")
        # unless reset before each forward: with accumulation, before every micro-batch.
        result = trainer.step(before_micro_batch=tracker.reset_mod_stats)
    at_peak = breakdown(tracker.device_snapshot("peak"))
    return TrackedStep(result=result, at_peak=at_peak, category_peaks=breakdown(tracker.category_peaks))


def breakdown(snapshot: Mapping[Any, int]) -> MemoryBreakdown:
    values = dict.fromkeys(_CATEGORIES.values(), 0)
    for key, nbytes in snapshot.items():
        name = getattr(key, "value", key)  # MemTracker keys are _MemRefType str-enums
        if name in _CATEGORIES:
            values[_CATEGORIES[name]] += int(nbytes)
    return MemoryBreakdown(**values)
