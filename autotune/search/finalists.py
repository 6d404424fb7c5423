"""The study's recommendation, re-timed: its finalists measured side by side before one is picked.

Each trial times its configuration in one stint of steps, and on a shared machine a stint can
time 10-20% off the next (with another process spinning on a core, far more): the trial that
looks best may only have been lucky. So at the end of a study the best :data:`FINALISTS`
distinct configurations by the study's objective (feasible, within the budget: the most value per
GiB, or the most value, :func:`autotune.search.spec.objective_of`) are timed
again in one process, round by round (:func:`autotune.measurement.sidebyside.retime_configs`), and
the recommendation is the winner of that re-timing, valued with each trial's exact measured peak.

Three keeps the cost bounded (each finalist runs its warm-up and 6-12 steps on one loop:
seconds to a minute on the corpus models) while giving the configurations a single stint's noise
can reorder (those within 10-20% of the leader's first measurement) a second, fair look.

The baselines the recommendation is compared with (the PyTorch default and the HF recipes,
:data:`autotune.search.baselines.COMPARED`) are re-timed with them where they ran within the
budget, as ``tune`` re-times its baselines beside its best steps: the recommendation's ratios to
them then come from one interleaved run, not from stints minutes apart (hf-llama on a Xeon: the
HF recipe's first stint 36.1 samples/s, 51.1 re-timed; the pick's "1.41x the HF recipe" was
1.02x side by side). They compete like the others: a recipe that wins is recommended.

The figures go on each finalist's own trial as user attributes (:data:`TRIAL_ATTRS`: re-timed
samples/s, its spread, value per GiB, rank, rounds and the trials it was timed with), where the
dashboard shows them with the trial and ``autotune best --format json`` prints the recommended
one's. The study keeps one small user attribute ``retimed``: which trials were re-timed last,
the winner, whether it was separated from the runner-up beyond their spreads (``decided``), the
rounds and a note when the machine was busy. The summary reads it to know which trials' figures
are current (a resumed study re-times its new finalists; the old ones keep their attributes)
and :func:`to_retime` to skip finalists re-timed already.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.sidebyside import Retimed, busy_note
from autotune.search.baselines import COMPARED
from autotune.tuning import TUNING

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig
    from autotune.search.trial_record import TrialRecord

__all__ = [
    "FINALISTS",
    "RETIMED",
    "TRIAL_ATTRS",
    "Finalist",
    "finalists",
    "read_retimed",
    "retime_finalists",
    "set_finished_trial_attrs",
    "standing",
    "to_retime",
    "value_scale",
]

FINALISTS = TUNING.finalists
RETIMED = "retimed"  # the study's user attribute: which trials, the winner, decided, rounds, note


class TRIAL_ATTRS:
    """The user attributes of a re-timed finalist's trial."""

    THROUGHPUT = "retimed_throughput"  # median samples/s over the interleaved rounds
    SPREAD = "retimed_spread"  # median absolute deviation / median
    PER_GIB = "retimed_per_gib"  # the re-timed value per GiB of the trial's measured peak (either objective)
    RANK = "retimed_rank"  # 1: the winner
    ROUNDS = "retimed_rounds"
    WITH = "retimed_with"  # the finalists' trial numbers, this one's included


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
    rounds: int


def finalists(records: tuple[TrialRecord, ...], objective: ObjectiveName = DEFAULT_OBJECTIVE) -> list[TrialRecord]:
    """What the study re-times side by side: :func:`_best`, and :func:`_compared` them."""
    best = _best(records, objective)
    return best + _compared(records, best)


