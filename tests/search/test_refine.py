"""The study's local refinement: the untried neighbours of its best trial, in its last trials and
after a repeated one, enqueued through Optuna (scripted trials: no measurement)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import optuna
import pytest
from autotune.envs._codec import Levels

from autotune.config import TrainConfig
from autotune.errors import MeasurementFailed
from autotune.knobs import Knobs
from autotune.measurement.admission import Verdict, admission
from autotune.measurement.sidebyside import Retimed, Timing
from autotune.search.refine import (
    BEATEN_BY,
    REFINE_START,
    REFINED_FROM,
    Refine,
    pattern_first,
    recompute_margin,
    refine_trials,
    undominated,
)
from autotune.search.space import SearchSpace
from autotune.search.spec import StudySpec, spec_to_dict
from autotune.search.trial_record import ATTR

MIB = 2**20
SPACE = SearchSpace(batch_sizes=(16,), ranking=(0, 1, 2, 3), max_micro_batch=16)


def _knobs(micro: int, low: int, ckpt: int) -> Knobs:
    return Knobs(batch_size=16, micro_batch_size=micro, low_precision_blocks=low, checkpoint_blocks=ckpt)


def test_neighbours_are_one_knob_one_step_away_throughput_raising_moves_first() -> None:
    outer = dataclasses.replace(_knobs(8, 4, 4), outer_low_precision=True)
    assert SPACE.neighbours(_knobs(8, 4, 4)) == [
        _knobs(16, 4, 4),  # a larger micro-batch
        _knobs(8, 4, 3),  # one recomputed block fewer
        outer,  # (no fifth block to put in bf16) the head and the loss in bf16 too
        _knobs(4, 4, 4),  # a smaller micro-batch
        _knobs(8, 3, 4),  # (every block recomputed already) one bf16 block fewer
    ]
    assert SPACE.neighbours(outer)[-1] == _knobs(8, 4, 4)  # the outer parts back in fp32: a down move
    assert SPACE.neighbours(_knobs(1, 0, 0)) == [
        _knobs(2, 0, 0),
        _knobs(1, 1, 0),
        dataclasses.replace(_knobs(1, 0, 0), outer_low_precision=True),
        _knobs(1, 0, 1),
    ]
    fp32_only = SearchSpace(batch_sizes=(16,), ranking=(0, 1), max_micro_batch=4, low_precisions=())
    assert fp32_only.neighbours(_knobs(4, 0, 1)) == [_knobs(4, 0, 0), _knobs(2, 0, 1), _knobs(4, 0, 2)]
    ranks = SearchSpace(batch_sizes=(16,), ranks=(2,), zero_stages=(0, 1, 2, 3), ranking=(0,), max_micro_batch=16)
    on_ranks = Knobs(batch_size=16, ranks=2, micro_batch_size=8, zero_stage=2)
    moved = [
        (k.micro_batch_size, k.low_precision_blocks, k.checkpoint_blocks, k.zero_stage, k.outer_low_precision)
        for k in ranks.neighbours(on_ranks)
    ]
    # 8 per rank is the whole batch: up are bf16 +1, the outer parts in bf16 and ZeRO one stage
    # down; down, the reverses
    assert moved == [
        (8, 1, 0, 2, False),
        (8, 0, 0, 2, True),
        (8, 0, 0, 1, False),
        (4, 0, 0, 2, False),
        (8, 0, 1, 2, False),
        (8, 0, 0, 3, False),
    ]


@pytest.mark.parametrize(("trials", "refined"), [(1, 0), (2, 1), (3, 1), (4, 1), (12, 3), (20, 5), (100, 25)])
def test_a_quarter_of_the_trials_refine(trials: int, refined: int) -> None:
    assert refine_trials(trials) == refined


def _add(
    study: optuna.Study,
    knobs: Knobs,
    *,
    rate: float,
    peak_mib: float,
    feasible: bool = True,
    refined_from: int | None = None,
) -> None:
    params = SPACE.params(knobs)
    distributions = {
        "micro_batch_size": optuna.distributions.CategoricalDistribution(SPACE.micro_batch_choices(16, 1)),
        "low_precision_blocks": optuna.distributions.IntDistribution(0, 4),
        "outer_low_precision": optuna.distributions.CategoricalDistribution((False, True)),
        "checkpoint_blocks": optuna.distributions.IntDistribution(0, 4),
    }
    attrs = {
        ATTR.CONFIG: SPACE.config(knobs).to_dict(),
        ATTR.STATUS: "ok",
        ATTR.PEAK: int(peak_mib * MIB),
        ATTR.THROUGHPUT: rate,
    }
    if refined_from is not None:
        attrs[REFINED_FROM] = refined_from
    study.add_trial(
        optuna.trial.create_trial(
            params=params,
            distributions=distributions,
            values=[rate, peak_mib],
            user_attrs=attrs,
            system_attrs={"constraints": [0.0 if feasible else 1.0]},
        )
    )


def _study(*points: tuple[Knobs, float, float]) -> optuna.Study:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for knobs, rate, peak in points:
        _add(study, knobs, rate=rate, peak_mib=peak)
    return study


# Per GiB (rate / peak MiB x 1024): trial 1 leads (100 / 50 MiB = 2048), trial 2 next (1843).
POINTS = ((_knobs(16, 0, 0), 80.0, 120.0), (_knobs(8, 4, 4), 100.0, 50.0), (_knobs(4, 4, 4), 90.0, 50.0))


def _refine(
    study: optuna.Study,
    *,
    trials: int = 12,
    fits: object = None,
    known_peak: object = None,
    space: SearchSpace = SPACE,
) -> tuple[Refine, list[str]]:
    notes: list[str] = []

    def admits(knobs: Knobs) -> Verdict:  # the admission rule on a peak over the budget where ``fits`` says no
        assert callable(fits)
        return admission(budget=1, headroom=0.0, measured=1 if fits(knobs) else 2)

    refine = Refine(
        space=space,
        trials=trials,
        admits=None if fits is None else admits,
        counted=lambda s: len(s.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))),
        note=notes.append,
        known_peak=known_peak,  # type: ignore[arg-type]
    )
    return refine, notes


def _waiting(study: optuna.Study) -> list[tuple[dict[str, object], dict[str, object]]]:
    waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
    return [(t.system_attrs["fixed_params"], t.user_attrs) for t in waiting]


def test_before_its_last_trials_the_study_is_left_to_its_sampler() -> None:
    study = _study(*POINTS)
    refine, notes = _refine(study, trials=12)  # 3 of 12 done: the last 3 refine
    refine(study, study.trials[-1])
    assert _waiting(study) == [] and notes == []


def test_in_its_last_trials_the_first_untried_admitted_neighbour_of_the_best_is_enqueued() -> None:
    study = _study(*POINTS)
    # 3 done of 4: the last one refines. The larger micro-batch is predicted over the budget.
    refine, notes = _refine(study, trials=4, fits=lambda k: k.micro_batch_size < 16)
    refine(study, study.trials[-1])
    assert _waiting(study) == [
        (
            {"micro_batch_size": 8, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 3},
            {REFINED_FROM: 1},
        )
    ]
    assert notes == ["refining: next 8x2 bf16:4 ckpt:3, a neighbour of trial 1 (the best so far)"]
    refine(study, study.trials[-1])  # a trial waits: nothing more until it has run
    assert len(_waiting(study)) == 1


def test_a_space_reaching_the_selective_level_by_refinement_only_refines_into_it() -> None:
    # The sampled trials carry no selective_blocks; the refinement's neighbour does, and the trial
    # it enqueues runs it. Recomputing less than 4 blocks (whole or selectively) is over the budget.
    space = dataclasses.replace(SPACE, selective=True, selective_sampled=False)
    study = _study(*POINTS)

    def fits(k: Knobs) -> bool:
        return k.micro_batch_size < 16 and k.checkpoint_blocks + k.selective_blocks == 4

    refine, notes = _refine(study, trials=4, fits=fits, space=space)
    refine(study, study.trials[-1])
    selective = {
        "micro_batch_size": 8,
        "low_precision_blocks": 4,
        "outer_low_precision": False,
        "checkpoint_blocks": 3,
        "selective_blocks": 1,
    }
    assert _waiting(study) == [(selective, {REFINED_FROM: 1})]
    assert notes == ["refining: next 8x2 bf16:4 ckpt:3 sel:1, a neighbour of trial 1 (the best so far)"]
    assert space.suggest(study.ask()) == dataclasses.replace(_knobs(8, 4, 3), selective_blocks=1)
    # Without the level, the same refinement moves the outer precision instead.
    plain = _study(*POINTS)
    refine, _ = _refine(plain, trials=4, fits=fits)
    refine(plain, plain.trials[-1])
    assert [fixed["outer_low_precision"] for fixed, _ in _waiting(plain)] == [True]


def test_a_repeated_configuration_is_followed_by_a_refinement_at_any_point() -> None:
    study = _study(*POINTS, (_knobs(4, 4, 4), 91.0, 50.0))  # trial 3 repeats trial 2
    refine, notes = _refine(study, trials=40)
    refine(study, study.trials[-1])
    # 16x1 of trial 1's point (the largest micro-batch) first: nothing predicts it, it is tried
    assert _waiting(study) == [
        (
            {"micro_batch_size": 16, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 4},
            {REFINED_FROM: 1},
        )
    ]
    assert notes == ["trial 3 repeated trial 2: next 16x1 bf16:4 ckpt:4, a neighbour of trial 1 (the best so far)"]


def test_the_climb_moves_on_from_a_better_neighbour_and_stops_when_every_neighbour_was_tried() -> None:
    study = _study(*POINTS, (_knobs(16, 4, 4), 180.0, 60.0))  # the neighbour measured better: 3072 per GiB
    refine, _ = _refine(study, trials=6)
    refine(study, study.trials[-1])
    assert _waiting(study) == [
        (
            {"micro_batch_size": 16, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 3},
            {REFINED_FROM: 3},
        )
    ]
    done = _study(*POINTS)
    for k in SPACE.neighbours(_knobs(8, 4, 4)):
        if k not in {p[0] for p in POINTS}:
            _add(done, k, rate=10.0, peak_mib=100.0)
    # Only the incumbent's neighbours fit the budget: the surface through these seven trials has
    # nowhere to jump (tests/search/test_surface.py), and every neighbour was tried.
    near = set(SPACE.neighbours(_knobs(8, 4, 4)))
    refine, notes = _refine(done, trials=len(done.trials) + 1, fits=lambda k: k in near)
    refine(done, done.trials[-1])
    assert _waiting(done) == [] and notes == []  # the sampler takes the last trial


def test_a_refinement_that_paid_is_repeated_first() -> None:
    study = _study(*POINTS)
    # Trial 3, one recomputed block fewer than trial 1, measured better (110 / 50 MiB): the same
    # move again comes before the larger micro-batch that leads the neighbours' order.
    _add(study, _knobs(8, 4, 3), rate=110.0, peak_mib=50.0, refined_from=1)
    refine, notes = _refine(study, trials=5)
    refine(study, study.trials[-1])
    assert _waiting(study) == [
        (
            {"micro_batch_size": 8, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 2},
            {REFINED_FROM: 3},
        )
    ]
    assert notes == ["refining: next 8x2 bf16:4 ckpt:2, a neighbour of trial 3 (the best so far)"]


def test_pattern_first_repeats_the_move_that_reached_the_incumbent() -> None:
    here = _knobs(8, 4, 3)
    candidates = SPACE.neighbours(here)
    assert pattern_first(candidates, _knobs(8, 4, 4), here)[0] == _knobs(8, 4, 2)
    assert pattern_first(candidates, _knobs(4, 4, 3), here)[0] == _knobs(16, 4, 3)  # already first
    assert pattern_first(candidates, None, here) == candidates
    # A move with no continuation (the micro-batch went down to the smallest) keeps the order.
    assert pattern_first(SPACE.neighbours(_knobs(1, 0, 0)), _knobs(2, 0, 0), _knobs(1, 0, 0)) == SPACE.neighbours(
        _knobs(1, 0, 0)
    )
    # On the environments' levels a split is one move: micro-batch up and accumulation down.
    up, recompute = Levels(micro=3, accum=1), Levels(micro=2, accum=2, checkpoint=1)
    assert pattern_first([recompute, up], Levels(micro=1, accum=3), Levels(micro=2, accum=2)) == [up, recompute]


def test_an_infeasible_trial_is_never_the_incumbent_and_a_finished_study_is_left_alone() -> None:
    study = _study(*POINTS)
    _add(study, _knobs(2, 4, 4), rate=1000.0, peak_mib=10.0, feasible=False)  # over the budget
    refine, _ = _refine(study, trials=5)
    refine(study, study.trials[-1])
    assert [user for _, user in _waiting(study)] == [{REFINED_FROM: 1}]
    finished = _study(*POINTS)
    refine, notes = _refine(finished, trials=3)
    refine(finished, finished.trials[-1])
    assert _waiting(finished) == [] and notes == []


def test_a_surface_through_the_trials_jumps_past_the_neighbours_to_its_best_estimate() -> None:
    from tests.search.test_surface import MEASURED, peak, rate

    study = _study(*((k, rate(k), peak(k) / MIB) for k in MEASURED))  # 9 of 12 done: refining
    refine, notes = _refine(study, trials=12)
    refine(study, study.trials[-1])
    # The incumbent is trial 8 (2x8 bf16:4 ckpt:1, 11994.7 per GiB); the best point of the space,
    # 1x16 bf16:4, is two moves away and the surface estimates it at its true value.
    assert _waiting(study) == [
        (
            {"micro_batch_size": 1, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 0},
            {REFINED_FROM: 8},
        )
    ]
    assert notes == [
        "refining: next 1x16 bf16:4, estimated 12986.9 per GiB by a surface through 9 trials, "
        "above trial 8 (the best so far)"
    ]


def test_a_surface_that_estimates_nothing_above_the_incumbent_leaves_the_neighbours() -> None:
    from tests.search.test_surface import MEASURED, peak, rate

    # Trial 6 (16x1 bf16:4) measured 4x its true rate (a lucky stint): 20272 per GiB, above the
    # surface's best estimate of an untried point (2x8 bf16:4, 18544).
    lucky = [(k, rate(k) * (4.0 if k == _knobs(16, 4, 0) else 1.0), peak(k) / MIB) for k in MEASURED]
    study = _study(*lucky)
    refine, notes = _refine(study, trials=12)
    refine(study, study.trials[-1])
    # Its neighbours: no larger micro-batch, nothing recomputed, every block in bf16: the outer
    # parts in bf16 too (before a smaller micro-batch).
    assert _waiting(study) == [
        (
            {"micro_batch_size": 16, "low_precision_blocks": 4, "outer_low_precision": True, "checkpoint_blocks": 0},
            {REFINED_FROM: 6},
        )
    ]
    assert notes == ["refining: next 16x1 bf16:4+outer, a neighbour of trial 6 (the best so far)"]


def test_the_memory_model_s_peaks_rank_the_candidates_only_where_it_predicts_every_one() -> None:
    from tests.search.test_surface import MEASURED, peak, rate

    def study() -> optuna.Study:
        return _study(*((k, rate(k), peak(k) / MIB) for k in MEASURED))

    corner = _knobs(1, 4, 0)  # the surface's best; the memory model below says it needs 1 GiB
    # Every point predicted: its peaks rank, and the corner falls behind the next best.
    everywhere, notes = _refine(s := study(), known_peak=lambda k: 2**30 if k == corner else peak(k))
    everywhere(s, s.trials[-1])
    assert [p for p, _ in _waiting(s)] == [
        {"micro_batch_size": 1, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 1}
    ]
    assert notes == [
        "refining: next 1x16 bf16:4 ckpt:1, estimated 12530.4 per GiB by a surface through 9 trials, "
        "above trial 8 (the best so far)"
    ]
    # Only the corner predicted: the fitted peaks rank every point (admission is `fits`' job).
    partly, _ = _refine(s := study(), known_peak=lambda k: 2**30 if k == corner else None)
    partly(s, s.trials[-1])
    assert [p for p, _ in _waiting(s)] == [
        {"micro_batch_size": 1, "low_precision_blocks": 4, "outer_low_precision": False, "checkpoint_blocks": 0}
    ]


def _last_block_saves_nothing(k: Knobs) -> int:
    """The surface tests' peaks, except that recomputing the fourth block saves nothing (its
    recompute runs first in backward, while the activations it dropped would still be alive)."""
    from tests.search.test_surface import peak

    return peak(dataclasses.replace(k, checkpoint_blocks=min(k.checkpoint_blocks, 3)))


def test_a_point_recomputing_a_block_for_next_to_no_memory_gives_way_to_the_one_recomputing_less() -> None:
    def fold(ckpt: int, peak: object) -> int:
        return undominated(_knobs(8, 0, ckpt), peak, 4).checkpoint_blocks  # type: ignore[arg-type]

    assert fold(4, _last_block_saves_nothing) == 3
    assert fold(3, _last_block_saves_nothing) == 3  # the third block saves 4 MiB of 26
    assert fold(4, lambda k: 7 * MIB) == 0  # recompute never lowers the peak
    assert fold(4, lambda k: None) == 4  # no verified peak: as it is
    assert fold(4, {_knobs(8, 0, 4): 7 * MIB, _knobs(8, 0, 3): 7 * MIB}.get) == 3  # ckpt:2 unknown
    # Recomputing one of 4 blocks adds about 1/12 of a step; a saving under half that (1/24 of the
    # peak) cannot pay per GiB, one above it may.
    assert recompute_margin(4) == 1 / 24
    assert fold(4, lambda k: [9000, 8000, 5000, 2499, 2400][k.checkpoint_blocks]) == 3
    assert fold(4, lambda k: [9000, 8000, 5000, 2501, 2400][k.checkpoint_blocks]) == 4


def _cheap_recompute(k: Knobs) -> float:
    """The surface tests' rate, recomputing every block costing 4%, not 26%."""
    micro, low, ckpt = k.micro_batch_size, k.low_precision_blocks, k.checkpoint_blocks
    return 100.0 * 2 ** (0.2 * math.log2(micro)) * math.exp(0.5 * low / 4 - 0.04 * ckpt / 4)


