"""The Pareto front over (max objective, min peak) and the max-per-GiB recommendation."""

from __future__ import annotations

from autotune.search.record import TrialRecord
from autotune.search.results import pareto_front

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
