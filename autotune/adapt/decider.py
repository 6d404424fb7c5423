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
   it replaced, measured side by side (:class:`SideBySide`, steps alternating) where the loop can
   switch every step, else above the best configuration measured so far, when its median is
   trusted (:meth:`Decider._back_if_worse`); otherwise back to that one;
3. otherwise asks the decision source (or the ``adapt_batch`` rule) and refuses what was measured
   before and is not better, what the loop cannot take (``takes``), and what the budget gate
   does not admit, each refusal logged once.

Every decision, applied or refused, is in :attr:`Decider.history`.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.adapt.batch import grow_batch
from autotune.adapt.records import Change, ConfigRecord
from autotune.adapt.sources import DecisionSource, Observation, Proposal, RunContext
from autotune.knobs import smallest_micro_batch
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, format_value, score
from autotune.measurement.sidebyside import Timing, separated
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from autotune.adapt.compiled import Recompiles
    from autotune.config import TrainConfig
    from autotune.memory.gate import BudgetGate, Verdict

__all__ = ["Decider", "SideBySide"]

# The margins and step counts are autotune.tuning.TUNING's (margin, trusted_steps, paired_steps,
# max_paired_steps): a trial's sides' spreads are median absolute deviations
# (:func:`autotune.measurement.sidebyside.separated`).


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
            configuration it replaced (:class:`SideBySide`); otherwise one stint after the other.
        min_micro_batch: The smallest micro-batch a proposal may split a rank's batch into
            (:attr:`autotune.Workload.micro_batch_floor`; None: no accumulation); a smaller one
            keeps the current split, the rest of the proposal stands.
        micro_why: Why (:attr:`autotune.Workload.micro_batch_reason`), for the history.
        objective: Which measured configuration within the budget is better: the most samples/s
            per GiB of peak (``"per-gib"``) or the most samples/s (``"throughput"``).
        recompiles: On a user's compiled model, its recompiles (:mod:`autotune.adapt.compiled`):
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
        self._takes = takes
        self.paired = paired and recompiles is None
        self.trial: SideBySide | None = None  # the side-by-side trial under way
        self.history: list[Change] = []
        self.judged: dict[TrainConfig, ConfigRecord] = {}
        self.previous: TrainConfig | None = None  # the configuration the last change left
        self._on_trial = False  # the current config came from a proposal, and the one it replaced may be better
        self._refused: set[TrainConfig] = set()
        self._recent: list[float] = []  # samples/s of the timed steps since the last change
        self._timed: dict[TrainConfig, list[float]] = {}  # the same, of every stint under each config
        self._begun_at = 0

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
        self._recent.append(throughput)
        self._timed.setdefault(config, []).append(throughput)
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
        trial = self.trial
        if trial is None:
            return None
        if trial.fresh:
            trial.fresh = False
            return current
        a, b = trial.samples[trial.candidate], trial.samples[trial.incumbent]
        if len(a) != len(b):
            return trial.candidate if len(a) < len(b) else trial.incumbent
        return trial.incumbent if current == trial.candidate else trial.candidate

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
        fewest = min(len(v) for v in trial.samples.values())
        if fewest < TUNING.paired_steps:
            return None
        value, timing = {}, {}
        for config, samples in trial.samples.items():
            record = self._record(config, step, samples=self._timed[config], b_noise=None)
            peak = record.score.peak_bytes if record is not None else self.gate.budget
            side = score(
                throughput=statistics.median(samples),
                peak_bytes=peak,
                batch_size=config.effective_batch_size,
                base_batch_size=self.base_batch_size,
                noise_scale=None,
                batch_is_knob=False,
            )
            value[config], timing[config] = side.under(self.objective), Timing(rates=tuple(samples))
        here, there = value[trial.candidate], value[trial.incumbent]
        a, b = timing[trial.candidate], timing[trial.incumbent]
        scale_a, scale_b = here / max(a.median, 1e-12), there / max(b.median, 1e-12)
        if separated(a, b, scale_a=scale_a, scale_b=scale_b, margin=TUNING.margin):
            self.trial = None
            self._recent = list(trial.samples[trial.candidate])  # what the next observation reads
            return None
        if fewest < TUNING.max_paired_steps and here > (1 + TUNING.margin) * there:
            return None  # above the margin, but within the spread: more steps of each side (bounded)
        self.trial = None
        counts = f"{len(trial.samples[trial.candidate])} steps against {len(trial.samples[trial.incumbent])}"
        reason = (
            f"side by side ({counts}): measured {format_value(here, self.objective)}, not {TUNING.margin:.0%} "
            f"above the {there:.1f} "
            "of the configuration it replaced beyond their spread: back to it"
        )
        return Change(
            step=step,
            source="measured",
            before=trial.candidate,
            after=trial.incumbent,
            applied=True,
            reason=reason,
            measured_bytes=self.gate.measured.get(trial.incumbent),
        )

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
        peak = self.gate.measured.get(config)
        if peak is None:
            predicted = self.gate.predict(config)
            peak = predicted[0] if predicted is not None else self.gate.budget
        throughput = statistics.median(self._recent) if self._recent else 0.0
        return Observation(
            step=step, config=config, throughput=throughput, peak_bytes=peak, b_noise=b_noise, losses=losses
        )

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
        self._judge(obs)
        back = self._back_if_worse(obs)
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
        self.previous, self._recent = change.before, []
        proposed = change.source != "measured"
        same_batch = change.after.effective_batch_size == change.before.effective_batch_size  # else: goodput
        if proposed and self.paired and same_batch and self._trusted(change.before) is not None:
            samples: dict[TrainConfig, list[float]] = {change.after: [], change.before: []}
            self.trial = SideBySide(candidate=change.after, incumbent=change.before, samples=samples)
            self._on_trial = False
        else:
            self._on_trial = proposed

    def guarded(self, change: Change) -> None:
        """Log the shape guard's change, made before a long batch; a trial under way ends.

        A trial's sides were gated at a smaller batch (:mod:`autotune.adapt.shape_guard`).

        Args:
            change: The change the guard made.
        """
        self.history.append(change)
        if change.applied:
            self.previous, self.trial, self._recent = change.after, None, []

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
        self._recent, self.trial = [], None
        return self.previous

    # ---- resume ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every decision and measurement so far, as plain values (see :meth:`Adaptive.state_dict`).

        Returns:
            A dict for :meth:`load_state_dict`.
        """
        trial = self.trial
        return {
            "history": [c.to_dict() for c in self.history],
            "judged": [r.to_dict() for r in self.judged.values()],
            "previous": None if self.previous is None else self.previous.to_dict(),
            "trial": None
            if trial is None
            else {
                "candidate": trial.candidate.to_dict(),
                "incumbent": trial.incumbent.to_dict(),
                "fresh": trial.fresh,
                "samples": [{"config": c.to_dict(), "samples": list(v)} for c, v in trial.samples.items()],
            },
            "on_trial": self._on_trial,
            "refused": [c.to_dict() for c in _in_order(self._refused)],
            "recent": list(self._recent),
            "timed": [{"config": c.to_dict(), "samples": list(v)} for c, v in self._timed.items()],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: nothing measured or refused there is explored again.

        Args:
            state: What :meth:`state_dict` returned.
        """
        from autotune.config import TrainConfig

        self.history = [Change.from_dict(c) for c in state["history"]]
        records = [ConfigRecord.from_dict(r) for r in state["judged"]]
        self.judged = {r.config: r for r in records}
        self.previous = None if state["previous"] is None else TrainConfig.from_dict(state["previous"])
        trial = state["trial"]
        self.trial = (
            None
            if trial is None
            else SideBySide(
                candidate=TrainConfig.from_dict(trial["candidate"]),
                incumbent=TrainConfig.from_dict(trial["incumbent"]),
                samples={TrainConfig.from_dict(s["config"]): list(s["samples"]) for s in trial["samples"]},
                fresh=trial["fresh"],
            )
        )
        self._on_trial = state["on_trial"]
        self._refused = {TrainConfig.from_dict(c) for c in state["refused"]}
        self._recent = list(state["recent"])
        self._timed = {TrainConfig.from_dict(t["config"]): list(t["samples"]) for t in state["timed"]}
        self._begun_at = len(self.history)

    @property
    def best(self) -> ConfigRecord | None:
        """The judged configuration within the budget with the most objective per GiB of peak, or
        the most objective under the ``throughput`` objective."""
        fits = [r for r in self.judged.values() if r.score.peak_bytes <= self.gate.budget]
        return max(fits, key=lambda r: r.score.under(self.objective), default=None)

    # ---- the rules -----------------------------------------------------------------------------------

    def _admit(self, step: int, current: TrainConfig, proposal: Proposal, source: str) -> Change | None:
        """``proposal`` as a change from ``current`` the loop can make, or None (refusals logged once)."""
        floored = self._floored(current, proposal.config)
        target = floored if self._takes is None else self._takes(current, floored)
        if target == current:
            return None
        known, here = self._trusted(target), self._trusted(current)
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
            self._refuse_once(refused)
            return None
        recompile = self._recompile_refusal(current, target)
        if recompile is not None:
            reason = f"{proposal.reason}; {recompile}"
            self._refuse_once(
                Change(step=step, source=source, before=current, after=target, applied=False, reason=reason)
            )
            return None
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
            self._refuse_once(change)
            return None
        return change

    def _floored(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
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

    def _refuse_once(self, change: Change) -> None:
        if change.after not in self._refused:
            self._refused.add(change.after)
            self.history.append(change)

    def _back_if_worse(self, obs: Observation) -> Change | None:
        """Measurement overrules the decision source: a configuration a proposal brought is kept
        only if it measures more than the margin above the best configuration measured so far
        (within the budget); otherwise the run goes back to that best, and the source's later
        proposals of it are refused (:meth:`_admit`). The best, not only the one it replaced: a
        source that keeps walking one way (the pretrained policy toward less memory: 4x8 ->
        2x16 -> 1x32 on hf-gpt2, each step a little worse) would otherwise be taken back one step
        only; and more than the margin above it: a configuration of about equal worth that
        stayed would, on a machine whose timings wander by 10%, let the run drift from
        neighbour to neighbour on noise. Each trial is decided once, at the first decision its
        throughput is a median of enough timed steps: the run then loses against its best only
        for the ``decide_every`` steps it takes to find out, and does not go back and forth on
        re-measures."""
        if not self._on_trial:  # the run is where measurement put it: no going back and forth on noise
            return None
        here = self._trusted(obs.config)
        if here is None:  # not enough timed steps yet: the trial goes on
            return None
        self._on_trial = False
        others = [
            r
            for c, r in self.judged.items()
            if c != obs.config and r.score.peak_bytes <= self.gate.budget and self._trusted(c) is not None
        ]
        objective = self.objective
        best = max(others, key=lambda r: r.score.under(objective), default=None)
        if best is None or here.score.under(objective) > (1 + TUNING.margin) * best.score.under(objective):
            return None
        which = "the configuration it replaced" if best.config == self.previous else "the best measured configuration"
        reason = (
            f"measured {format_value(here.score.under(objective), objective)}, not {TUNING.margin:.0%} above the "
            f"{best.score.under(objective):.1f} of {which}: back to it"
        )
        why = self._recompile_refusal(obs.config, best.config)
        if why is not None:  # on a compiled model going back must pay its recompile back too
            self.history.append(
                Change(
                    step=obs.step,
                    source="measured",
                    before=obs.config,
                    after=best.config,
                    applied=False,
                    reason=f"{reason}; {why}",
                )
            )
            return None
        return Change(
            step=obs.step,
            source="measured",
            before=obs.config,
            after=best.config,
            applied=True,
            reason=reason,
            measured_bytes=best.score.peak_bytes,
        )

    def _recompile_refusal(self, current: TrainConfig, target: TrainConfig) -> str | None:
        """On a compiled model, why going from ``current`` to ``target`` does not pay its recompile
        (:meth:`Recompiles.refusal`: the cap, or the seconds saved per step where both were
        measured, over the horizon, against the measured recompile seconds); else None."""
        if self.recompiles is None:
            return None
        here, there = self._trusted(current), self._trusted(target)
        saved = None
        if here is not None and there is not None and here.score.throughput and there.score.throughput:
            saved = (
                current.effective_batch_size / here.score.throughput
                - target.effective_batch_size / there.score.throughput
            )
        return self.recompiles.refusal(current, target, saved=saved)

    def _trusted(self, config: TrainConfig) -> ConfigRecord | None:
        """``config``'s record if its throughput is a median of enough timed steps to act on."""
        record = self.judged.get(config)
        return record if record is not None and record.timed_steps >= TUNING.trusted_steps else None

    def _judge(self, obs: Observation) -> None:
        """Record ``obs.config``'s objective once its peak is known (measured by a tracked step,
        or a verified prediction where the loop tracks none) and its steps timed: the median
        throughput of its timed steps over every stint the run spent in it, so that the
        configuration the run keeps returning to is not judged by its latest stint alone (on a
        shared machine one stint can time 20% off another, and a latest slow one would make a
        configuration left long ago look like the best)."""
        self._record(obs.config, obs.step, samples=self._timed.get(obs.config, []), b_noise=obs.b_noise)

    def _record(
        self, config: TrainConfig, step: int, *, samples: list[float], b_noise: float | None
    ) -> ConfigRecord | None:
        peak = self.gate.known_peak(config)
        if not samples or peak is None:
            return None
        judged = score(
            throughput=statistics.median(samples),
            peak_bytes=peak,
            batch_size=config.effective_batch_size,
            base_batch_size=self.base_batch_size,
            noise_scale=b_noise,
            batch_is_knob=self.adapt_batch,
        )
        # A config judged again keeps its place (dicts keep first insertion order).
        record = ConfigRecord(step=step, config=config, timed_steps=len(samples), noise_scale=b_noise, score=judged)
        self.judged[config] = record
        return record


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


def _in_order(configs: set[TrainConfig]) -> list[TrainConfig]:
    """A set of configurations in one order (a set's own depends on its history): equal states save equal."""
    return sorted(configs, key=lambda c: c.to_json())