def _refined_with_cheap_recompute(peak_of: Callable[[Knobs], int], known: Callable[[Knobs], int | None]) -> list[str]:
    """The notes of the refinement after the surface tests' nine trials (12 in all), measured at
    :func:`_cheap_recompute`'s rates and ``peak_of``'s peaks, with ``known`` the verified peaks."""
    from tests.search.test_surface import MEASURED

    study = _study(*((k, _cheap_recompute(k), peak_of(k) / MIB) for k in MEASURED))
    refine, notes = _refine(study, trials=12, known_peak=known)
    refine(study, study.trials[-1])
    return notes


def test_the_refinement_never_proposes_a_recompute_that_does_not_lower_the_verified_peak() -> None:
    # One recomputed block unverified (as blocks sharing a module are): the fitted peaks rank, and
    # their straight line takes the fourth recomputed block to lower the peak as the others do.
    def known(k: Knobs) -> int | None:
        return None if k.checkpoint_blocks == 1 else _last_block_saves_nothing(k)

    notes = _refined_with_cheap_recompute(_last_block_saves_nothing, known)
    # Without the rule: 2x8 bf16:4 ckpt:4, estimated 14333.0, the same verified peak as ckpt:3.
    assert notes == [
        "refining: next 1x16 bf16:4 ckpt:3, estimated 13921.0 per GiB by a surface through 9 trials, "
        "above trial 2 (the best so far)"
    ]
    # A neighbour recomputing one block more that lowers nothing is skipped: of 4x4 bf16:4 ckpt:3's
    # neighbours, 8x2, ckpt:2, the outer parts in bf16 and 2x8 are tried and ckpt:4 folds back to
    # ckpt:3 (the incumbent): one bf16 block fewer is next.
    lone = _study((_knobs(4, 4, 3), 100.0, 10.0), (_knobs(8, 4, 3), 1.0, 90.0), (_knobs(4, 4, 2), 1.0, 90.0))
    _add(lone, _knobs(2, 4, 3), rate=1.0, peak_mib=90.0)
    _add(lone, dataclasses.replace(_knobs(4, 4, 3), outer_low_precision=True), rate=1.0, peak_mib=90.0)
    refine, notes = _refine(lone, trials=6, known_peak=_last_block_saves_nothing)
    refine(lone, lone.trials[-1])
    assert notes == ["refining: next 4x4 bf16:3 ckpt:3, a neighbour of trial 0 (the best so far)"]


