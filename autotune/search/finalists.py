"""The study's recommendation, re-timed: its finalists measured side by side before one is picked.

Each trial times its configuration in one stint of steps, and on a shared machine a stint can
time 10-20% off the next (with another process spinning on a core, far more): the trial that
looks best may only have been lucky. So at the end of a study the best :data:`FINALISTS`
distinct configurations by the study's objective per GiB (feasible, within the budget) are timed
again in one process, round by round (:func:`autotune.measurement.sidebyside.retime_configs`), and
the recommendation is the winner of that re-timing, valued with each trial's exact measured peak.

Three keeps the cost bounded (each finalist runs its warm-up and 6-12 steps on one loop:
seconds to a minute on the corpus models) while giving the configurations a single stint's noise
can reorder (those within 10-20% of the leader's first measurement) a second, fair look.

The result is stored as the study's user attribute ``retimed`` (the dashboard shows it with the
study; ``autotune best --format json`` prints it): each finalist's trial number, first and
re-timed samples/s with its spread, its re-timed value per GiB, the winner, and whether the
winner was separated from the runner-up beyond their spreads (``decided``), with a note when
the machine was busy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.sidebyside import Retimed, busy_note
from autotune.settings import TUNING

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig
    from autotune.search.record import TrialRecord

__all__ = ["FINALISTS", "RETIMED", "Finalist", "finalists", "read_retimed", "retime_finalists", "to_retime"]

FINALISTS = TUNING.finalists
RETIMED = "retimed"  # the study's user attribute

Retimer = Callable[[list["TrainConfig"], list[float]], Retimed]


@dataclass(frozen=True, kw_only=True)
class Finalist:
    """One finalist: its trial's first measurement and its re-timed one."""

    trial: int
    first_throughput: float
    retimed_throughput: float
    retimed_spread: float  # median absolute deviation / median
    retimed_per_gib: float
    rank: int  # 0: the winner


def finalists(records: tuple[TrialRecord, ...]) -> list[TrialRecord]:
    """The best :data:`FINALISTS` distinct local-runner configurations by objective per GiB among
    feasible completed trials (ZeRO configurations run on ranks: they keep their first
    measurement)."""
    ok = [
        r
        for r in records
        if r.feasible and r.config is not None and r.per_gib and r.throughput and not r.config.on_deepspeed
    ]
    ok.sort(key=lambda r: (-(r.per_gib or 0.0), r.number))
    out: list[TrialRecord] = []
    for r in ok:
        if all(o.config != r.config for o in out):
            out.append(r)
        if len(out) == FINALISTS:
            break
    return out


def to_retime(study: optuna.Study) -> list[TrialRecord]:
    """The finalists still to re-time: none with fewer than two, or if these very trials were
    re-timed already (the study's ``retimed`` record names them)."""
    from autotune.search.record import trial_record

    # The summary's records (results.summarize reads them the same way, and reads this module).
    chosen = finalists(tuple(trial_record(t) for t in study.get_trials(deepcopy=False)))
    previous = study.user_attrs.get(RETIMED)
    if len(chosen) < 2 or (previous and [f["trial"] for f in previous["finalists"]] == [r.number for r in chosen]):
        return []
    return chosen


def retime_finalists(
    study: optuna.Study, retimer: Retimer, *, threads: int, note: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """Re-time the study's finalists with ``retimer`` (configs, value scales) unless
    :func:`to_retime` finds none to do; store and return the record (the stored one if these
    finalists were re-timed already, None with fewer than two)."""
    chosen = to_retime(study)
    if not chosen:
        previous = study.user_attrs.get(RETIMED)
        return dict(previous) if previous else None
    numbers = [r.number for r in chosen]
    # value = samples/s x (objective per sample/s) / GiB: each trial's efficiency and exact peak
    scales = [(r.per_gib or 0.0) / (r.throughput or 1.0) for r in chosen]
    configs = [r.config for r in chosen if r.config is not None]
    if note is not None:
        note(f"re-timing the {len(chosen)} best configurations side by side (trials {numbers})")
    result = retimer(configs, scales)
    rank = {i: k for k, i in enumerate(result.ranking)}
    record = {
        "finalists": [
            {
                "trial": r.number,
                "first_throughput": r.throughput,
                "retimed_throughput": t.median,
                "retimed_spread": t.relative_spread,
                "retimed_per_gib": t.median * scales[i],
                "rank": rank[i],
            }
            for i, (r, t) in enumerate(zip(chosen, result.timings, strict=True))
        ],
        "winner": chosen[result.winner].number,
        "decided": result.decided,
        "rounds": result.rounds,
        "note": busy_note(result.other_cores, threads=threads),
    }
    study.set_user_attr(RETIMED, record)
    return record


def read_retimed(study: optuna.Study) -> tuple[int | None, dict[int, Finalist]]:
    """(the re-timing's winner, each finalist by trial number) from the study, or (None, {})."""
    record = study.user_attrs.get(RETIMED)
    if not record:
        return None, {}
    by_trial = {
        f["trial"]: Finalist(
            trial=f["trial"],
            first_throughput=f["first_throughput"],
            retimed_throughput=f["retimed_throughput"],
            retimed_spread=f["retimed_spread"],
            retimed_per_gib=f["retimed_per_gib"],
            rank=f["rank"],
        )
        for f in record["finalists"]
    }
    return record["winner"], by_trial
