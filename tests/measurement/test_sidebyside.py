"""Warm-up until steps settle, medians with their spread, and side-by-side re-timing, decided on
scripted step times (never on the wall clock)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator

import pytest

from autotune.measurement.sidebyside import (
    Timing,
    busy_note,
    paired_ratio,
    retime,
    round_values,
    separated,
    separated_by_rounds,
    warm_up,
)


def _script(*seconds: float) -> Callable[[], float]:
    it: Iterator[float] = iter(seconds)
    return lambda: next(it)


def test_warm_up_runs_until_two_successive_steps_agree() -> None:
    # 3.0 (kernels compiled), 1.3, 1.05, 1.0: the last two agree within 10%
    assert warm_up(_script(3.0, 1.3, 1.05, 1.0, 1.0), minimum=1, cap=6) == 4
    assert warm_up(_script(1.0, 1.05), minimum=1, cap=6) == 2
    assert warm_up(_script(5.0, 4.0, 3.0, 2.0, 1.0, 0.5, 0.1), minimum=1, cap=6) == 6  # capped
    assert warm_up(_script(1.0, 1.0, 1.0, 1.0), minimum=3, cap=6) == 3


def test_warm_up_refuses_a_minimum_above_the_cap() -> None:
    msg = "warm_up: 1 <= minimum <= cap must hold, but got minimum=4, cap=3."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        warm_up(lambda: 1.0, minimum=4, cap=3)


def test_a_timing_is_a_median_with_its_median_absolute_deviation() -> None:
    t = Timing(rates=(10.0, 12.0, 11.0, 30.0, 9.0))
    assert (t.median, t.mad) == (11.0, 1.0)
    assert t.relative_spread == 1.0 / 11.0
    assert Timing(rates=(5.0,)).mad == 0.0


def test_separated_needs_the_margin_and_a_gap_larger_than_both_spreads() -> None:
    steady_a, steady_b = Timing(rates=(110.0, 110.0, 110.0)), Timing(rates=(100.0, 100.0, 100.0))
    assert separated(steady_a, steady_b, margin=0.03) and not separated(steady_b, steady_a)
    noisy_a = Timing(rates=(90.0, 110.0, 130.0))  # median 110, MAD 20: the 10 gap is noise
    assert not separated(noisy_a, steady_b)
    # per GiB: a has twice the throughput but three times the peak
    assert separated(steady_b, steady_a, scale_a=1.0, scale_b=1 / 3)
    assert not separated(steady_a, steady_b, margin=0.2)


def _rounds(*values: float, per: int = 2) -> Timing:
    """A timing of one value per round, each round ``per`` equal steps."""
    return Timing(rates=tuple(v for v in values for _ in range(per)))


def test_separated_by_rounds_pairs_each_round_with_the_same_round_of_the_other() -> None:
    # The machine drifts 80 -> 130 for both; a is 5% ahead in every round.
    machine = (80.0, 130.0, 95.0, 120.0)
    a, b = _rounds(*(1.05 * v for v in machine)), _rounds(*machine)
    assert not separated(a, b)  # unpaired, the drift is counted as both spreads
    assert separated_by_rounds(a, b, rounds=4) and not separated_by_rounds(b, a, rounds=4)
    assert not separated_by_rounds(a, b, rounds=4, margin=0.06)
    # per GiB: a at 1.1x the peak falls behind
    assert separated_by_rounds(b, a, rounds=4, scale_a=1.0, scale_b=1 / 1.1)
    # The same medians, rounds in another order: 1.10x, 1.28x, 0.95x round by round is noise.
    assert not separated_by_rounds(_rounds(140.8, 150.8, 130.8), _rounds(128.0, 118.0, 138.0), rounds=3)


def test_separated_by_rounds_is_a_one_sided_paired_t_test_at_95_percent() -> None:
    b = _rounds(100.0, 100.0, 100.0)
    # log-ratios 0.1, 0.2, 0.3: mean 0.2, standard error 0.1 / sqrt(3): t = 3.46 > 2.920 (2 df)
    assert separated_by_rounds(_rounds(*(100 * math.exp(q) for q in (0.1, 0.2, 0.3))), b, rounds=3)
    # 0.0, 0.2, 0.4: t = 1.73
    assert not separated_by_rounds(_rounds(*(100 * math.exp(q) for q in (0.0, 0.2, 0.4))), b, rounds=3)
    # Each round's value is the median of its steps: one stalled step of three changes nothing.
    stalled = Timing(rates=(110.0, 110.0, 11.0, 110.0, 110.0, 110.0))
    assert separated_by_rounds(stalled, Timing(rates=(100.0,) * 6), rounds=2)
    # One round: no spread to pair, the unpaired rule decides.
    assert separated_by_rounds(Timing(rates=(110.0,) * 2), Timing(rates=(100.0,) * 2), rounds=1)


def test_a_paired_ratio_is_the_geometric_mean_of_the_rounds_ratios() -> None:
    # Round medians: a 110, 220 (one stalled step in round 2 of three); b 100, 200.
    a, b = Timing(rates=(110.0, 110.0, 110.0, 220.0, 22.0, 220.0)), Timing(rates=(100.0,) * 3 + (200.0,) * 3)
    assert round_values(a, 2) == (110.0, 220.0)
    assert paired_ratio(a, b, rounds=2) == pytest.approx(1.1)
    # per GiB: a at twice the peak
    assert paired_ratio(a, b, rounds=2, scale_a=0.5) == pytest.approx(0.55)
    # rounds 1.21x, 1.0x, 1.0x: the cube root of 1.21, where the ratio of the two medians says 1.0
    c, d = _rounds(121.0, 100.0, 100.0), _rounds(100.0, 100.0, 100.0)
    assert paired_ratio(c, d, rounds=3) == pytest.approx(1.21 ** (1 / 3))
    assert c.median / d.median == 1.0
    assert paired_ratio(a, Timing(rates=(0.0,) * 6), rounds=2) == 0.0
    with pytest.raises(ValueError, match=re.escape("round_values: 4 rounds of equally many steps, but got 6 rates.")):
        round_values(a, 4)


def test_separated_by_rounds_refuses_rates_that_are_not_in_rounds() -> None:
    msg = "separated_by_rounds: both timings must hold 3 rounds of equally many steps, but got 6 and 4 rates."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        separated_by_rounds(Timing(rates=(1.0,) * 6), Timing(rates=(1.0,) * 4), rounds=3)


class _Config:
    """A configuration whose steps take scripted seconds (8 samples a step)."""

    def __init__(self, *seconds: float) -> None:
        self.seconds = list(seconds)
        self.ran = 0

    def step(self) -> tuple[int, float]:
        s = self.seconds[min(self.ran, len(self.seconds) - 1)]
        self.ran += 1
        return 8, s


def test_retime_interleaves_rounds_and_picks_the_best_value() -> None:
    fast, slow = _Config(2.0, 0.1), _Config(2.0, 0.2)  # first step compiles, then steady
    r = retime([slow.step, fast.step], rounds=3, max_rounds=6, steps_per_round=2)
    assert r.warmup == (3, 3)  # 2.0, 0.x, 0.x: the last two agree
    assert (r.rounds, r.ranking, r.winner, r.decided) == (3, (1, 0), 1, True)
    assert r.timings[1].rates == (80.0,) * 6 and r.timings[0].rates == (40.0,) * 6
    # per GiB: the fast one at 3x the peak loses
    r = retime([slow.step, fast.step], scales=[1.0, 1 / 3], rounds=2)
    assert r.ranking == (0, 1)


def test_retime_adds_rounds_while_the_two_best_are_within_their_spreads() -> None:
    # Both alternate 0.1 / 0.12 s: medians equal, never separated: all six rounds, undecided.
    a, b = _Config(0.1, 0.1, 0.1, 0.12, 0.1, 0.12), _Config(0.1, 0.1, 0.1, 0.12, 0.1, 0.12)
    a.seconds += [0.1, 0.12] * 20
    b.seconds += [0.1, 0.12] * 20
    r = retime([a.step, b.step], rounds=2, max_rounds=6, steps_per_round=2)
    assert (r.rounds, r.decided) == (6, False)
    assert len(r.timings[0].rates) == 12


def test_retime_decides_round_by_round_on_a_drifting_machine() -> None:
    # Every step of both slows by a third each round (the machine, not the configurations); a
    # steady 10% apart. Unpaired, the drift is each one's spread: undecided after six rounds.
    drift = [0.1 * (4 / 3) ** (k // 2) for k in range(40)]
    a, b = _Config(*drift), _Config(*(1.1 * s for s in drift))
    r = retime([a.step, b.step], rounds=3, max_rounds=6, steps_per_round=2, warmup_cap=2)
    assert (r.rounds, r.winner, r.decided) == (3, 0, True)
    assert not separated(r.timings[0], r.timings[1])


def test_retime_refuses_bad_rounds() -> None:
    msg = "retime: 1 <= rounds <= max_rounds must hold, but got rounds=4, max_rounds=3."
    with pytest.raises(ValueError, match=f"^{re.escape(msg)}$"):
        retime([_Config(1.0).step], rounds=4, max_rounds=3)


def test_a_busy_machine_is_said_in_one_line() -> None:
    assert busy_note(0.2, threads=2, cores=2) is None
    assert busy_note(None, threads=2, cores=2) is None
    assert busy_note(0.5, threads=1, cores=2) == "busy machine: other processes used 0.5 of 2 cores while timing"
    # one thread already: no fewer threads to suggest
    assert busy_note(1.8, threads=1, cores=2) == "busy machine: other processes used 1.8 of 2 cores while timing"
    assert busy_note(1.0, threads=2, cores=2) == (
        "busy machine: other processes used 1.0 of 2 cores while timing; 2 threads oversubscribe the cores "
        "(fewer threads, e.g. --threads 1, time steadier)"
    )