def test_the_verified_peaks_of_no_and_every_block_recomputed_bound_the_fitted_ones() -> None:
    from tests.search.test_surface import peak

    def two_save(k: Knobs) -> int:  # recomputing a third or fourth block saves nothing
        return peak(dataclasses.replace(k, checkpoint_blocks=min(k.checkpoint_blocks, 2)))

    # Verified only where every block is treated alike (blocks that are not a chain), so the
    # fitted peaks rank; the straight line puts every block recomputed below what it holds.
    def uniform(k: Knobs) -> int | None:
        return two_save(k) if k.checkpoint_blocks in (0, 4) else None

    notes = _refined_with_cheap_recompute(two_save, uniform)
    # Unbounded: 1x16 bf16:4 ckpt:4, estimated 13798.9 on a fitted peak below its verified one.
    assert notes == [
        "refining: next 1x16 bf16:4 ckpt:3, estimated 13609.8 per GiB by a surface through 9 trials, "
        "above trial 8 (the best so far)"
    ]


class _Duel:
    """Scripted side-by-side timings: the winner's index, and the configurations each call got."""

    def __init__(self, *winners: int, fail: bool = False) -> None:
        self.winners, self.fail = list(winners), fail
        self.calls: list[list[str]] = []

    def __call__(self, configs: list[TrainConfig], scales: list[float]) -> Retimed:
        self.calls.append([c.describe() for c in configs])
        if self.fail:
            raise MeasurementFailed("the measurement process died (exit code -9)")
        winner = self.winners.pop(0)
        timings = (Timing(rates=(10.0, 10.0)), Timing(rates=(10.0, 10.0)))
        return Retimed(
            timings=timings, ranking=(winner, 1 - winner), decided=True, rounds=3, warmup=(2, 2), other_cores=None
        )


