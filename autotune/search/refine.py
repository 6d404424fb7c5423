"""Local refinement: a study's last trials measure the untried neighbours of its best configuration.

A short study gives its sampler too few trials to model the space. Optuna's ``TPESampler`` draws
its first ``n_startup_trials`` (10) at random and counts the baselines and the policy's proposal
among them, so a 12-trial study is three fixed points, seven random ones and two of TPE: a random
point rarely lands next to the best one, and the best configuration's neighbour (the same
precision and recompute at the next micro-batch, say) goes unmeasured although it is better (the
picks benchmark on lstm-lm, docs/benchmark-log.md). TPE may also propose a configuration it has
measured, and that trial teaches the study nothing.

So the study ends with a greedy hill-climb: its last :func:`refine_trials` trials, and the trial
after any that repeated a configuration, measure one *neighbour* of the incumbent (the feasible
trial best by the study's objective so far: per GiB, or samples/s within the budget,
:func:`autotune.search.spec.objective_of`): one knob one step away
(:meth:`~autotune.search.space.SearchSpace.neighbours`, THE neighbourhood
:func:`autotune.knobs.neighbours` through the study's space), the
first not yet tried (waiting or running included) that the memory model admits. A neighbour that
measures better becomes the incumbent of the next step, and the move that reached it is tried
again first from there (:func:`pattern_first`: one recomputed block fewer, then one fewer again).
They are enqueued through Optuna's own protocol (``Study.enqueue_trial`` from a trial callback,
marked ``refined_from``), so the sampler,
the dashboard, ``autotune best``, resumed studies and other workers see ordinary trials, and the
finalists' re-timing compares them with the rest.

Under load a single stint can flatter the incumbent, and a study then refines around a trial its
neighbours would beat when timed beside it. So a refinement trial that ran within the
budget is timed again *beside* the incumbent it was refined from (``duel``: the finalists'
side-by-side re-timing, for two), and the one it shows worse is marked ``beaten_by`` the other
(and ``beaten_decided`` False when the two were within each other's spread): the incumbent is the
best among trials no side-by-side timing beat, a duel's winner ranked at least as high as the
trial it beat (:func:`autotune.search.finalists.standing`: its first stint, minutes from the
others', must not drop it behind a trial only the loser was compared with). Cost: the
two configurations' warm-up and up to 6 rounds of 2 steps each, for each refinement trial but the
study's last (whose finalists are re-timed anyway): 2 of a 12-trial study.

Where the climb starts decides where it ends, and the start is the best of single stints: run
twice, the same 12-trial study on hf-gpt2 refined from trial 8 in one run and from trial 6 in the
other (benchmarks/repeatability.py). So before its first refinement trial the study times its
best distinct trials so far side by side (the finalists' choice, ``duel`` for three), and every one
but the winner is marked beaten by it (:data:`REFINE_START` records it): the climb starts from the
winner. Cost: one more side-by-side timing of three per study.

A point that recomputes a block without lowering the memory model's verified peak by more than
that block's recompute costs is never proposed: the point recomputing one block fewer takes its
place (:func:`undominated`). Recomputing the block whose backward runs first (the last one) saves
next to nothing, since its recompute runs at once, while what it dropped would still be alive
(why ``torch.utils.checkpoint.checkpoint_sequential`` leaves its last segment alone). The
surface's straight-line peak cannot see this.

Moves that usually raise throughput come first: a larger micro-batch (more work per kernel launch
and optimizer step), fewer recomputed blocks, more low-precision blocks; then their reverses,
which lower the peak. The measurement decides; the order only decides which neighbour a short
study can afford to look at.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from autotune.knobs import Knobs
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, format_value
from autotune.measurement.sidebyside import verdict_words
from autotune.search.space import SearchSpace
from autotune.search.spec import objective_of
from autotune.search.surface import Estimate, fit_surface, ranked
from autotune.search.trial_record import ATTR, trial_record

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig
    from autotune.measurement.admission import Verdict
    from autotune.measurement.sidebyside import Retimed

__all__ = [
    "BEATEN_BY",
    "REFINED_FROM",
    "REFINE_START",
    "Refine",
    "pattern_first",
    "recompute_margin",
    "refine_trials",
    "undominated",
]

_P = TypeVar("_P")

#: The user attribute of a refinement trial: the incumbent trial it is a neighbour of.
REFINED_FROM = "refined_from"

#: The user attribute of a trial a side-by-side timing showed worse: the trial that beat it.
BEATEN_BY = ATTR.BEATEN_BY

#: The study's user attribute: the side-by-side timing of its best trials before the first
#: refinement trial (``trials``, ``winner``, ``decided``, ``rounds``; ``failed`` instead when it
#: could not run). Set once: a resumed study does not time its start again.
REFINE_START = "refine_start"

#: Compares configurations side by side: (configs, value scales) -> their re-timing.
Duel = Callable[[list["TrainConfig"], list[float]], "Retimed"]

#: The share of a study's trials spent refining at its end (a quarter: 3 of 12, 5 of 20).
REFINE_SHARE = 0.25


def refine_trials(trials: int) -> int:
    """How many of a study's ``trials`` refine its incumbent (a quarter, rounded; at least one
    from two trials on)."""
    return 0 if trials < 2 else max(1, round(trials * REFINE_SHARE))


def pattern_first(candidates: list[_P], previous: _P | None, incumbent: _P) -> list[_P]:
    """``candidates`` (neighbours of ``incumbent``) with the one that repeats the move ``previous``
    -> ``incumbent`` first: after a move pays, the same move again (the pattern move of Hooke and
    Jeeves, "Direct search" solution of numerical and statistical problems, J. ACM 8(2), 1961).
    A move is the sign of the change of each integer field (a micro-batch doubled and the
    accumulation halved is one move), so it applies to Knobs and to the environments' levels."""
    if previous is None:
        return candidates
    move = _direction(previous, incumbent)
    for i, candidate in enumerate(candidates):
        if _direction(incumbent, candidate) == move:
            return [candidate, *candidates[:i], *candidates[i + 1 :]]
    return candidates


