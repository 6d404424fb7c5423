"""The one objective: value (throughput, goodput when the batch is a knob) per GiB of peak."""

from __future__ import annotations

import math

import pytest

from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.objective import GIB, per_gib, score


def test_at_the_users_batch_the_value_is_the_throughput_per_gib() -> None:
    s = score(
        throughput=300.0, peak_bytes=GIB // 4, batch_size=32, base_batch_size=32, noise_scale=8.0, batch_is_knob=False
    )
    assert (s.value, s.efficiency, s.per_gib) == (300.0, 1.0, 1200.0)
    assert s.log_per_gib == math.log(1200.0)


def test_when_the_batch_is_a_knob_the_value_is_goodput() -> None:
    s = score(throughput=300.0, peak_bytes=GIB, batch_size=64, base_batch_size=16, noise_scale=16.0, batch_is_knob=True)
    efficiency = statistical_efficiency(batch_size=64, base_batch_size=16, noise_scale=16.0)
    assert efficiency == 32 / 80
    assert (s.efficiency, s.value, s.per_gib) == (efficiency, 300.0 * efficiency, 300.0 * efficiency)
    # The same measurement at a fixed batch reports the efficiency but is judged by throughput.
    fixed = score(
        throughput=300.0, peak_bytes=GIB, batch_size=64, base_batch_size=16, noise_scale=16.0, batch_is_knob=False
    )
    assert (fixed.efficiency, fixed.value) == (efficiency, 300.0)


def test_no_progress_scores_very_low_not_minus_infinity() -> None:
    s = score(throughput=0.0, peak_bytes=GIB, batch_size=8, base_batch_size=8, noise_scale=None, batch_is_knob=False)
    assert s.log_per_gib == math.log(1e-12)


def test_a_peak_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^peak_bytes must be > 0, but got 0\.$"):
        per_gib(1.0, 0)