def _lucky_incumbent() -> optuna.Study:
    """Trial 2 (8x2, every block in bf16) leads by its first stint; trial 3, its refinement (16x1),
    measured below it. 4 of 6 trials done: the last two refine (their start was timed already)."""
    study = _study((_knobs(4, 0, 0), 10.0, 40.0), (_knobs(2, 2, 2), 20.0, 45.0), (_knobs(8, 4, 0), 80.0, 60.0))
    _add(study, _knobs(16, 4, 0), rate=70.0, peak_mib=60.0, refined_from=2)
    _started(study)
    return study


def _started(study: optuna.Study) -> None:
    """The refinement's start timed already (no trial marked): its duels are the only ones left."""
    study.set_user_attr(REFINE_START, {"trials": [], "winner": None, "decided": True, "rounds": 0})


def _duel_refine(study: optuna.Study, duel: _Duel) -> list[str]:
    refine, notes = _refine(study, trials=6)
    refine.duel = duel
    refine(study, study.trials[-1])
    return notes


def test_a_refinement_that_beats_its_incumbent_side_by_side_is_the_next_incumbent() -> None:
    study, duel = _lucky_incumbent(), _Duel(1)
    notes = _duel_refine(study, duel)
    assert duel.calls == [[c.describe() for c in (SPACE.config(_knobs(8, 4, 0)), SPACE.config(_knobs(16, 4, 0)))]]
    assert duel.calls[0][0] == "micro x acc x ranks 8x2x1 | bf16 | ckpt none | ZeRO 0"
    assert study.trials[2].user_attrs[BEATEN_BY] == 3 and BEATEN_BY not in study.trials[3].user_attrs
    # Trial 3 leads now: its first untried neighbour (no larger micro-batch, nothing recomputed to
    # drop, every block in bf16) puts the outer parts in bf16 too.
    assert _waiting(study) == [
        (
            {"micro_batch_size": 16, "low_precision_blocks": 4, "outer_low_precision": True, "checkpoint_blocks": 0},
            {REFINED_FROM: 3},
        )
    ]
    assert notes[0] == "side by side: trial 3 beats trial 2 (decided, 3 rounds)"