def _direction(a: Any, b: Any) -> tuple[int, ...]:
    signs = []
    for field in dataclasses.fields(a):
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, int) and isinstance(y, int):
            signs.append((y > x) - (y < x))
    return tuple(signs)


def recompute_margin(num_blocks: int) -> float:
    """The peak saving below which recomputing one more of ``num_blocks`` blocks cannot pay per
    GiB: half the step time it adds. Training costs about three forward passes (forward 2N,
    backward 4N FLOPs per token for N parameters: Kaplan et al., "Scaling laws for neural language
    models", 2020), so recomputing one of L blocks that hold the compute adds 1/(3L) of a step;
    halved, for blocks lighter than the average."""
    return 1.0 / (6 * num_blocks)


def undominated(knobs: Knobs, known_peak: Callable[[Knobs], int | None], num_blocks: int) -> Knobs:
    """``knobs`` with recomputed blocks dropped, one at a time, while the memory model's verified
    peak (``known_peak``) with one block fewer recomputed is at most :func:`recompute_margin`
    above it: such a block is recomputed for next to no memory. Where either peak is unknown,
    ``knobs`` stays."""
    margin = recompute_margin(num_blocks)
    while knobs.checkpoint_blocks > 0:
        fewer = dataclasses.replace(knobs, checkpoint_blocks=knobs.checkpoint_blocks - 1)
        here, there = known_peak(knobs), known_peak(fewer)
        if here is None or there is None or there > here * (1 + margin):
            break
        knobs = fewer
    return knobs


