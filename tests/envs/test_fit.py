"""Fitting the simulator's time terms to measured configurations (a study's trials)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from autotune.envs.calibration import load_profile
from autotune.envs.fit import MeasuredConfig, fit_time_terms, simulated_throughput, throughput_error
from autotune.envs.simulated import PROFILE_DIR

from autotune.config import TrainConfig
from autotune.errors import ConfigError

PROFILE = load_profile(PROFILE_DIR / "gpt-tiny.json")  # 6 blocks, batch 32
CONFIGS = [
    TrainConfig(micro_batch_size=32),
    TrainConfig(micro_batch_size=8, grad_accum_steps=4),
    TrainConfig(micro_batch_size=4, grad_accum_steps=8, checkpoint=True),
    TrainConfig(micro_batch_size=16, grad_accum_steps=2, precision=("bf16", "fp32", "fp32", "fp32", "fp32", "bf16")),
    TrainConfig(micro_batch_size=2, grad_accum_steps=16, precision="bf16", checkpoint=(True,) * 3 + (False,) * 3),
]


def _truth() -> list[MeasuredConfig]:
    """What another machine measured: a slower step, cheaper samples, slower bf16, costlier recompute."""
    other = dataclasses.replace(
        PROFILE,
        step_fixed_seconds=3 * PROFILE.step_fixed_seconds + 0.01,
        micro_seconds_per_sample=0.5 * PROFILE.micro_seconds_per_sample,
        reduced_slowdown=2 * PROFILE.reduced_slowdown,
        recompute_fraction=1.0,
    )
    return [MeasuredConfig(config=c, throughput=simulated_throughput(other, c)) for c in CONFIGS]


def test_fitting_recovers_the_measured_throughput() -> None:
    measured = _truth()
    before = throughput_error(PROFILE, measured)
    fitted = fit_time_terms(PROFILE, measured)
    after = throughput_error(fitted, measured)
    assert before > 0.2 and after < 0.02, (before, after)
    assert fitted.recompute_fraction == 1.0
    # Memory and the per-block shares are the calibrated ones.
    assert (fitted.peak_table, fitted.blocks, fitted.blocks_fraction) == (
        PROFILE.peak_table,
        PROFILE.blocks,
        PROFILE.blocks_fraction,
    )


def test_what_the_trials_cannot_identify_keeps_its_calibrated_value() -> None:
    fp32 = [m for m in _truth() if m.config.precision == "fp32"]  # no bf16 trial: the slowdown is unseen
    assert fit_time_terms(PROFILE, fp32).reduced_slowdown == PROFILE.reduced_slowdown


def test_the_calibrated_profile_is_kept_when_it_already_fits() -> None:
    measured = [MeasuredConfig(config=c, throughput=simulated_throughput(PROFILE, c)) for c in CONFIGS]
    assert throughput_error(fit_time_terms(PROFILE, measured), measured) <= throughput_error(PROFILE, measured)


@pytest.mark.parametrize(
    ("measured", "message"),
    [
        (_truth()[:2], "fitting the time terms needs at least 3 measured configurations, but got 2."),
        (
            [*_truth()[:2], MeasuredConfig(config=TrainConfig(micro_batch_size=8, precision="fp16"), throughput=1.0)],
            "measured configurations may use fp32 and bf16 only, "
            "but got micro x acc x ranks 8x1x1 | fp16 | ckpt none | ZeRO 0.",
        ),
        (
            [*_truth()[:2], MeasuredConfig(config=TrainConfig(micro_batch_size=8), throughput=0.0)],
            "measured throughput must be a positive number, but got 0.0.",
        ),
    ],
)
def test_bad_measurements_are_refused(measured: list[MeasuredConfig], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        fit_time_terms(PROFILE, measured)


def test_a_profile_with_its_own_fixed_factor_is_fit_on_its_per_sample_factor_and_keeps_the_fixed_one() -> None:
    # A GPU-like profile: bf16 4x faster per sample, as fast per micro-batch; the trials measured
    # bf16 2x slower per sample than that (another card): the fit finds it, the fixed factor stays.
    gpu = dataclasses.replace(PROFILE, reduced_slowdown=0.25, reduced_fixed_slowdown=1.0, micro_fixed_seconds=0.01)
    other = dataclasses.replace(gpu, reduced_slowdown=0.5)
    measured = [MeasuredConfig(config=c, throughput=simulated_throughput(other, c)) for c in CONFIGS]
    fitted = fit_time_terms(gpu, measured)
    assert throughput_error(gpu, measured) > 0.05 and throughput_error(fitted, measured) < 1e-6
    assert (fitted.reduced_slowdown, fitted.reduced_fixed_slowdown) == (pytest.approx(0.5), 1.0)