def test_a_refinement_that_wins_its_duel_after_an_unlucky_first_stint_is_still_the_next_incumbent() -> None:
    # Trial 2 (8x2 bf16, 80 samples/s) leads trial 1 (4x1 bf16, 75) by first stints; its
    # refinement, trial 3 (16x1 bf16), had a slow first stint (70, below trial 1) and beat trial 2
    # side by side. Trial 1 was never timed beside either: trial 3 ranks as trial 2 did, ahead of it.
    study = _study((_knobs(4, 0, 0), 10.0, 60.0), (_knobs(4, 4, 0), 75.0, 60.0), (_knobs(8, 4, 0), 80.0, 60.0))
    _add(study, _knobs(16, 4, 0), rate=70.0, peak_mib=60.0, refined_from=2)
    _started(study)
    notes = _duel_refine(study, _Duel(1))
    assert study.trials[2].user_attrs[BEATEN_BY] == 3
    assert [u for _, u in _waiting(study)] == [{REFINED_FROM: 3}]
    assert notes[1] == "refining: next 16x1 bf16:4+outer, a neighbour of trial 3 (the best so far)"


def test_a_refinement_its_incumbent_beats_side_by_side_is_marked_and_the_incumbent_stays() -> None:
    study, duel = _lucky_incumbent(), _Duel(0)
    notes = _duel_refine(study, duel)
    assert study.trials[3].user_attrs[BEATEN_BY] == 2 and BEATEN_BY not in study.trials[2].user_attrs
    assert [u for _, u in _waiting(study)] == [{REFINED_FROM: 2}]
    assert notes[0] == "side by side: trial 2 beats trial 3 (decided, 3 rounds)"


