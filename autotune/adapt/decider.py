"""The decisions of an adaptive run, whoever runs its steps.

One implementation for every front-end (:class:`autotune.adapt.Adaptive`, the framework
callbacks of :mod:`autotune.integrations`), driven by :class:`autotune.adapt.controller.Controller`
alone, in this order (the protocol, as code: the controller's ``begin``, ``before_step`` and
``after_step``):

* :meth:`Decider.begin` once, then :meth:`Decider.started` with the change it made;
* before each step, :meth:`Decider.trial_config` (the side of a side-by-side trial to run);
* after each step, :meth:`Decider.timed` (a timed step), then either :meth:`Decider.revert` (a step
  measured over the budget) or :meth:`Decider.on_step`, whose change the loop makes and reports
  with :meth:`Decider.moved` (or :meth:`Decider.refuse`, if it could not after all).

:meth:`Decider.on_step` ends a side-by-side trial (:meth:`Decider.trial_over`) while one lasts,
else, at a decision, judges and decides (:meth:`Decider.decide`):

1. judges the configuration the run is on (objective per GiB of its known peak,
   :func:`autotune.measurement.objective.score`, over the median of every timed step it ran; under
   the ``throughput`` objective the objective itself, within the budget: :meth:`Score.under`);
2. decides a trial once: kept only if it measures more than the margin above the configuration
   it replaced, measured side by side (:class:`~autotune.adapt.side_by_side.SideBySide`, steps
   alternating) where the loop can switch every step, else above the best configuration
   measured so far, when its median is trusted (:class:`~autotune.adapt.stint_trial.StintTrial`,
   :mod:`autotune.adapt.rules`); otherwise back to that one;
3. otherwise asks the decision source (or the ``adapt_batch`` rule) and refuses what was measured
   before and is not better, what the loop cannot take (``takes``), and what the budget gate
   does not admit, each refusal logged once.

Every decision, applied or refused, is in :attr:`Decider.history`.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from autotune.adapt.batch import grow_batch
from autotune.adapt.ledger import Ledger
from autotune.adapt.records import Change, ConfigRecord
from autotune.adapt.rules import Rules
from autotune.adapt.side_by_side import SideBySide
from autotune.adapt.sources import DecisionSource, Observation, Proposal, RunContext
from autotune.adapt.stint_trial import StintTrial
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from autotune.adapt.recompiles import Recompiles
    from autotune.config import TrainConfig
    from autotune.memory.gate import BudgetGate

__all__ = ["Decider", "SideBySide"]

# The margins and step counts are autotune.tuning.TUNING's (margin, trusted_steps, paired_steps,
# max_paired_steps): a trial's sides' spreads are median absolute deviations
# (:func:`autotune.measurement.sidebyside.separated`).


class Decider:
    """What an adaptive run decides, and its record of why.

    Args:
        source: Where proposals come from (None: the run never moves but for the budget).
        gate: The budget gate every configuration passes; its ``budget`` is the run's.
        base_batch_size: The user's effective batch.
        adapt_batch: Let the batch grow with the gradient noise scale (:func:`autotune.adapt.batch.grow_batch`).
        min_efficiency: With ``adapt_batch``: the fraction, in (0, 1], of the user's per-sample
            progress a doubled batch must keep (default 1.0).
        max_batch_size: With ``adapt_batch``: the largest effective batch (default: the user's).
        takes: ``takes(current, proposed)``: what of ``proposed`` the loop can run from
            ``current`` (a framework's loop: the per-block knobs, the split only at an epoch
            boundary); default: all of it.
        paired: The loop can switch configuration every step cheaply (the local loop: block
            wrappers and the micro-batch drawn): a proposal is then measured side by side with the
            configuration it replaced (:class:`~autotune.adapt.side_by_side.SideBySide`); otherwise
            one stint after the other.
        min_micro_batch: The smallest micro-batch a proposal may split a rank's batch into
            (:attr:`autotune.Workload.micro_batch_floor`; None: no accumulation); a smaller one
            keeps the current split, the rest of the proposal stands.
        micro_why: Why (:attr:`autotune.Workload.micro_batch_reason`), for the history.
        objective: Which measured configuration within the budget is better: the most samples/s
            per GiB of peak (``"per-gib"``) or the most samples/s (``"throughput"``).
        recompiles: On a user's compiled model, its recompiles (:mod:`autotune.adapt.recompiles`):
            a change of block knobs past the cap, or one whose measured gain does not pay its
            measured recompile back, is refused; no side-by-side trials (each switch would
            reinstall the block wrappers).
    """

    def __init__(
        self,
        *,
        source: DecisionSource | None,
        gate: BudgetGate,
        base_batch_size: int,
        adapt_batch: bool = False,
        min_efficiency: float = 1.0,
        max_batch_size: int | None = None,
        takes: Callable[[TrainConfig, TrainConfig], TrainConfig] | None = None,
        paired: bool = False,
        min_micro_batch: int | None = 1,
        micro_why: str = "",
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        recompiles: Recompiles | None = None,
    ) -> None:
        self.source = source
        self.recompiles = recompiles
        self.objective = objective
        self.min_micro_batch, self.micro_why = min_micro_batch, micro_why
        self.gate = gate
        self.base_batch_size = base_batch_size
        self.adapt_batch, self.min_efficiency = adapt_batch, min_efficiency
        self.max_batch_size = max_batch_size or base_batch_size
        self.paired = paired and recompiles is None
        self.ledger = Ledger(gate=gate, base_batch_size=base_batch_size, adapt_batch=adapt_batch)
        self.rules = Rules(
            gate=gate,
            ledger=self.ledger,
            objective=objective,
            takes=takes,
            min_micro_batch=min_micro_batch,
            micro_why=micro_why,
            recompiles=recompiles,
        )
        self.trial: SideBySide | None = None  # the side-by-side trial under way
        self.history: list[Change] = []
        self.previous: TrainConfig | None = None  # the configuration the last change left
        self.stint = StintTrial(ledger=self.ledger, rules=self.rules)  # a proposal's trial, not side by side
        self._refused: set[TrainConfig] = set()
        self._begun_at = 0

    @property
    def judged(self) -> dict[TrainConfig, ConfigRecord]:
        """Every configuration judged so far, by configuration, in the order first judged."""
        return self.ledger.judged

    # ---- before the first step ---------------------------------------------------------------------

    def begin(
        self, *, start: TrainConfig, default: TrainConfig, why: str = "", context: RunContext | None = None
    ) -> Change | None:
        """Start the source and decide where the run starts.

        With a source, ``context`` starts it, and its plan (:meth:`DecisionSource.plan`) moves
        the run further if the loop can take it and the gate admits it; a refused plan is logged.
        Report the change made with :meth:`started` (or, where it waits for the loop, :meth:`moved`).

        Args:
            start: Where the budget puts the run.
            default: The run's own configuration.
            why: How the budget got from ``default`` to ``start`` (empty if it is the default).
            context: What the source is told of the run (its ``start`` is ``start``); None
                without a source.

        Returns:
            The change to make before the first step, or None (stay at ``start``).
        """
        self.previous, self._begun_at = start, len(self.history)
        change = None
        if start != default:
            change = Change(step=0, source="budget", before=default, after=start, applied=True, reason=why)
        if self.source is None:
            return change
        assert context is not None and context.start == start, "a source starts from the run's context"
        self.source.start(context)
        plan = self.source.plan(context)
        if plan is None:
            return change
        planned = self._admit(0, start, plan, self.source.name)
        if planned is None:
            return change
        return dataclasses.replace(planned, before=default)

    def started(self, change: Change, seconds: float = 0.0) -> None:
        """Record that the run starts at ``change.after`` (logged before any refusal :meth:`begin` logged).

        Args:
            change: The change :meth:`begin` returned, as the loop made it.
            seconds: Wall time the reconfiguration took.
        """
        self.history.insert(self._begun_at, dataclasses.replace(change, seconds=seconds))
        self.previous = change.after

    # ---- while the run trains ----------------------------------------------------------------------

    def timed(self, config: TrainConfig, throughput: float) -> None:
        """Record one timed step of ``config``.

        Args:
            config: The configuration it ran under.
            throughput: Its samples/s. Not of a tracked step (nor, in a framework's loop, of the
                first after a change, which pays for it).
        """
        self.ledger.add(config, throughput)
        if self.trial is not None and config in self.trial.samples:
            self.trial.samples[config].append(throughput)

    def trial_config(self, current: TrainConfig) -> TrainConfig | None:
        """The configuration the next step runs under while a side-by-side trial lasts.

        Args:
            current: The configuration the loop is on.

        Returns:
            The candidate's first (tracked) step, then the side with fewer timed steps,
            alternating on a tie; None without a trial.
        """
        return None if self.trial is None else self.trial.next_config(current)

    def trial_over(self, step: int, current: TrainConfig) -> Change | None:
        """A side-by-side trial's verdict, once it has one (called after each step).

        Once both sides have ``TUNING.paired_steps`` timed steps and the last ran the candidate,
        the candidate is kept if its median value by the objective (per GiB, or samples/s) is
        more than the margin above the incumbent's and the gap is larger than their spreads; more
        steps run while it is above the margin but within the spreads (up to
        ``TUNING.max_paired_steps`` each).

        Args:
            step: Optimizer steps done.
            current: The configuration the last step ran under.

        Returns:
            The change back to the incumbent (make it, then :meth:`moved`), or None: kept, or
            no verdict yet.
        """
        trial = self.trial
        if trial is None or current != trial.candidate:
            return None
        outcome, back = trial.verdict(step, ledger=self.ledger, objective=self.objective)
        if outcome == "kept":
            self.trial = None
            self.ledger.recent = list(trial.samples[trial.candidate])  # what the next observation reads
        elif outcome == "back":
            self.trial = None
        return back

    def on_step(
        self, step: int, config: TrainConfig, *, due: bool, observe: Callable[[], Observation]
    ) -> Change | None:
        """The change to make after a step (its timing already reported), if any.

        Args:
            step: Optimizer steps done.
            config: The configuration the step ran under.
            due: Whether a decision is due at this step.
            observe: Builds the observation (called only when a decision is made: it reads the
                run's statistics).

        Returns:
            A side-by-side trial's verdict while one lasts (no decision meanwhile); else, if a
            decision is ``due``, :meth:`decide`'s; else None.
        """
        if self.trial is not None:
            return self.trial_over(step, config)
        return self.decide(observe()) if due else None

    def observation(
        self, *, step: int, config: TrainConfig, b_noise: float | None, losses: tuple[float, ...]
    ) -> Observation:
        """The run as measured since the last change.

        Args:
            step: Optimizer steps done.
            config: The configuration the run is on.
            b_noise: The gradient noise scale, where the loop estimates it.
            losses: The recent losses.

        Returns:
            The observation: ``config``'s measured peak, else its prediction, and the median
            throughput of the timed steps since the last change.
        """
        return self.ledger.observation(step=step, config=config, b_noise=b_noise, losses=losses)

    def decide(self, obs: Observation) -> Change | None:
        """Judge the configuration the run is on, then decide.

        Refusals are logged here, once per configuration (a fixed source proposes the same one
        at every decision).

        Args:
            obs: The run since the last decision.

        Returns:
            The change to make now (``applied``: the loop makes it, then calls :meth:`moved`), or
            None.
        """
        self.ledger.judge(obs)
        back = self.stint.verdict(obs, previous=self.previous, log=self.history.append)
        if back is not None:
            return back
        proposal: Proposal | None = None
        source = "adapt_batch"
        if self.adapt_batch:
            proposal = grow_batch(
                obs,
                base_batch_size=self.base_batch_size,
                min_efficiency=self.min_efficiency,
                max_batch_size=self.max_batch_size,
            )
        if proposal is None and self.source is not None:
            proposal, source = self.source.propose(obs), self.source.name
        if proposal is None:
            return None
        return self._admit(obs.step, obs.config, proposal, source)

    def moved(self, change: Change, seconds: float = 0.0) -> None:
        """Record that the loop made ``change``; a proposal starts a side-by-side trial where it can.

        Args:
            change: The change made.
            seconds: What the reconfiguration itself took.
        """
        self.history.append(dataclasses.replace(change, seconds=seconds))
        self.previous, self.ledger.recent = change.before, []
        proposed = change.source != "measured"
        same_batch = change.after.effective_batch_size == change.before.effective_batch_size  # else: goodput
        if proposed and self.paired and same_batch and self.ledger.trusted(change.before) is not None:
            samples: dict[TrainConfig, list[float]] = {change.after: [], change.before: []}
            self.trial = SideBySide(candidate=change.after, incumbent=change.before, samples=samples)
            self.stint.on = False
        else:
            self.stint.on = proposed

    def guarded(self, change: Change) -> None:
        """Log the shape guard's change, made before a long batch; a trial under way ends.

        A trial's sides were gated at a smaller batch (:mod:`autotune.adapt.shape_guard`).

        Args:
            change: The change the guard made.
        """
        self.history.append(change)
        if change.applied:
            self.previous, self.trial, self.ledger.recent = change.after, None, []

    def refuse(self, change: Change) -> None:
        """Log a change :meth:`decide` returned that the loop could not make after all.

        Args:
            change: The change; its reason says why.
        """
        self.history.append(dataclasses.replace(change, applied=False))
        self._refused.add(change.after)

    def note(self, change: Change) -> None:
        """Log a change decided outside the decider's rules, for the history.

        Args:
            change: A resume under a smaller budget, or what a framework forbids.
        """
        self.history.append(change)

    def revert(self, config: TrainConfig, peak: int, step: int) -> TrainConfig:
        """Leave ``config``: a tracked step measured it over the budget (its prediction was off).

        Args:
            config: The configuration measured over the budget.
            peak: Its measured peak bytes.
            step: Optimizer steps done.

        Returns:
            The configuration to go back to (the one before it); the revert is logged.
        """
        assert self.previous is not None, "begin() first"
        reason = f"measured {peak} B > budget {self.gate.budget} B: back to {self.previous.describe()}"
        self.history.append(
            Change(
                step=step,
                source="budget",
                before=config,
                after=config,
                applied=False,
                reverted=True,
                reason=reason,
                measured_bytes=peak,
            )
        )
        self._refused.add(config)
        self.ledger.recent, self.trial = [], None
        return self.previous

    # ---- resume ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every decision and measurement so far, as plain values (see :meth:`Adaptive.state_dict`).

        Returns:
            A dict for :meth:`load_state_dict`.
        """
        ledger = self.ledger
        return {
            "history": [c.to_dict() for c in self.history],
            "judged": [r.to_dict() for r in ledger.judged.values()],
            "previous": None if self.previous is None else self.previous.to_dict(),
            "trial": None if self.trial is None else self.trial.to_dict(),
            "on_trial": self.stint.on,
            "refused": [c.to_dict() for c in _in_order(self._refused)],
            "recent": list(ledger.recent),
            "timed": [{"config": c.to_dict(), "samples": list(v)} for c, v in ledger.timed.items()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: nothing measured or refused there is explored again.

        Args:
            state: What :meth:`state_dict` returned.
        """
        from autotune.config import TrainConfig

        self.history = [Change.from_dict(c) for c in state["history"]]
        self.ledger.load(state)
        self.previous = None if state["previous"] is None else TrainConfig.from_dict(state["previous"])
        self.trial = None if state["trial"] is None else SideBySide.from_dict(state["trial"])
        self.stint.on = state["on_trial"]
        self._refused = {TrainConfig.from_dict(c) for c in state["refused"]}
        self._begun_at = len(self.history)

    @property
    def best(self) -> ConfigRecord | None:
        """The judged configuration within the budget with the most objective per GiB of peak, or
        the most objective under the ``throughput`` objective."""
        return self.ledger.best(self.objective)

    # ---- the rules (autotune.adapt.rules): what they decide, logged ---------------------------------

    def _admit(self, step: int, current: TrainConfig, proposal: Proposal, source: str) -> Change | None:
        """``proposal`` as a change from ``current`` the loop can make, or None (refusals logged once)."""
        change, refused = self.rules.admit(step, current, proposal, source)
        if refused is not None:
            self._refuse_once(refused)
        return change

    def _refuse_once(self, change: Change) -> None:
        if change.after not in self._refused:
            self._refused.add(change.after)
            self.history.append(change)


def _in_order(configs: set[TrainConfig]) -> list[TrainConfig]:
    """A set of configurations in one order (a set's own depends on its history): equal states save equal."""
    return sorted(configs, key=lambda c: c.to_json())
