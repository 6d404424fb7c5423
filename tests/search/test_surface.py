"""The response surface a study's refinement may jump along: fitted on scripted measurements from
a known surface, it must give back that surface's values and its best point exactly."""

from __future__ import annotations

import math

import pytest

from autotune.knobs import Knobs
from autotune.search.space import SearchSpace
from autotune.search.surface import MIN_POINTS, fit_surface, ranked

MIB = 2**20
SPACE = SearchSpace(batch_sizes=(16,), ranking=(0, 1, 2, 3), max_micro_batch=16)


def _knobs(micro: int, low: int, ckpt: int) -> Knobs:
    return Knobs(batch_size=16, micro_batch_size=micro, low_precision_blocks=low, checkpoint_blocks=ckpt)


def rate(k: Knobs) -> float:
    """x1.15 per doubling of the micro-batch, x1.65 with every block in bf16, x0.74 all recomputed."""
    return (
        100.0
        * 2 ** (0.2 * math.log2(k.micro_batch_size))
        * math.exp(0.5 * k.low_precision_blocks / 4 - 0.3 * k.checkpoint_blocks / 4)
    )


def peak(k: Knobs) -> int:
    """10 MiB fixed, 4 MiB of activations per sample, less 1 MiB in bf16 and 2 MiB recomputed."""
    m = k.micro_batch_size
    return round(10 * MIB + m * (4 * MIB - MIB * k.low_precision_blocks / 4 - 2 * MIB * k.checkpoint_blocks / 4))


#: Nine trials, as a 12-trial study has measured before its refinement.
MEASURED = [
    _knobs(16, 0, 0),
    _knobs(8, 4, 4),
    _knobs(4, 4, 4),
    _knobs(2, 0, 4),
    _knobs(8, 2, 2),
    _knobs(4, 0, 0),
    _knobs(16, 4, 0),
    _knobs(1, 2, 4),
    _knobs(2, 4, 1),
]


def test_a_surface_through_exact_measurements_gives_back_every_point_of_the_space() -> None:
    surface = fit_surface([(k, rate(k), peak(k)) for k in MEASURED], num_blocks=4)
    assert surface is not None and surface.points == 9
    for k in SPACE.variants(_knobs(16, 0, 0)):  # 5 micro-batches x 5 x 5 counts
        estimate = surface.estimate(k)
        assert estimate is not None
        assert estimate.objective == pytest.approx(rate(k), rel=1e-9)
        assert estimate.peak_bytes == pytest.approx(peak(k), rel=1e-9)
    best = ranked(surface, SPACE.variants(_knobs(16, 0, 0)))
    truth = sorted(SPACE.variants(_knobs(16, 0, 0)), key=lambda k: -rate(k) / peak(k))
    assert [e.knobs for e in best[:3]] == truth[:3] == [_knobs(1, 4, 0), _knobs(1, 4, 1), _knobs(2, 4, 0)]
    assert best[0].knobs not in MEASURED  # the far corner, four moves from the best measured point


def test_the_budget_and_a_known_peak_decide_what_fits() -> None:
    surface = fit_surface([(k, rate(k), peak(k)) for k in MEASURED], num_blocks=4)
    assert surface is not None
    space = SPACE.variants(_knobs(16, 0, 0))
    # 1x16 bf16:4 is estimated at 13 MiB; a memory model that knows it needs 1 GiB rules it out.
    known = {_knobs(1, 4, 0): 2**30}
    best = ranked(surface, space, known_peak=known.get, budget_bytes=64 * MIB)
    assert best[0].knobs == _knobs(1, 4, 1)
    assert all(e.peak_bytes <= 64 * MIB for e in best)
    assert len(best) == sum(1 for k in space if peak(k) <= 64 * MIB) - 1


def test_verified_peaks_bound_a_fitted_peak_and_never_a_known_one() -> None:
    surface = fit_surface([(k, rate(k), peak(k)) for k in MEASURED], num_blocks=4)
    assert surface is not None
    k = _knobs(8, 0, 4)
    free = surface.estimate(k)
    assert free is not None and free.peak_bytes == pytest.approx(peak(k), rel=1e-9)
    floored = surface.estimate(k, bounds=(peak(k) + MIB, None))
    capped = surface.estimate(k, bounds=(None, peak(k) - MIB))
    assert floored is not None and floored.peak_bytes == peak(k) + MIB
    assert floored.per_gib == pytest.approx(free.per_gib * peak(k) / (peak(k) + MIB))
    assert capped is not None and capped.peak_bytes == peak(k) - MIB
    known = surface.estimate(k, peak_bytes=5 * MIB, bounds=(6 * MIB, None))
    assert known is not None and known.peak_bytes == 5 * MIB
    # ranked() asks for each candidate's bounds only where it has no known peak.
    asked: list[Knobs] = []

    def bounds(knobs: Knobs) -> tuple[int | None, int | None]:
        asked.append(knobs)
        return (peak(knobs) + MIB, None)

    best = ranked(surface, [k, _knobs(8, 0, 3)], known_peak={k: peak(k)}.get, peak_bounds=bounds)
    assert asked == [k, _knobs(8, 0, 3)]  # bounds are asked for; a known peak ignores them
    assert {e.knobs: e.peak_bytes for e in best} == {k: peak(k), _knobs(8, 0, 3): peak(_knobs(8, 0, 3)) + MIB}


def test_a_knob_that_never_varied_has_no_coefficient_and_too_few_points_no_surface() -> None:
    all_fp32 = [_knobs(m, 0, c) for m, c in ((16, 0), (8, 4), (4, 4), (2, 0), (8, 2), (4, 0))]
    surface = fit_surface([(k, rate(k), peak(k)) for k in all_fp32], num_blocks=4)
    assert surface is not None and surface.varied == (True, False, True)
    assert surface.estimate(_knobs(1, 0, 0)) is not None
    assert surface.estimate(_knobs(1, 2, 0)) is None  # bf16 was never measured
    few = [(k, rate(k), peak(k)) for k in MEASURED[: MIN_POINTS - 1]]
    assert fit_surface(few, num_blocks=4) is None
    # Six points that all share a micro-batch and vary the rest together determine nothing.
    collinear = [_knobs(8, n, n) for n in range(4)] + [_knobs(8, 4, 4), _knobs(8, 0, 0)]
    assert fit_surface([(k, rate(k), peak(k)) for k in collinear], num_blocks=4) is None


def test_under_throughput_the_fastest_point_within_the_budget_ranks_first() -> None:
    surface = fit_surface([(k, rate(k), peak(k)) for k in MEASURED], num_blocks=4)
    assert surface is not None
    space = SPACE.variants(_knobs(16, 0, 0))
    # The fastest point of the space is 16x1 with every block in bf16, none recomputed: 10 + 16 x 3 MiB.
    best = ranked(surface, space, objective="throughput")
    assert best[0].knobs == _knobs(16, 4, 0) and best[0].under("throughput") == pytest.approx(rate(_knobs(16, 4, 0)))
    # Under a 40 MiB budget it does not fit (58 MiB): 8x2 bf16:4 does (34 MiB), the fastest that fits.
    within = ranked(surface, space, budget_bytes=40 * MIB, objective="throughput")
    truth = max((k for k in space if peak(k) <= 40 * MIB), key=rate)
    assert within[0].knobs == truth == _knobs(8, 4, 0)