def test_without_a_side_by_side_timing_first_measurements_decide() -> None:
    failing = _lucky_incumbent()
    notes = _duel_refine(failing, _Duel(fail=True))
    assert notes[0] == (
        "timing trial 3 beside trial 2 failed (the measurement process died (exit code -9)): first measurements stand"
    )
    unasked, duel = _lucky_incumbent(), _Duel(1)
    refine, _ = _refine(unasked, trials=6)  # no duel: --no-retime
    refine(unasked, unasked.trials[-1])
    for study in (failing, unasked):
        assert all(BEATEN_BY not in t.user_attrs for t in study.trials)
        assert [u for _, u in _waiting(study)] == [{REFINED_FROM: 2}]
    assert duel.calls == []


class _Retime:
    """A scripted side-by-side timing of the best trials: each configuration's rates over 3 rounds
    of 2 steps, and the configurations each call got."""

    def __init__(self, rates: dict[str, tuple[float, ...]], *, fail: bool = False) -> None:
        self.rates, self.fail = rates, fail
        self.calls: list[list[str]] = []

    def __call__(self, configs: list[TrainConfig], scales: list[float]) -> Retimed:
        self.calls.append([c.describe() for c in configs])
        if self.fail:
            raise MeasurementFailed("the measurement process died (exit code -9)")
        timings = tuple(Timing(rates=self.rates[c.describe()]) for c in configs)
        values = [t.median * v for t, v in zip(timings, scales, strict=True)]
        ranking = tuple(sorted(range(len(configs)), key=lambda i: -values[i]))
        return Retimed(timings=timings, ranking=ranking, decided=False, rounds=3, warmup=(2,) * 3, other_cores=None)