def _best(records: tuple[TrialRecord, ...], objective: ObjectiveName) -> list[TrialRecord]:
    """The best :data:`FINALISTS` distinct local-runner configurations by ``objective`` among
    feasible completed trials (ZeRO configurations run on ranks: they keep their first
    measurement), after the refinement's duels (:data:`autotune.search.refine.BEATEN_BY`):

    * a trial a duel showed worse beyond both spreads is no finalist;
    * a duel's winner ranks at least as high as the trial it beat: a lucky first stint must not
      take the place of the trial that beat it on the same machine moments later;
    * a trial that lost a duel too close to call stays eligible, ranked behind its winner: the two
      were within each other's noise, and the final re-timing, with more rounds, is the fair look
      (docs/benchmark-log.md, shared-encoder: such a loser was the best first measurement).
    """
    ok = {
        r.number: r
        for r in records
        if r.feasible and r.config is not None and r.per_gib and r.throughput and not r.config.on_deepspeed
    }
    rank = standing(tuple(ok.values()), objective)

    def behind(r: TrialRecord) -> int:
        """How many duels separate ``r`` from a trial no duel beat (a cycle of duels ends it)."""
        depth, seen, winner = 0, {r.number}, r.beaten_by
        while winner is not None and winner in ok and winner not in seen:
            depth, seen, winner = depth + 1, seen | {winner}, ok[winner].beaten_by
        return depth

    eligible = [r for r in ok.values() if r.beaten_by is None or not r.beaten_decided]
    # A loser ties its winner at most: on a tie the winner first.
    eligible.sort(key=lambda r: (-rank[r.number], behind(r), r.number))
    out: list[TrialRecord] = []
    for r in eligible:
        if all(o.config != r.config for o in out):
            out.append(r)
        if len(out) == FINALISTS:
            break
    return out


def _compared(records: tuple[TrialRecord, ...], best: list[TrialRecord]) -> list[TrialRecord]:
    """The compared baselines' trials re-timed beside the ``best`` ones: each one's first
    feasible trial (the one the summary compares with), local, of a configuration none of
    ``best`` has."""
    out: list[TrialRecord] = []
    for name, _ in COMPARED:
        base = next((r for r in records if r.baseline == name and r.feasible), None)
        if (
            base is not None
            and base.config is not None
            and base.throughput
            and base.per_gib
            and not base.config.on_deepspeed
            and all(o.config != base.config for o in [*best, *out])
        ):
            out.append(base)
    return out


def standing(records: tuple[TrialRecord, ...], objective: ObjectiveName = DEFAULT_OBJECTIVE) -> dict[int, float]:
    """Each of ``records``' value under ``objective`` after the refinement's duels, by trial number:
    its first measurement, or, where it beat a trial side by side (that trial is
    :data:`~autotune.search.trial_record.ATTR.BEATEN_BY` it), at least that trial's standing.

    One order for the refinement's incumbent and the finalists. A duel times the two side by side
    on the same machine moments apart; their first measurements were single stints minutes apart,
    which on a drifting machine part by 30% and more for the same configuration (hf-gpt2's
    per-GiB study, docs/study.md). So a duel's winner must not fall behind a third trial that
    only its loser's first stint was compared with.
    """
    rank = {r.number: r.under(objective) or 0.0 for r in records}
    for _ in records:  # to a fixed point: a winner beaten in turn passes it on (at most one pass per trial)
        changed = False
        for r in records:
            w = r.beaten_by
            if w is not None and w in rank and rank[w] < rank[r.number]:
                rank[w], changed = rank[r.number], True
        if not changed:
            break
    return rank


def to_retime(study: optuna.Study) -> list[TrialRecord]:
    """The finalists still to re-time: none with fewer than two, or if these very trials were
    re-timed already (the study's ``retimed`` record names them)."""
    best, beside = _to_retime(study)
    return best + beside


def _to_retime(study: optuna.Study) -> tuple[list[TrialRecord], list[TrialRecord]]:
    """:func:`to_retime`'s finalists as :func:`finalists` chooses them: the best, and the
    baselines compared beside them (both empty where there is nothing to re-time)."""
    from autotune.search.spec import objective_of
    from autotune.search.trial_record import trial_record

    # The summary's records (results.summarize reads them the same way, and reads this module).
    records = tuple(trial_record(t) for t in study.get_trials(deepcopy=False))
    best = _best(records, objective_of(study))
    beside = _compared(records, best)
    chosen = best + beside
    if len(chosen) < 2 or _retimed_trials(study) == [r.number for r in chosen]:
        return [], []
    return best, beside


def _retimed_trials(study: optuna.Study) -> list[int] | None:
    record = study.user_attrs.get(RETIMED)
    # A record without "trials" is an older layout (figures on the study): re-time into this one.
    return list(record["trials"]) if record and "trials" in record else None


