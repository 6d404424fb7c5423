"""The one objective: value (throughput, goodput when the batch is a knob) per GiB of peak, and the
value itself under the ``throughput`` objective."""

from __future__ import annotations

import math
import re

import pytest

from autotune.errors import ConfigError, SpecError
from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.objective import (
    GIB,
    OBJECTIVES,
    check_objective,
    format_value,
    objective_value,
    per_gib,
    score,
)


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


def test_per_gib_ranks_by_value_per_gib_and_throughput_by_the_value_itself() -> None:
    small = score(
        throughput=100.0, peak_bytes=GIB, batch_size=8, base_batch_size=8, noise_scale=None, batch_is_knob=False
    )
    large = score(
        throughput=150.0, peak_bytes=2 * GIB, batch_size=8, base_batch_size=8, noise_scale=None, batch_is_knob=False
    )
    assert (small.under("per-gib"), large.under("per-gib")) == (100.0, 75.0)  # the smaller peak wins
    assert (small.under("throughput"), large.under("throughput")) == (100.0, 150.0)  # the faster one wins
    assert objective_value(150.0, 2 * GIB, "per-gib") == large.per_gib == 75.0
    assert (format_value(75.0, "per-gib"), format_value(150.0, "throughput")) == ("75.0 per GiB", "150.0 samples/s")


def test_goodput_is_what_throughput_ranks_when_the_batch_is_a_knob() -> None:
    s = score(throughput=300.0, peak_bytes=GIB, batch_size=64, base_batch_size=16, noise_scale=16.0, batch_is_knob=True)
    assert s.under("throughput") == s.value == 300.0 * 32 / 80


def test_an_objective_is_checked_with_the_error_the_caller_names() -> None:
    assert OBJECTIVES == ("per-gib", "throughput")
    assert check_objective("throughput") == "throughput"
    message = "objective must be one of ('per-gib', 'throughput'), but got 'fast'."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_objective("fast")
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        check_objective("fast", error=SpecError)