# Per GiB first: trial 1 (8x2 bf16:4 ckpt:4, 100 samples/s at 50 MiB) 2048, trial 2 (4x4, 90) 1843,
# trial 0 (16x1 fp32, 80 at 120 MiB) 683. Timed side by side, trial 2 leads both: trial 1 round
# by round (1229 per GiB), trial 0 within its spread (2005, 2304, 1707 per GiB against 2048,
# 2253, 1843).
START_RATES = {
    SPACE.config(_knobs(8, 4, 4)).describe(): (60.0,) * 6,
    SPACE.config(_knobs(4, 4, 4)).describe(): (100.0, 100.0, 110.0, 110.0, 90.0, 90.0),
    SPACE.config(_knobs(16, 0, 0)).describe(): (235.0, 235.0, 270.0, 270.0, 200.0, 200.0),
}


def test_before_the_first_refinement_the_best_trials_are_timed_side_by_side_and_the_winner_starts() -> None:
    study = _study(*POINTS)
    refine, notes = _refine(study, trials=4)  # 3 of 4 done: the last one refines
    retime = _Retime(START_RATES)
    refine.duel = retime
    refine(study, study.trials[-1])
    assert retime.calls == [[SPACE.config(k).describe() for k in (_knobs(8, 4, 4), _knobs(4, 4, 4), _knobs(16, 0, 0))]]
    attrs = [t.user_attrs for t in study.trials[:3]]  # the measured trials, not the enqueued refinement
    assert [(a.get(BEATEN_BY), a.get(ATTR.BEATEN_DECIDED)) for a in attrs] == [(2, False), (2, True), (None, None)]
    assert study.user_attrs[REFINE_START] == {"trials": [1, 2, 0], "winner": 2, "decided": False, "rounds": 3}
    assert [u for _, u in _waiting(study)] == [{REFINED_FROM: 2}]
    assert notes == [
        "before refining, trials [1, 2, 0] side by side: trial 2 leads (too close to call: within each other's "
        "spread, 3 rounds)",
        "refining: next 4x4 bf16:4 ckpt:3, a neighbour of trial 2 (the best so far)",
    ]
    refine(study, study.trials[-1])  # timed once: a later call (a resumed study) does not time it again
    assert len(retime.calls) == 1


