"""What a study found: the Pareto front, the recommended configuration, and how it compares with
each baseline. Pure data over the stored trials, shared by the CLI tables, ``autotune best`` and
the dashboard artifacts."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.errors import StudyError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.search.baselines import NAMES
from autotune.search.compile_pick import CompilePick, read_compile_pick
from autotune.search.finalists import Finalist, read_retimed
from autotune.search.spec import objective_of
from autotune.search.trial_record import TrialRecord, trial_record

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig

__all__ = ["Improvement", "StudySummary", "pareto_front", "require_recommended", "summarize"]


@dataclass(frozen=True, kw_only=True)
class Improvement:
    """Recommended / baseline ratios (> 1 is better for throughput and per-GiB, < 1 for memory).

    ``side_by_side``: the throughput and per-GiB ratios are of the two re-timed in one interleaved
    run (:mod:`autotune.search.finalists`); otherwise of their first measurements."""

    baseline: str
    trial: int
    throughput: float
    peak_memory: float
    per_gib: float
    side_by_side: bool = False


@dataclass(frozen=True, kw_only=True)
class StudySummary:
    name: str
    trials: tuple[TrialRecord, ...]
    front: tuple[TrialRecord, ...]
    recommended: TrialRecord | None
    baselines: dict[str, TrialRecord]
    improvements: tuple[Improvement, ...]
    states: dict[str, int]
    metric: str
    #: The finalists re-timed side by side (:mod:`autotune.search.finalists`), by trial number.
    retimed: dict[int, Finalist] = dataclasses.field(default_factory=dict)
    #: Whether the re-timing's winner was separated from the runner-up beyond their spreads.
    retimed_decided: bool | None = None
    #: What the recommendation is for (:func:`autotune.search.spec.objective_of`).
    objective: ObjectiveName = DEFAULT_OBJECTIVE
    #: The recommendation timed eager and compiled (:mod:`autotune.search.compile_pick`), or None.
    compile_pick: CompilePick | None = None

    @property
    def recommended_config(self) -> TrainConfig | None:
        """The configuration to export: the recommended trial's, compiled where its compile check
        recommends it."""
        r = self.recommended
        if r is None or r.config is None:
            return None
        return r.config if self.compile_pick is None else self.compile_pick.config(r.config)

    def improvement(self, baseline: str) -> Improvement | None:
        return next((i for i in self.improvements if i.baseline == baseline), None)


def pareto_front(records: list[TrialRecord]) -> tuple[TrialRecord, ...]:
    """Feasible trials not dominated in (max objective, min peak), by increasing peak."""
    ok = [r for r in records if r.feasible and r.objective is not None and r.peak_bytes is not None]

    def dominated(r: TrialRecord) -> bool:
        assert r.objective is not None and r.peak_bytes is not None
        return any(
            o.objective >= r.objective  # type: ignore[operator]
            and o.peak_bytes <= r.peak_bytes  # type: ignore[operator]
            and (o.objective > r.objective or o.peak_bytes < r.peak_bytes)  # type: ignore[operator]
            for o in ok
        )

    return tuple(sorted((r for r in ok if not dominated(r)), key=lambda r: (r.peak_bytes, r.number)))


def summarize(study: optuna.Study) -> StudySummary:
    """Summarize a study's trials (any state; only feasible completed trials can be recommended)."""
    records = [trial_record(t) for t in study.get_trials(deepcopy=False)]
    front = pareto_front(records)
    objective = objective_of(study)
    # The headline: the highest objective per GiB of peak memory among feasible trials, or the
    # highest objective (within the budget: feasible) under "throughput". Either maximum lies on
    # the front (the maximum of a ratio, or of the value, is not dominated). The value and its
    # ranking are autotune.measurement.objective's, as for the envs and Adaptive.
    recommended = max(front, key=lambda r: (r.under(objective) or 0.0, -r.number), default=None)
    # Unless the best few were re-timed side by side: then the winner of that (finalists.py).
    winner, retimed, decided = read_retimed(study)
    recommended = next((r for r in records if r.number == winner and r.feasible), recommended)
    # And where the finalists were compiled too, the one with the most value under compile
    # (compile_pick.py): its check is of the eager recommendation above.
    compile_pick = read_compile_pick(study, recommended)
    if compile_pick is not None:
        recommended = next((r for r in records if r.number == compile_pick.trial and r.feasible), recommended)
    baselines: dict[str, TrialRecord] = {}
    for name in NAMES:
        tried = [r for r in records if r.baseline == name]
        feasible = [r for r in tried if r.feasible]
        if feasible or tried:
            baselines[name] = (feasible or tried)[0]
    improvements = tuple(
        _improvement(recommended, b, retimed) for b in baselines.values() if recommended is not None and b.feasible
    )
    metric = (study.metric_names or ["throughput"])[0].split(" ")[0]
    return StudySummary(
        name=study.study_name,
        trials=tuple(records),
        front=front,
        recommended=recommended,
        baselines=baselines,
        improvements=improvements,
        states=dict(Counter(r.state for r in records)),
        metric=metric,
        retimed=retimed,
        retimed_decided=decided,
        objective=objective,
        compile_pick=compile_pick,
    )


def _improvement(best: TrialRecord | None, base: TrialRecord, retimed: dict[int, Finalist]) -> Improvement:
    assert best is not None and best.objective and best.peak_bytes and best.per_gib
    assert base.objective and base.peak_bytes and base.per_gib and base.baseline
    ours, theirs = retimed.get(best.number), retimed.get(base.number)
    if ours is not None and theirs is not None:  # both in the last re-timing: its ratios, side by side
        # The metric per sample/s (goodput's efficiency; 1 for samples/s) scales the re-timed rates.
        assert best.throughput and base.throughput
        metric = (best.objective / best.throughput) / (base.objective / base.throughput)
        return Improvement(
            baseline=base.baseline,
            trial=base.number,
            throughput=ours.retimed_throughput / theirs.retimed_throughput * metric,
            peak_memory=best.peak_bytes / base.peak_bytes,
            per_gib=ours.retimed_per_gib / theirs.retimed_per_gib,
            side_by_side=True,
        )
    return Improvement(
        baseline=base.baseline,
        trial=base.number,
        throughput=best.objective / base.objective,
        peak_memory=best.peak_bytes / base.peak_bytes,
        per_gib=best.per_gib / base.per_gib,
    )


def require_recommended(summary: StudySummary) -> TrialRecord:
    if summary.recommended is None or summary.recommended.config is None:
        raise StudyError(f"study {summary.name!r} has no feasible completed trial yet: nothing to recommend")
    return summary.recommended