class Refine:
    """Optuna trial callback: enqueue the next refinement trial when the study is in its last
    :func:`refine_trials` trials, or the finished trial repeated a configuration, and no trial
    waits.

    Args:
        space: The study's space (decodes trials into knobs and back).
        trials: The study's total trials.
        admits: The admission rule on a point's memory prediction (:func:`autotune.search.budget.admits`;
            None: every point is tried).
        counted: How many trials count toward ``trials`` so far (the study's own count).
        note: Gets one line per enqueued refinement.
        known_peak: The memory model's verified peak of a point, or None where it has none; the
            surface ranks by these peaks where every candidate has one, else by its fitted peaks.
        budget_bytes: The study's memory budget: the surface proposes no point estimated above it.
        duel: Times a refinement trial beside the incumbent it was refined from (None: first
            measurements alone decide); a failure is noted and the first measurements stand.
    """

    def __init__(
        self,
        *,
        space: SearchSpace,
        trials: int,
        admits: Callable[[Knobs], Verdict] | None,
        counted: Callable[[optuna.Study], int],
        note: Callable[[str], None] | None = None,
        known_peak: Callable[[Knobs], int | None] | None = None,
        budget_bytes: int | None = None,
        duel: Duel | None = None,
    ) -> None:
        self.space = space
        self.trials = trials
        self.admits = admits
        self.counted = counted
        self.note = note
        self.known_peak = known_peak
        self.budget_bytes = budget_bytes
        self.duel = duel

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        from optuna.trial import TrialState

        done = self.counted(study)
        if done >= self.trials:
            return
        objective = objective_of(study)
        self._side_by_side(study, trial, objective)
        everything = study.get_trials(deepcopy=False)
        if any(t.state == TrialState.WAITING for t in everything):
            return  # baselines, a retried trial or a refinement come first
        tried: dict[Knobs, int] = {}  # every point tried, waiting or running included -> its first trial
        measured: dict[Knobs, int] = {}  # the points a finished trial measured (or pruned) before this one
        points: dict[int, Knobs] = {}  # trial number -> its point (decoded once)
        repeat_of = None
        for t in everything:
            knobs = self._knobs(t)
            if knobs is None:
                continue
            points[t.number] = knobs
            if t.number == trial.number:
                repeat_of = measured.get(knobs)
            elif t.state in (TrialState.COMPLETE, TrialState.PRUNED):
                measured.setdefault(knobs, t.number)
            tried.setdefault(knobs, t.number)
        if repeat_of is None and done < self.trials - refine_trials(self.trials):
            return
        if done >= self.trials - refine_trials(self.trials) and REFINE_START not in study.user_attrs:
            self._start(study, objective)
            everything = study.get_trials(deepcopy=False)
        best = self._incumbent(everything, points, objective)
        if best is None:
            return
        leader, incumbent, value = best
        number = leader.number
        came_from = leader.user_attrs.get(REFINED_FROM)  # a refinement that paid: its move goes first
        previous = points.get(came_from) if isinstance(came_from, int) else None
        why = "refining" if repeat_of is None else f"trial {trial.number} repeated trial {repeat_of}"
        jump = self._jump(everything, points, incumbent, value, tried, objective)
        if jump is not None:
            estimate, fitted = jump
            study.enqueue_trial(self.space.params(estimate.knobs), user_attrs={REFINED_FROM: number})
            if self.note is not None:
                estimated = format_value(estimate.under(objective), objective)
                self.note(
                    f"{why}: next {estimate.knobs.describe()}, estimated {estimated} by a surface "
                    f"through {fitted} trials, above trial {number} (the best so far)"
                )
            return
        candidates = pattern_first(self.space.neighbours(incumbent), previous, incumbent)
        for candidate in candidates:
            candidate = self._undominated(candidate)
            if candidate in tried or not self._admitted(candidate):
                continue
            study.enqueue_trial(self.space.params(candidate), user_attrs={REFINED_FROM: number})
            if self.note is not None:
                self.note(f"{why}: next {candidate.describe()}, a neighbour of trial {number} (the best so far)")
            return

    def _side_by_side(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, objective: ObjectiveName = DEFAULT_OBJECTIVE
    ) -> None:
        """A refinement trial within the budget against the incumbent it was refined from, timed
        side by side: the one shown worse is marked :data:`BEATEN_BY` the other."""
        from autotune.errors import MeasurementFailed
        from autotune.search.finalists import set_finished_trial_attrs, value_scale

        came_from = trial.user_attrs.get(REFINED_FROM)
        if self.duel is None or not isinstance(came_from, int):
            return
        incumbent = next((t for t in study.get_trials(deepcopy=False) if t.number == came_from), None)
        if incumbent is None:
            return
        pair = [trial_record(incumbent), trial_record(trial)]
        if not all(r.feasible and r.per_gib and r.throughput and r.config is not None for r in pair):
            return
        configs = [r.config for r in pair if r.config is not None]
        scales = [value_scale(r, objective) for r in pair]
        try:
            result = self.duel(configs, scales)
        except MeasurementFailed as e:
            if self.note is not None:
                why = f"timing trial {trial.number} beside trial {came_from} failed ({e})"
                self.note(f"{why}: first measurements stand")
            return
        winner, loser = (pair[0], pair[1]) if result.winner == 0 else (pair[1], pair[0])
        set_finished_trial_attrs(study, loser.number, {BEATEN_BY: winner.number, ATTR.BEATEN_DECIDED: result.decided})
        if self.note is not None:
            verdict = verdict_words(result.decided)
            self.note(
                f"side by side: trial {winner.number} beats trial {loser.number} ({verdict}, {result.rounds} rounds)"
            )

    def _start(self, study: optuna.Study, objective: ObjectiveName) -> None:
        """Before the first refinement trial: the best distinct trials so far (the finalists'
        choice, :func:`autotune.search.finalists.finalists`) timed side by side, and every one but
        the winner marked :data:`BEATEN_BY` it (decided: the winner ahead of it round by round)."""
        from autotune.errors import MeasurementFailed
        from autotune.measurement.sidebyside import separated_by_rounds
        from autotune.search.finalists import finalists, set_finished_trial_attrs, value_scale

        if self.duel is None:
            return
        chosen = finalists(tuple(trial_record(t) for t in study.get_trials(deepcopy=False)), objective)
        if len(chosen) < 2:
            return
        numbers = [r.number for r in chosen]
        scales = [value_scale(r, objective) for r in chosen]
        try:
            result = self.duel([r.config for r in chosen if r.config is not None], scales)
        except MeasurementFailed as e:
            study.set_user_attr(REFINE_START, {"trials": numbers, "failed": str(e)})
            if self.note is not None:
                self.note(f"timing trials {numbers} side by side failed ({e}): first measurements stand")
            return
        w = result.winner
        for i, r in enumerate(chosen):
            if i == w:
                continue
            ahead = separated_by_rounds(
                result.timings[w], result.timings[i], rounds=result.rounds, scale_a=scales[w], scale_b=scales[i]
            )
            set_finished_trial_attrs(study, r.number, {BEATEN_BY: numbers[w], ATTR.BEATEN_DECIDED: ahead})
        study.set_user_attr(
            REFINE_START,
            {"trials": numbers, "winner": numbers[w], "decided": result.decided, "rounds": result.rounds},
        )
        if self.note is not None:
            verdict = verdict_words(result.decided)
            self.note(
                f"before refining, trials {numbers} side by side: trial {numbers[w]} leads "
                f"({verdict}, {result.rounds} rounds)"
            )

    def _peak_bounds(self, knobs: Knobs) -> tuple[int | None, int | None]:
        """The verified peaks of ``knobs`` with every block and with no block recomputed: where the
        fitted peak of a point between them may lie."""
        assert self.known_peak is not None
        every = dataclasses.replace(knobs, checkpoint_blocks=self.space.num_blocks, selective_blocks=0)
        none = dataclasses.replace(knobs, checkpoint_blocks=0, selective_blocks=0)
        return self.known_peak(every), self.known_peak(none)

    def _undominated(self, knobs: Knobs) -> Knobs:
        return knobs if self.known_peak is None else undominated(knobs, self.known_peak, self.space.num_blocks)

    def _admitted(self, knobs: Knobs) -> bool:
        return self.admits is None or self.admits(knobs).admitted

    def _jump(
        self,
        trials: list[optuna.trial.FrozenTrial],
        points: dict[int, Knobs],
        incumbent: Knobs,
        incumbent_value: float | None,
        tried: dict[Knobs, int],
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
    ) -> tuple[Estimate, int] | None:
        """The untried admitted point a surface through the measured trials at the incumbent's
        batch, ranks, ZeRO stage, reduced precision and outer precision estimates best by
        ``objective``, if that beats the incumbent's measurement (:mod:`autotune.search.surface`),
        and how many trials it fitted."""
        if incumbent_value is None:
            return None
        measured = []
        for t in trials:
            record = trial_record(t)
            knobs = points.get(t.number)
            if knobs is None or record.objective is None or record.peak_bytes is None:
                continue
            # The outer precision moves the head's and the loss's cost, which no share of the
            # blocks stands for: one surface per setting of it, as per reduced precision.
            if (knobs.batch_size, knobs.ranks, knobs.zero_stage, knobs.low_precision, knobs.outer_low_precision) == (
                incumbent.batch_size,
                incumbent.ranks,
                incumbent.zero_stage,
                incumbent.low_precision,
                incumbent.outer_low_precision,
            ):
                measured.append((knobs, record.objective, record.peak_bytes))
        surface = fit_surface(measured, num_blocks=self.space.num_blocks)
        if surface is None:
            return None
        untried = list(dict.fromkeys(self._undominated(k) for k in self.space.variants(incumbent)))
        untried = [k for k in untried if k not in tried]
        # One source of peaks for every candidate: the memory model's where it predicts them all,
        # else the fit's. Mixing them favours the points it cannot predict (on unet-tiny, per-block
        # recompute across skips): the fit takes recompute to lower the peak there, and it does not.
        # The verified peaks the model has still bound the fit's (surface module docstring).
        known = {k: self.known_peak(k) for k in untried} if self.known_peak is not None else {}
        exact = bool(known) and all(v is not None for v in known.values())
        peaks = known.get if exact else None
        bounds = None if exact or self.known_peak is None else self._peak_bounds
        estimates = ranked(
            surface, untried, known_peak=peaks, peak_bounds=bounds, budget_bytes=self.budget_bytes, objective=objective
        )
        for estimate in estimates:
            if estimate.under(objective) <= incumbent_value:
                return None
            if self._admitted(estimate.knobs):
                return estimate, surface.points
        return None

    def _knobs(self, trial: optuna.trial.FrozenTrial) -> Knobs | None:
        """The point a trial measures (a waiting trial's enqueued params), or None if it has none."""
        # Optuna keeps an enqueued trial's params in the system attribute "fixed_params" until it
        # runs (Study.enqueue_trial, since Optuna 2.0); a waiting refinement is a tried point.
        params = trial.params or trial.system_attrs.get("fixed_params")
        if not params:
            return None
        try:
            return self.space.knobs_of(params)
        except (ValueError, KeyError):  # params of another space (a resumed study's older trials)
            return None

    def _incumbent(
        self,
        trials: list[optuna.trial.FrozenTrial],
        points: dict[int, Knobs],
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
    ) -> tuple[optuna.trial.FrozenTrial, Knobs, float] | None:
        """The feasible trial that no side-by-side timing beat, best by ``objective`` after the
        duels (:func:`autotune.search.finalists.standing`, the finalists' order), its point and
        that value."""
        from autotune.search.finalists import standing

        records = [trial_record(t) for t in trials]
        value = standing(tuple(r for r in records if r.feasible and r.under(objective) is not None), objective)
        best: tuple[float, optuna.trial.FrozenTrial, Knobs] | None = None
        for t in trials:
            knobs = points.get(t.number)
            if t.number not in value or knobs is None or ATTR.CONFIG not in t.user_attrs:
                continue
            if BEATEN_BY in t.user_attrs:
                continue
            if best is None or value[t.number] > best[0]:
                best = (value[t.number], t, knobs)
        return None if best is None else (best[1], best[2], best[0])
