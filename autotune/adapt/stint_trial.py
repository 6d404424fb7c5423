"""A proposal on trial where the loop cannot measure it side by side: one stint after the other.

Where the loop can switch every step, a proposal is measured against the configuration it
replaced in alternating steps (:class:`~autotune.adapt.side_by_side.SideBySide`). Elsewhere (a
framework's loop, a compiled model) its configuration runs a stint of its own, and the
:class:`~autotune.adapt.decider.Decider` asks a :class:`StintTrial` at each decision whether the
run goes back (:meth:`StintTrial.verdict`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.adapt.ledger import Ledger
    from autotune.adapt.records import Change
    from autotune.adapt.rules import Rules
    from autotune.adapt.sources import Observation
    from autotune.config import TrainConfig

__all__ = ["StintTrial"]


class StintTrial:
    """Measurement overrules the decision source: a configuration a proposal brought is kept only
    if it measures more than the margin above the best configuration measured so far (within the
    budget); otherwise the run goes back to that best, and the source's later proposals of it are
    refused. The best, not only the one it replaced: a source that keeps walking one way (the
    pretrained policy toward less memory: 4x8 -> 2x16 -> 1x32 on hf-gpt2, each step a little
    worse) would otherwise be taken back one step only; and more than the margin above it: a
    configuration of about equal worth that stayed would, on a machine whose timings wander by
    10%, let the run drift from neighbour to neighbour on noise. Each trial is decided once, at
    the first decision its throughput is a median of enough timed steps: the run then loses
    against its best only for the ``decide_every`` steps it takes to find out, and does not go
    back and forth on re-measures.

    Args:
        ledger: The run's measurements (whether a configuration has enough timed steps).
        rules: The run's rules (:meth:`~autotune.adapt.rules.Rules.back_to_best`).

    Attributes:
        on: The configuration the run is on came from a proposal, and the one it replaced may be
            better (False: the run is where measurement put it).
    """

    def __init__(self, *, ledger: Ledger, rules: Rules) -> None:
        self.ledger, self.rules = ledger, rules
        self.on = False

    def verdict(
        self,
        obs: Observation,
        *,
        previous: TrainConfig | None,
        log: Callable[[Change], None],
    ) -> Change | None:
        """The trial's verdict at a decision, once ``obs.config`` is trusted (the trial then ends).

        Args:
            obs: The run since the last decision.
            previous: The configuration the last change left (named in the reason).
            log: Told the change back where it is refused: a compiled model's recompile would
                not pay it back (the run stays).

        Returns:
            The change back to the best (``applied``); None while no trial is on, while it goes
            on (not enough timed steps yet), where the configuration stays, and where the change
            back is refused.
        """
        if not self.on:  # the run is where measurement put it: no going back and forth on noise
            return None
        if self.ledger.trusted(obs.config) is None:  # not enough timed steps yet: the trial goes on
            return None
        self.on = False
        back = self.rules.back_to_best(obs, previous)
        if back is not None and not back.applied:
            log(back)
            return None
        return back
