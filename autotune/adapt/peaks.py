"""An adaptive run's measured peaks against its budget: what the controller records of memory.

:class:`autotune.adapt.controller.Controller` holds one :class:`Peaks`: every measured peak goes
to the budget gate (a check of the memory model on the device noted in the history; the
default's peak the basis of a percentage budget), every step measured over the budget is recorded
and warned of, and a start or resume is admitted as the budget's own rule says.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from autotune.adapt.records import Change, OverBudgetStep
from autotune.errors import OverBudgetWarning
from autotune.measurement.cuda_memory import reserved_with_headroom

if TYPE_CHECKING:
    from autotune.adapt.decider import Decider
    from autotune.config import TrainConfig
    from autotune.measurement.cuda_memory import AllocatorStats
    from autotune.memory.gate import BudgetGate, Verdict

__all__ = ["Peaks"]


class Peaks:
    """The measured peaks of one adaptive run, and the steps measured over its budget.

    Args:
        gate: The run's budget gate.
        decider: The run's decider (its history notes the memory checks).
        default: The run's own configuration.
        fraction: The budget as a fraction of the default's peak (None: bytes).
    """

    def __init__(self, *, gate: BudgetGate, decider: Decider, default: TrainConfig, fraction: float | None) -> None:
        self.gate, self.decider, self.default, self.fraction = gate, decider, default, fraction
        self.over_budget: list[OverBudgetStep] = []

    @property
    def whole(self) -> bool:
        """The budget is at least the default's own peak (``"100%"``)."""
        return self.fraction is not None and self.fraction >= 1.0

    def measured(
        self, config: TrainConfig, peak: int, allocator: AllocatorStats | None = None, *, step: int | None = None
    ) -> None:
        """Record a measured peak of ``config``; the default's also sets a percentage budget.

        Args:
            config: The configuration measured.
            peak: Its peak tensor bytes.
            allocator: On CUDA, the caching allocator's peaks over that step.
            step: Optimizer steps done, for a step of the run (None: a resumed measurement). Where
                the step checked the memory model on the device (the first of a kind there,
                :meth:`~autotune.memory.gate.BudgetGate.record`), the history says so (source
                ``"memory"``, nothing applied).
        """
        checks = self.gate.record(config, peak, allocator=allocator)
        if checks and step is not None:
            from autotune.memory.check_text import trial_line

            self.decider.note(
                Change(
                    step=step,
                    source="memory",
                    before=config,
                    after=config,
                    applied=False,
                    reason=trial_line(checks),
                    measured_bytes=peak,
                )
            )
        if config == self.default and self.fraction is not None:
            # A percentage is of the default's peak: its measurement replaces its prediction
            # (they differ by a few hundred bytes on the local runner). On CUDA it is of the
            # default's reserved peak with its headroom: 100% must admit the default.
            basis = peak if allocator is None else reserved_with_headroom(allocator.reserved_peak)
            self.gate.budget = max(self.gate.budget, int(basis * self.fraction))

    def over(self, index: int, config: TrainConfig, peak: int) -> None:
        """A measured step over the budget: recorded, and said at once (the run exceeded the
        memory it was given, if only for one step)."""
        predicted = self.gate.predict(config)
        over = OverBudgetStep(
            step=index,
            config=config,
            peak_bytes=peak,
            budget_bytes=self.gate.budget,
            predicted_bytes=None if predicted is None else predicted[0],
        )
        self.over_budget.append(over)
        warnings.warn(OverBudgetWarning(over.describe()), stacklevel=4)

    def admits_start(self, config: TrainConfig, verdict: Verdict) -> bool:
        """Whether a run may start (or resume) at ``config``: the gate admits it, or it is the
        default under a budget of at least the default's own peak (``"100%"``: the prediction's
        headroom must not refuse the very configuration the budget was taken from)."""
        return verdict.admitted or (config == self.default and self.whole)

    def resumed(self, saved: TrainConfig, *, current: TrainConfig, step: int, run: str) -> TrainConfig:
        """Where a resumed run goes: ``saved`` if this run's gate admits it (:meth:`admits_start`),
        else ``current``, where this run started (a ``budget`` change in the history, and no
        trial or previous configuration to go back to)."""
        verdict = self.gate.admits(saved)
        if self.admits_start(saved, verdict):
            return saved
        reason = f"resumed under a budget it is over ({verdict.reason}): back to where this {run} starts"
        self.decider.note(Change(step=step, source="budget", before=saved, after=current, applied=True, reason=reason))
        self.decider.previous, self.decider.trial = current, None
        return current
