"""The rules an adaptive run's decisions follow: a proposal admitted or refused, a trial kept or left.

The :class:`~autotune.adapt.decider.Decider` owns one :class:`Rules` and keeps the record of what
they decided (its history, the refused configurations): the rules only read the run's measurements
(:class:`~autotune.adapt.ledger.Ledger`) and its budget gate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.adapt.records import Change
from autotune.knobs import smallest_micro_batch
from autotune.measurement.objective import format_value
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.adapt.ledger import Ledger
    from autotune.adapt.recompiles import Recompiles
    from autotune.adapt.sources import Observation, Proposal
    from autotune.config import TrainConfig
    from autotune.measurement.objective import ObjectiveName
    from autotune.memory.gate import BudgetGate, Verdict

__all__ = ["Rules"]


@dataclass(frozen=True, kw_only=True)
class Rules:
    """The decider's rules (see :class:`~autotune.adapt.decider.Decider` for the arguments).

    Attributes:
        gate: The budget gate every configuration passes.
        ledger: The run's measurements.
        objective: Which measured configuration within the budget is better.
        takes: What of a proposal the loop can run (None: all of it).
        min_micro_batch: The smallest micro-batch a proposal may split a rank's batch into.
        micro_why: Why, for the history.
        recompiles: On a user's compiled model, its recompiles (None: an eager model).
    """

    gate: BudgetGate
    ledger: Ledger
    objective: ObjectiveName
    takes: Callable[[TrainConfig, TrainConfig], TrainConfig] | None
    min_micro_batch: int | None
    micro_why: str
    recompiles: Recompiles | None

    def admit(
        self, step: int, current: TrainConfig, proposal: Proposal, source: str
    ) -> tuple[Change | None, Change | None]:
        """``proposal`` as a change from ``current`` the loop can make.

        Returns:
            The change to make (None: none), and a refusal for the history (logged once per
            configuration), or None.
        """
        floored = self.floored(current, proposal.config)
        target = floored if self.takes is None else self.takes(current, floored)
        if target == current:
            return None, None
        known, here = self.ledger.trusted(target), self.ledger.trusted(current)
        objective = self.objective
        if (
            known is not None
            and here is not None
            and known.score.under(objective) < (1 + TUNING.margin) * here.score.under(objective)
        ):
            # Measured before, and not clearly better: going there again would only pay the move.
            why = (
                f"measured at step {known.step}: {format_value(known.score.under(objective), objective)}, not "
                f"{TUNING.margin:.0%} above this configuration's {here.score.under(objective):.1f}"
            )
            refused = Change(
                step=step,
                source=source,
                before=current,
                after=target,
                applied=False,
                reason=f"{proposal.reason}; {why}",
                measured_bytes=known.score.peak_bytes,
            )
            return None, refused
        recompile = self.recompile_refusal(current, target)
        if recompile is not None:
            reason = f"{proposal.reason}; {recompile}"
            return None, Change(step=step, source=source, before=current, after=target, applied=False, reason=reason)
        verdict = self.gate.admits(target)
        change = _change(step, current, target, proposal, source, verdict)
        wanted = proposal.config
        if (wanted.micro_batch_size, wanted.grad_accum_steps) != (target.micro_batch_size, target.grad_accum_steps):
            # What the loop forbids is in the history: a framework's loop keeps its own split.
            kept = f"{target.micro_batch_size}x{target.grad_accum_steps}"
            asked = f"{wanted.micro_batch_size}x{wanted.grad_accum_steps}"
            if floored != wanted:
                reason = f"{change.reason}; split {asked} not taken, {kept} kept: {self.micro_why}"
            else:
                reason = f"{change.reason}; split {asked} not taken: the loop keeps {kept}"
            change = dataclasses.replace(change, reason=reason)
        if not verdict.admitted:
            return None, change
        return change, None

    def floored(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        """``proposed`` with its micro-batch raised to the floor (:func:`smallest_micro_batch`):
        the current split where the batch is the same, else the smallest split at the floor."""
        per_rank = proposed.micro_batch_size * proposed.grad_accum_steps
        smallest = smallest_micro_batch(per_rank, self.min_micro_batch)
        if proposed.micro_batch_size >= smallest:
            return proposed
        if current.micro_batch_size * current.grad_accum_steps == per_rank and current.micro_batch_size >= smallest:
            micro = current.micro_batch_size
        else:
            micro = min(m for m in range(smallest, per_rank + 1) if per_rank % m == 0)
        return dataclasses.replace(proposed, micro_batch_size=micro, grad_accum_steps=per_rank // micro)

    def back_to_best(self, obs: Observation, previous: TrainConfig | None) -> Change | None:
        """Measurement overrules the decision source (see :meth:`Decider.decide`): the change back
        from a trusted ``obs.config`` to the best other configuration measured within the budget
        unless it measures more than the margin above it; None to stay.

        Args:
            obs: The run since the last decision, on the configuration a proposal brought.
            previous: The configuration the last change left (named in the reason).

        Returns:
            The change back (``applied``), the same refused where a compiled model's recompile
            would not pay it back (only logged), or None.
        """
        others = [
            r
            for c, r in self.ledger.judged.items()
            if c != obs.config and r.score.peak_bytes <= self.gate.budget and self.ledger.trusted(c) is not None
        ]
        objective = self.objective
        here = self.ledger.trusted(obs.config)
        assert here is not None, "judged on enough timed steps first"
        best = max(others, key=lambda r: r.score.under(objective), default=None)
        if best is None or here.score.under(objective) > (1 + TUNING.margin) * best.score.under(objective):
            return None
        which = "the configuration it replaced" if best.config == previous else "the best measured configuration"
        reason = (
            f"measured {format_value(here.score.under(objective), objective)}, not {TUNING.margin:.0%} above the "
            f"{best.score.under(objective):.1f} of {which}: back to it"
        )
        why = self.recompile_refusal(obs.config, best.config)
        if why is not None:  # on a compiled model going back must pay its recompile back too
            return Change(
                step=obs.step,
                source="measured",
                before=obs.config,
                after=best.config,
                applied=False,
                reason=f"{reason}; {why}",
            )
        return Change(
            step=obs.step,
            source="measured",
            before=obs.config,
            after=best.config,
            applied=True,
            reason=reason,
            measured_bytes=best.score.peak_bytes,
        )

    def recompile_refusal(self, current: TrainConfig, target: TrainConfig) -> str | None:
        """On a compiled model, why going from ``current`` to ``target`` does not pay its recompile
        (:meth:`Recompiles.refusal`: the cap, or the seconds saved per step where both were
        measured, over the horizon, against the measured recompile seconds); else None."""
        if self.recompiles is None:
            return None
        here, there = self.ledger.trusted(current), self.ledger.trusted(target)
        saved = None
        if here is not None and there is not None and here.score.throughput and there.score.throughput:
            saved = (
                current.effective_batch_size / here.score.throughput
                - target.effective_batch_size / there.score.throughput
            )
        return self.recompiles.refusal(current, target, saved=saved)


def _change(
    step: int, current: TrainConfig, target: TrainConfig, proposal: Proposal, source: str, verdict: Verdict
) -> Change:
    return Change(
        step=step,
        source=source,
        before=current,
        after=target,
        applied=verdict.admitted,
        reason=f"{proposal.reason}; {verdict.reason}",
        predicted_bytes=verdict.predicted,
        measured_bytes=verdict.measured,
    )
