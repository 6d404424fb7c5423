"""Pollux's statistical efficiency (B_noise + B0) / (B_noise + B)."""

from __future__ import annotations

import pytest

from autotune.measurement.goodput import statistical_efficiency


def test_efficiency_at_the_reference_batch_is_one() -> None:
    assert statistical_efficiency(batch_size=32, base_batch_size=32, noise_scale=10.0) == 1.0


def test_efficiency_falls_past_the_noise_scale() -> None:
    assert statistical_efficiency(batch_size=128, base_batch_size=32, noise_scale=32.0) == pytest.approx(64 / 160)
    assert statistical_efficiency(batch_size=16, base_batch_size=32, noise_scale=16.0) == pytest.approx(48 / 32)


def test_unknown_noise_scale_means_noise_dominates() -> None:
    assert statistical_efficiency(batch_size=128, base_batch_size=32, noise_scale=None) == 1.0


def test_batch_sizes_must_be_positive() -> None:
    with pytest.raises(ValueError, match=r"^batch_size and base_batch_size must be >= 1, but got \(0, 32\)\.$"):
        statistical_efficiency(batch_size=0, base_batch_size=32, noise_scale=1.0)
