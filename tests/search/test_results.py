"""The Pareto front over (max objective, min peak) and the recommendation: the most per GiB, or the
most samples/s within the budget."""

from __future__ import annotations

import optuna
from rich.console import Console

from autotune.config import TrainConfig
from autotune.search.display import summary_view
from autotune.search.results import pareto_front, summarize
from autotune.search.spec import StudySpec, objective_of, spec_to_dict
from autotune.search.trial_record import ATTR, TrialRecord

GIB = 1024**3


def _record(number: int, objective: float | None, peak: int | None, *, feasible: bool = True) -> TrialRecord:
    return TrialRecord(
        number=number,
        state="COMPLETE" if feasible else "PRUNED",
        config=None,
        baseline=None,
        status="ok",
        reason=None,
        throughput=objective,
        objective=objective,
        peak_bytes=peak,
        memory=None,
        noise_scale=None,
        efficiency=None,
        feasible=feasible,
    )


def test_front_keeps_only_non_dominated_feasible_trials_by_increasing_peak() -> None:
    records = [
        _record(0, 100.0, 4 * GIB),
        _record(1, 80.0, 1 * GIB),
        _record(2, 90.0, 4 * GIB),  # dominated by 0
        _record(3, 80.0, 2 * GIB),  # dominated by 1
        _record(4, 500.0, 1 * GIB, feasible=False),  # infeasible: never on the front
        _record(5, 100.0, 4 * GIB),  # equal to 0: neither dominates
    ]
    assert [r.number for r in pareto_front(records)] == [1, 0, 5]


def test_per_gib_is_objective_per_gib_of_peak() -> None:
    assert _record(0, 80.0, 2 * GIB).per_gib == 40.0
    assert _record(0, None, 2 * GIB).per_gib is None


def _study(objective: str) -> optuna.Study:
    """Three completed trials: 100 samples/s at 1 GiB, 150 at 2 GiB, and 300 at 4 GiB over the budget."""
    study = optuna.create_study(study_name="s", directions=["maximize", "minimize"])
    study.set_user_attr("spec", spec_to_dict(StudySpec(workload="tiny", objective=objective)))  # type: ignore[arg-type]
    for micro, rate, gib, over in ((2, 100.0, 1, False), (4, 150.0, 2, False), (8, 300.0, 4, True)):
        config = TrainConfig(micro_batch_size=micro, grad_accum_steps=16 // micro)
        attrs = {ATTR.CONFIG: config.to_dict(), ATTR.STATUS: "ok", ATTR.THROUGHPUT: rate, ATTR.PEAK: gib * GIB}
        study.add_trial(
            optuna.trial.create_trial(
                values=[rate, gib * 1024.0], user_attrs=attrs, system_attrs={"constraints": [1.0 if over else -1.0]}
            )
        )
    return study


def test_per_gib_recommends_the_most_per_gib_and_throughput_the_fastest_within_the_budget() -> None:
    per_gib, fastest = summarize(_study("per-gib")), summarize(_study("throughput"))
    assert per_gib.recommended is not None and fastest.recommended is not None
    # 100 per GiB (trial 0) against 75 (trial 1); trial 2's 300 samples/s is over the budget.
    assert (per_gib.objective, per_gib.recommended.number, per_gib.recommended.per_gib) == ("per-gib", 0, 100.0)
    assert (fastest.objective, fastest.recommended.number, fastest.recommended.objective) == ("throughput", 1, 150.0)
    assert [r.under("throughput") for r in fastest.trials] == [100.0, 150.0, 300.0]
    assert [r.under("per-gib") for r in fastest.trials] == [100.0, 75.0, 75.0]
    # The improvement over a baseline is the same ratios either way: only the recommendation moves.
    assert [r.number for r in fastest.front] == [0, 1]


def test_the_recommended_line_says_what_a_throughput_recommendation_is_for() -> None:
    lines = {}
    for objective in ("per-gib", "throughput"):
        console = Console(record=True, width=300)
        console.print(summary_view(summarize(_study(objective))))
        lines[objective] = next(line for line in console.export_text().splitlines() if line.startswith("recommended"))
    assert lines["per-gib"] == (
        "recommended: trial 0: micro x acc x ranks 2x8x1 | fp32 | ckpt none | ZeRO 0: 100.0 samples/s, "
        "peak 1 GiB, 100.0 samples/s per GiB"
    )
    assert lines["throughput"] == (
        "recommended for the most samples/s within the budget: trial 1: micro x acc x ranks 4x4x1 | fp32 | "
        "ckpt none | ZeRO 0: 150.0 samples/s, peak 2 GiB, 75.0 samples/s per GiB"
    )


def test_a_study_stored_without_an_objective_recommends_per_gib() -> None:
    study = _study("throughput")
    study.set_user_attr("spec", {"workload": "tiny"})  # created before the option existed
    assert objective_of(study) == "per-gib"
    summary = summarize(study)
    assert summary.recommended is not None and summary.recommended.number == 0


def test_a_baseline_still_waiting_is_not_called_infeasible() -> None:
    study = _study("per-gib")
    study.enqueue_trial({}, user_attrs={ATTR.BASELINE: "hf-recipe"})  # a study stopped before it ran
    console = Console(record=True, width=300)
    console.print(summary_view(summarize(study)))
    line = next(line for line in console.export_text().splitlines() if line.startswith("recommended"))
    assert line == (
        "recommended: trial 0: micro x acc x ranks 2x8x1 | fp32 | ckpt none | ZeRO 0: 100.0 samples/s, "
        "peak 1 GiB, 100.0 samples/s per GiB"
    )
