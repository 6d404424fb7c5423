"""A side-by-side trial of an adaptive run: a proposal measured against the configuration it replaced.

The :class:`~autotune.adapt.decider.Decider` starts one where the loop can switch every step
(:meth:`Decider.moved`), asks it which side the next step runs (:meth:`SideBySide.next_config`) and,
after each step of the candidate, for its verdict (:meth:`SideBySide.verdict`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from autotune.adapt.records import Change
from autotune.measurement.objective import format_value
from autotune.measurement.sidebyside import Timing, separated
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotune.adapt.ledger import Ledger
    from autotune.config import TrainConfig
    from autotune.measurement.objective import ObjectiveName

__all__ = ["SideBySide", "TrialOutcome"]

#: A trial's state after a step of its candidate: no verdict yet, the candidate kept, or back to
#: the incumbent.
TrialOutcome = Literal["pending", "kept", "back"]


@dataclass
class SideBySide:
    """A proposal measured side by side with the configuration it replaced.

    On a shared machine one stint of steps can time 10-20% off the next, more than the margins
    worth deciding on; steps alternating between the two configurations see the same machine.
    The loop runs :meth:`Decider.trial_config` each step (one reconfiguration per step: a swap of
    block wrappers and the micro-batch drawn, ~1 ms on the local loop), so half of the trial's
    steps run at the incumbent instead of all of them at a candidate that may be worse.

    Attributes:
        candidate: The proposed configuration on trial.
        incumbent: The configuration it replaced.
        samples: Samples/s of each side's timed steps in the trial, by configuration.
        fresh: Whether the trial has not run a step yet: its first step runs where the loop is
            (the candidate), as its tracked step.
    """

    candidate: TrainConfig
    incumbent: TrainConfig
    samples: dict[TrainConfig, list[float]]  # samples/s of each side's timed steps in the trial
    fresh: bool = True  # the first step runs where the loop is (the candidate): its tracked step

    def next_config(self, current: TrainConfig) -> TrainConfig:
        """The side the next step runs: the candidate's first (tracked) step, then the side with
        fewer timed steps, alternating on a tie.

        Args:
            current: The configuration the loop is on.

        Returns:
            The configuration of the next step.
        """
        if self.fresh:
            self.fresh = False
            return current
        a, b = self.samples[self.candidate], self.samples[self.incumbent]
        if len(a) != len(b):
            return self.candidate if len(a) < len(b) else self.incumbent
        return self.incumbent if current == self.candidate else self.candidate

    def verdict(self, step: int, *, ledger: Ledger, objective: ObjectiveName) -> tuple[TrialOutcome, Change | None]:
        """The trial's verdict after a step of its candidate (see :meth:`Decider.trial_over`).

        Args:
            step: Optimizer steps done.
            ledger: The run's measurements (each side judged at its record's peak).
            objective: Which measured value decides.

        Returns:
            ``("pending", None)``: more steps of each side; ``("kept", None)``: the candidate
            stays; ``("back", change)``: the change back to the incumbent.
        """
        fewest = min(len(v) for v in self.samples.values())
        if fewest < TUNING.paired_steps:
            return "pending", None
        value, timing = {}, {}
        for config, samples in self.samples.items():
            value[config] = ledger.side(config, step, samples).under(objective)
            timing[config] = Timing(rates=tuple(samples))
        here, there = value[self.candidate], value[self.incumbent]
        a, b = timing[self.candidate], timing[self.incumbent]
        scale_a, scale_b = here / max(a.median, 1e-12), there / max(b.median, 1e-12)
        if separated(a, b, scale_a=scale_a, scale_b=scale_b, margin=TUNING.margin):
            return "kept", None
        if fewest < TUNING.max_paired_steps and here > (1 + TUNING.margin) * there:
            return "pending", None  # above the margin, but within the spread: more steps of each side (bounded)
        counts = f"{len(self.samples[self.candidate])} steps against {len(self.samples[self.incumbent])}"
        reason = (
            f"side by side ({counts}): measured {format_value(here, objective)}, not {TUNING.margin:.0%} "
            f"above the {there:.1f} "
            "of the configuration it replaced beyond their spread: back to it"
        )
        back = Change(
            step=step,
            source="measured",
            before=self.candidate,
            after=self.incumbent,
            applied=True,
            reason=reason,
            measured_bytes=ledger.gate.measured.get(self.incumbent),
        )
        return "back", back

    def to_dict(self) -> dict[str, Any]:
        """The trial as plain values (the ``trial`` entry of :meth:`Decider.state_dict`)."""
        return {
            "candidate": self.candidate.to_dict(),
            "incumbent": self.incumbent.to_dict(),
            "fresh": self.fresh,
            "samples": [{"config": c.to_dict(), "samples": list(v)} for c, v in self.samples.items()],
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> SideBySide:
        """The trial :meth:`to_dict` saved."""
        from autotune.config import TrainConfig

        return cls(
            candidate=TrainConfig.from_dict(state["candidate"]),
            incumbent=TrainConfig.from_dict(state["incumbent"]),
            samples={TrainConfig.from_dict(s["config"]): list(s["samples"]) for s in state["samples"]},
            fresh=state["fresh"],
        )
