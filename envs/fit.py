"""Fitting a calibrated profile's time terms to measured configurations (a finished study's trials).

``calibrate`` solves the simulator's time model from seven step times measured in this process;
a study measured many more configurations, in its own measuring process (with its own thread
count), at the configurations that matter. :func:`fit_time_terms` refits the model's per-model
time terms to them, minimizing the squared log-ratio of simulated to measured throughput:

* the three linear terms (per-step fixed, per-micro-batch fixed and per-sample seconds, all >= 0)
  by non-negative least squares on the relative step-time errors (the log-ratios to first
  order), for each candidate pair of
* the reduced-precision slowdown and the recompute fraction, searched on a log grid around the
  calibrated values (a term the trials cannot identify, e.g. the slowdown of a study with no
  bf16 trial, stays at its calibrated value: ties go to the grid point nearest to it).

The calibrated profile itself is one candidate of that search, so the fitted profile's error on
the trials is never larger. The blocks' share of a micro-batch's time and each block's share are
kept (per-block forward times measured with hooks; the trials, whole steps, cannot split them),
and so is the peak-memory table (the memory model's prediction, exact to a few hundred bytes).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from autotune.envs.calibration import WorkloadProfile, relative_nnls
from autotune.envs.costmodel import step_seconds

from autotune.config import TrainConfig
from autotune.errors import ConfigError

__all__ = ["MeasuredConfig", "fit_time_terms", "simulated_throughput", "throughput_error"]

_GRID = np.exp(np.linspace(math.log(1 / 8), math.log(8), 25))  # multipliers around the calibrated value
_RECOMPUTE_GRID = np.linspace(0.0, 3.0, 31)  # absolute recompute fractions (a calibrated 0 has no scale)


class MeasuredConfig(NamedTuple):
    """A configuration and the throughput (samples/s of its effective batch) measured for it."""

    config: TrainConfig
    throughput: float


class _BlockSets(NamedTuple):
    reduced: frozenset[int]
    recomputed: frozenset[int]
    selective: frozenset[int]
    outer: bool


def _block_sets(profile: WorkloadProfile, config: TrainConfig) -> _BlockSets:
    """``config``'s blocks in reduced precision, recomputed whole and selectively, and whether its
    outer parts are reduced: what the time model (``step_seconds``) times, as the simulator does."""
    n = len(profile.blocks)
    levels = config.checkpoint_levels(n)
    return _BlockSets(
        reduced=frozenset(i for i, p in enumerate(config.block_precisions(n)) if p != "fp32"),
        recomputed=frozenset(i for i, c in enumerate(levels) if c == "full"),
        selective=frozenset(i for i, c in enumerate(levels) if c == "selective"),
        outer=config.outer_precision != "fp32",
    )


def simulated_throughput(profile: WorkloadProfile, config: TrainConfig) -> float:
    """Samples/s the profile's time model gives ``config`` (one rank, its exact per-block knobs,
    selective recompute and outer precision included)."""
    seconds = step_seconds(
        profile,
        micro_batch_size=config.micro_batch_size,
        accum_steps=config.grad_accum_steps,
        **_block_sets(profile, config)._asdict(),
    )
    return config.effective_batch_size / seconds


def throughput_error(profile: WorkloadProfile, measured: Sequence[MeasuredConfig]) -> float:
    """Root mean square over ``measured`` of log(simulated / measured throughput): symmetric, so
    a trial measured 3x slower than usual (a shared machine) weighs as much as one 3x faster;
    ``exp`` of it is the typical factor the simulator is off by."""
    errors = [math.log(simulated_throughput(profile, m.config) / m.throughput) for m in measured]
    return math.sqrt(sum(e * e for e in errors) / len(errors))


def _check(profile: WorkloadProfile, measured: Sequence[MeasuredConfig]) -> None:
    if len(measured) < 3:
        raise ConfigError(f"fitting the time terms needs at least 3 measured configurations, but got {len(measured)}.")
    for m in measured:
        c = m.config
        if c.ranks != 1 or c.zero_stage != 0:
            raise ConfigError(f"measured configurations must run on one rank without ZeRO, but got {c.describe()}.")
        if any(p not in ("fp32", profile.reduced) for p in c.block_precisions(len(profile.blocks))):
            raise ConfigError(
                f"measured configurations may use fp32 and {profile.reduced} only, but got {c.describe()}."
            )
        if not (math.isfinite(m.throughput) and m.throughput > 0):
            raise ConfigError(f"measured throughput must be a positive number, but got {m.throughput!r}.")


def fit_time_terms(profile: WorkloadProfile, measured: Sequence[MeasuredConfig]) -> WorkloadProfile:
    """``profile`` with its time terms refit to ``measured`` (see the module docstring)."""
    _check(profile, measured)
    seconds = np.array([m.config.effective_batch_size / m.throughput for m in measured])
    best: tuple[float, WorkloadProfile] = (_loss(profile, measured), profile)
    # The per-sample factor only (a fixed one, where the profile has its own, stays calibrated:
    # the trials, at the study's micro-batches, say little of a micro-batch of one).
    slowdowns = [profile.reduced_slowdown * float(g) for g in _GRID]
    recomputes = sorted({profile.recompute_fraction, *(float(r) for r in _RECOMPUTE_GRID)})
    for slowdown, recompute in itertools.product(slowdowns, recomputes):
        candidate = dataclasses.replace(profile, reduced_slowdown=slowdown, recompute_fraction=recompute)
        fitted = _fit_linear(candidate, seconds, measured)
        loss = _loss(fitted, measured) + _prior(profile, fitted)
        if loss < best[0]:
            best = (loss, fitted)
    return best[1]


def _prior(calibrated: WorkloadProfile, p: WorkloadProfile) -> float:
    """A tie-breaker, small against any real error: the grid point nearest the calibrated values."""
    far = math.log(p.reduced_slowdown / calibrated.reduced_slowdown) ** 2
    far += math.log((1 + p.recompute_fraction) / (1 + calibrated.recompute_fraction)) ** 2
    return 1e-9 * far


def _loss(p: WorkloadProfile, measured: Sequence[MeasuredConfig]) -> float:
    """What is reported and minimized (:func:`throughput_error`). The least squares below solve for
    relative step-time errors, the same to first order: they propose candidates, this judges
    them, so the calibrated profile is never replaced by one that fits the trials worse."""
    return throughput_error(p, measured) ** 2


def _fit_linear(p: WorkloadProfile, seconds: np.ndarray, measured: Sequence[MeasuredConfig]) -> WorkloadProfile:
    """Non-negative least squares of (step fixed, micro fixed, per sample) on relative errors.

    t = t_fixed + k * (t_mf * A_f + b * t_ps * A_ps), with A_f and A_ps the block factors of the
    configuration under the reduced precision's fixed and per-sample factors (one A where the
    profile has one factor): linear in the three terms. Three unknowns: every active set is tried
    (7 least-squares solves)."""
    rows = []
    unit = dataclasses.replace(p, step_fixed_seconds=0.0, micro_fixed_seconds=1.0, micro_seconds_per_sample=0.0)
    unit_ps = dataclasses.replace(unit, micro_fixed_seconds=0.0, micro_seconds_per_sample=1.0)
    for m in measured:
        c = m.config
        sets = _block_sets(p, c)._asdict()
        k_a = step_seconds(unit, micro_batch_size=c.micro_batch_size, accum_steps=c.grad_accum_steps, **sets)
        if p.reduced_fixed_slowdown is None:  # one factor: k * A, and k * A * b
            rows.append([1.0, k_a, k_a * c.micro_batch_size])
        else:  # k * A_f, and k * b * A_ps
            k_ps = step_seconds(unit_ps, micro_batch_size=c.micro_batch_size, accum_steps=c.grad_accum_steps, **sets)
            rows.append([1.0, k_a, k_ps])
    t_fixed, t_mf, t_ps = (float(v) for v in relative_nnls(np.array(rows), seconds))
    return dataclasses.replace(p, step_fixed_seconds=t_fixed, micro_fixed_seconds=t_mf, micro_seconds_per_sample=t_ps)