def retime_finalists(
    study: optuna.Study, retimer: Retimer, *, threads: int, note: Callable[[str], None] | None = None
) -> dict[str, Any] | None:
    """Re-time the study's finalists with ``retimer`` (configs, value scales) unless
    :func:`to_retime` finds none to do; store and return the record (the stored one if these
    finalists were re-timed already, None with fewer than two). The winner is the most re-timed
    value under the study's objective; each finalist's re-timed value per GiB is stored either way."""
    from autotune.search.spec import objective_of

    best, beside = _to_retime(study)
    chosen = best + beside
    if not chosen:
        previous = study.user_attrs.get(RETIMED)
        return dict(previous) if previous else None
    numbers = [r.number for r in chosen]
    scales = [value_scale(r, objective_of(study)) for r in chosen]
    configs = [r.config for r in chosen if r.config is not None]
    if note is not None:
        with_ = ", ".join(f"{r.baseline} (trial {r.number})" for r in beside)
        note(
            f"re-timing the {len(best)} best configurations side by side (trials {[r.number for r in best]})"
            + (f", with the baselines compared: {with_}" if beside else "")
        )
    result = retimer(configs, scales)
    rank = {i: k for k, i in enumerate(result.ranking)}
    for i, (r, t) in enumerate(zip(chosen, result.timings, strict=True)):
        set_finished_trial_attrs(
            study,
            r.number,
            {
                TRIAL_ATTRS.THROUGHPUT: t.median,
                TRIAL_ATTRS.SPREAD: t.relative_spread,
                TRIAL_ATTRS.PER_GIB: t.median * value_scale(r),
                TRIAL_ATTRS.RANK: rank[i] + 1,
                TRIAL_ATTRS.ROUNDS: result.rounds,
                TRIAL_ATTRS.WITH: numbers,
            },
        )
    record = {
        "trials": numbers,
        "winner": chosen[result.winner].number,
        "decided": result.decided,
        "rounds": result.rounds,
        "note": busy_note(result.other_cores, threads=threads),
    }
    study.set_user_attr(RETIMED, record)
    return record


def value_scale(record: TrialRecord, objective: ObjectiveName = DEFAULT_OBJECTIVE) -> float:
    """What turns a re-timed samples/s of ``record``'s configuration into what ``objective`` ranks
    it by: samples/s x (value per sample/s), the trial's efficiency, per GiB of its exact measured
    peak under ``"per-gib"``."""
    return (record.under(objective) or 0.0) / (record.throughput or 1.0)


def set_finished_trial_attrs(study: optuna.Study, number: int, attrs: dict[str, Any]) -> None:
    """Set user attributes on a finished trial. Optuna refuses any write to a finished trial, but
    the re-timing can only happen after the finalists' trials finished and its figures belong on
    them (the dashboard shows a trial's user attributes), as the refinement's side-by-side verdicts
    belong on the trials they compared: Optuna's own write path is used, with
    its finished-trial check lifted on this storage object for these writes only."""
    storage = study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    backend = getattr(storage, "_backend", storage)  # optuna wraps an RDBStorage in a cache
    backend.check_trial_is_updatable = lambda *args, **kwargs: None  # type: ignore[method-assign]
    try:
        for key, value in attrs.items():
            backend.set_trial_user_attr(trial_id, key, value)
    finally:
        del backend.check_trial_is_updatable  # the instance attribute: the class's check is back
    # The cache keeps finished trials and never reads them again: update its copy too.
    cached = storage.get_trial(trial_id)
    for key, value in attrs.items():
        cached.set_user_attr(key, value)


def read_retimed(study: optuna.Study) -> tuple[int | None, dict[int, Finalist], bool | None]:
    """(the last re-timing's winner, its finalists by trial number, from their trials' attributes,
    whether the winner was separated beyond the spreads), or (None, {}, None)."""
    record = study.user_attrs.get(RETIMED)
    numbers = _retimed_trials(study)
    if not record or numbers is None:
        return None, {}, None
    by_trial: dict[int, Finalist] = {}
    for t in study.get_trials(deepcopy=False):
        a = t.user_attrs
        if t.number in numbers and TRIAL_ATTRS.THROUGHPUT in a:
            by_trial[t.number] = Finalist(
                trial=t.number,
                first_throughput=a.get("throughput", 0.0),
                retimed_throughput=a[TRIAL_ATTRS.THROUGHPUT],
                retimed_spread=a[TRIAL_ATTRS.SPREAD],
                retimed_per_gib=a[TRIAL_ATTRS.PER_GIB],
                rank=a[TRIAL_ATTRS.RANK] - 1,
                rounds=a[TRIAL_ATTRS.ROUNDS],
            )
    return record["winner"], by_trial, bool(record["decided"])
