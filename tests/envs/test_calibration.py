"""Solving the simulator's time terms from measured step times (``calibrate``, ``fit_time_terms``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from autotune.envs.calibration import relative_nnls


def _rows(splits: list[tuple[int, int]]) -> np.ndarray:
    """t = t_fixed + k * (t_mf + b * t_ps) for (b, k) splits: calibrate's fp32 rows."""
    return np.array([[1.0, k, k * b] for b, k in splits], dtype=float)


def test_exact_step_times_give_back_the_time_terms() -> None:
    truth = np.array([0.015, 0.008, 0.0096])  # a step, a micro-batch, a sample (seconds)
    rows = _rows([(8, 1), (32, 1), (8, 2), (1, 4)])
    assert relative_nnls(rows, rows @ truth) == pytest.approx(truth, rel=1e-9)


def test_terms_stay_non_negative() -> None:
    # Step times where one-sample micro-batches are cheaper than their samples alone (noise):
    # unconstrained least squares answers a negative per-micro-batch cost; the fit pins it at 0.
    rows = _rows([(8, 1), (32, 1), (8, 2), (1, 4)])
    seconds = rows @ np.array([0.01, -0.002, 0.01])
    x = rows / seconds[:, None]
    assert np.linalg.lstsq(x, np.ones(4), rcond=None)[0][1] < 0
    theta = relative_nnls(rows, seconds)
    assert theta[1] == 0.0 and np.all(theta >= 0)
    assert np.max(np.abs(rows @ theta / seconds - 1)) < 0.05


def test_a_nan_loss_is_refused_before_anything_is_calibrated() -> None:
    from autotune.envs.calibration import calibrate

    from autotune.errors import NonFiniteLossError
    from autotune.resolve import load_workload
    from tests.paths import NAN_WORKLOAD

    message = "nan-net: the default configuration's loss is nan at step 1: nothing to calibrate"
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        calibrate(load_workload(f"{NAN_WORKLOAD}:build"), curve_steps=2, timing_rounds=1)