def test_a_start_that_cannot_be_timed_is_recorded_and_first_measurements_stand() -> None:
    study = _study(*POINTS)
    refine, notes = _refine(study, trials=4)
    refine.duel = _Retime(START_RATES, fail=True)
    refine(study, study.trials[-1])
    assert study.user_attrs[REFINE_START] == {
        "trials": [1, 2, 0],
        "failed": "the measurement process died (exit code -9)",
    }
    assert all(BEATEN_BY not in t.user_attrs for t in study.trials)
    assert [u for _, u in _waiting(study)] == [{REFINED_FROM: 1}]
    assert notes[0] == (
        "timing trials [1, 2, 0] side by side failed (the measurement process died (exit code -9)): "
        "first measurements stand"
    )


def test_under_throughput_the_incumbent_is_the_fastest_trial_within_the_budget() -> None:
    # Trial 0 is the fastest (150 samples/s at 120 MiB: 1280 per GiB); trial 1 the best per GiB (2048).
    points = ((_knobs(16, 0, 0), 150.0, 120.0), POINTS[1], POINTS[2])
    refined = {}
    for objective in ("per-gib", "throughput"):
        study = _study(*points)
        study.set_user_attr("spec", spec_to_dict(StudySpec(workload="tiny", objective=objective)))  # type: ignore[arg-type]
        refine, notes = _refine(study, trials=4)
        refine(study, study.trials[-1])
        refined[objective] = (_waiting(study)[0][1][REFINED_FROM], notes)
    assert refined["per-gib"] == (1, ["refining: next 16x1 bf16:4 ckpt:4, a neighbour of trial 1 (the best so far)"])
    assert refined["throughput"] == (0, ["refining: next 16x1 bf16:1, a neighbour of trial 0 (the best so far)"])
