"""A framework loop's evaluations: their peak measured, the training window's peaks kept apart.

**Evaluation** (the Trainer's ``evaluate()`` every N steps, Lightning's validation) is part of
the peak the budget protects, but not of any training configuration: the callbacks bracket it
with :meth:`FrameworkLoop.evaluation_begin` and :meth:`FrameworkLoop.evaluation_end`. The first
evaluation's peak is measured (:attr:`FrameworkLoop.evaluation_peak`): on the CPU exactly, by
tracking every storage on the model's device over it (the model, the optimizer's state and what
the evaluation allocates); on CUDA as the caching allocator's reserved peak over it. Around
every evaluation on CUDA the allocator's peak statistics are read (the training window's, kept)
and reset, so the training steps' peaks, the run's statistics the gate reads at decisions and a
step's measured peak never include an evaluation: an evaluation over the budget never reverts
or shrinks the training configuration (transformers#32215: ``auto_find_batch_size`` halved the
training batch when evaluation ran out of memory). It is said once, with what to lower instead.
"""

from __future__ import annotations

import dataclasses
import warnings

import torch

from autotune.adapt.records import Change
from autotune.errors import OverBudgetWarning
from autotune.integrations._loop_state import LoopState
from autotune.measurement.cuda_memory import AllocatorStats
from autotune.measurement.tracker import breakdown, tracker_class
from autotune.memory.gate import admission

__all__ = ["Evaluations"]


class Evaluations(LoopState):
    """:class:`~autotune.integrations._framework.FrameworkLoop`'s evaluation hooks and the
    training windows' allocator statistics (a mixin over :class:`~autotune.integrations._loop_state.LoopState`)."""

    def run_stats(self) -> AllocatorStats | None:
        if self.allocator is None or self._device is None:
            return None
        # Reset only around evaluations (the user's statistics too): the training windows' peaks.
        return _peaks(self._trained, AllocatorStats.read(self.allocator, self._device))

    def evaluation_begin(self, *optimizers: torch.optim.Optimizer) -> None:
        """An evaluation starts (between optimizer steps). On CUDA the training window's peaks are
        kept and the allocator's peak statistics reset; on the CPU the first evaluation is tracked
        (the model and the ``optimizers``' state count: they are on the device throughout). Before
        :meth:`begin` (Lightning's sanity check) nothing is done."""
        if self.controller is None or self._evaluating:
            return
        self._evaluating = True
        if self.allocator is not None and self._device is not None:
            self._trained = _peaks(self._trained, AllocatorStats.read(self.allocator, self._device))
            self.allocator.reset_peak_memory_stats(self._device)
        elif self.evaluation_peak is None and self._model is not None:
            self._tracker = tracker_class()(device=self._device)
            self._tracker.track_external(self._model, *optimizers)
            self._tracker.__enter__()

    def evaluation_batch(self) -> None:
        """Before each evaluation batch: the tracker's per-module statistics start again (it
        refuses a module's second forward otherwise; its totals are kept)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def evaluation_end(self, step: int, *, lower: str) -> None:
        """The evaluation :meth:`evaluation_begin` opened ended at optimizer step ``step``: the
        first one's peak is kept and noted in the history (source ``"evaluation"``, nothing
        applied) and, if over the budget, said once (:class:`~autotune.errors.OverBudgetWarning`;
        ``lower``: what the user lowers instead). The training configuration stays as it is."""
        if not self._evaluating:
            return
        self._evaluating = False
        assert self.controller is not None
        peak = reserved = None
        if self.allocator is not None and self._device is not None:
            stats = AllocatorStats.read(self.allocator, self._device)
            self.allocator.reset_peak_memory_stats(self._device)  # the next training window starts here
            if self.evaluation_peak is None:
                # As the gate judges a measured peak on CUDA: reserved memory, with its headroom.
                peak = reserved = stats.reserved_peak
        elif self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)
            peak = breakdown(tracker.device_snapshot("peak")).total
        if peak is None:
            return
        self.evaluation_peak = peak
        budget, config = self.controller.gate.budget, self.controller.config
        verdict = admission(budget=budget, headroom=0.0, measured=peak, reserved=reserved)
        fits = verdict.admitted
        reason = (
            f"the evaluation {verdict.reason}; the training configuration stays: evaluation is not what the budget "
            "adapts"
        )
        if not fits:
            reason += f" (lower {lower})"
        self.controller.decider.note(
            Change(
                step=step,
                source="evaluation",
                before=config,
                after=config,
                applied=False,
                reason=reason,
                measured_bytes=peak,
            )
        )
        if not fits:
            warnings.warn(OverBudgetWarning(f"step {step}: {reason}"), stacklevel=3)


def _peaks(kept: AllocatorStats | None, now: AllocatorStats) -> AllocatorStats:
    """The peaks of two windows of the allocator's statistics together (its counters of retries
    and out-of-memory errors are since the process started: the later ones)."""
    if kept is None:
        return now
    return dataclasses.replace(
        now,
        allocated_peak=max(kept.allocated_peak, now.allocated_peak),
        reserved_peak=max(kept.reserved_peak, now.reserved_peak),
    )
