"""Solving the simulator's time terms from measured step times (``calibrate``, ``fit_time_terms``)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from autotune.envs.calibration import (
    SLOWDOWN_RANGE,
    TimeTerms,
    _block_time_ratios,
    _linear_time_terms,
    relative_nnls,
)


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


def test_a_model_that_cannot_run_in_reduced_precision_gets_an_fp32_profile_and_the_simulator_refuses_it() -> None:
    # bf16 autocast around nn.LSTM raises on an AVX2 CPU (oneDNN has no primitive); this model raises
    # under autocast on every CPU. Calibration used to raise there, so `autotune tune` crashed.
    import dataclasses

    from autotune.envs._codec import Levels
    from autotune.envs.calibration import INFEASIBLE_PEAK, calibrate, peak_table_index
    from autotune.envs.simulated import SimulatedEnv

    from autotune.resolve import load_workload
    from tests.paths import DATA

    profile = calibrate(load_workload(f"{DATA / 'no_low_precision.py'}:build"), curve_steps=2, timing_rounds=1)
    assert profile.reduced_failure == (
        "RuntimeError: could not create a primitive descriptor for this op in reduced precision"
    )
    assert [(b.reduced_fixed, b.reduced_per_sample) for b in profile.blocks] == [
        (b.fp32_fixed, b.fp32_per_sample) for b in profile.blocks
    ]
    assert profile.peak_table is not None
    plain = Levels.default_for(profile.batch_size)
    low = dataclasses.replace(plain, precision=1)
    assert profile.peak_table[peak_table_index(low)] == INFEASIBLE_PEAK
    assert profile.peak_table[peak_table_index(plain)] == pytest.approx(profile.default_peak_bytes, rel=0.05)

    env = SimulatedEnv(profiles=[profile], memory_budget=1.0)
    env.reset(seed=0)
    assert env._machine_descriptor(10**9).reduced_speed == 0.0  # what TrainingEnv's probe reads
    assert env._peak_bytes(low) == INFEASIBLE_PEAK and env._peak_bytes(plain) < INFEASIBLE_PEAK
    # A synthetic model drawn around it (no memory table) keeps the refusal.
    env = SimulatedEnv(profiles=[profile], memory_budget=1.0, randomize=True)
    for seed in range(4):
        env.reset(seed=seed)
        assert env._peak_bytes(low) == INFEASIBLE_PEAK


def test_a_shipped_profile_s_memory_tables_are_redone_without_timing_and_its_timed_terms_kept() -> None:
    from pathlib import Path

    from autotune.envs.calibration import load_profile, memory_table, with_memory_tables

    from autotune.errors import ConfigError
    from autotune.resolve import load_workload

    shipped = load_profile(Path(__file__).parents[2] / "envs" / "profiles" / "mlp-digits.json")
    stripped = dataclasses.replace(
        shipped, selective_peak_table=None, outer_peak_table=None, outer_selective_peak_table=None
    )
    workload = load_workload("mlp-digits")
    redone = with_memory_tables(stripped, workload)
    table, selective, selective_bytes = memory_table(workload, reduced=shipped.reduced)
    assert redone.peak_table == table and redone.selective_peak_table == selective
    assert tuple(b.selective_per_sample for b in redone.blocks) == selective_bytes
    assert redone.outer_peak_table is not None and len(redone.outer_peak_table) == len(table)
    timed = ("step_fixed_seconds", "micro_fixed_seconds", "micro_seconds_per_sample", "reduced_slowdown", "curve_loss")
    assert all(getattr(redone, f) == getattr(shipped, f) for f in timed)
    assert [b.time_share for b in redone.blocks] == [b.time_share for b in shipped.blocks]
    with pytest.raises(
        ConfigError, match=re.escape("mlp-digits: the profile is at batch 32, but the workload is at batch 16")
    ):
        with_memory_tables(shipped, dataclasses.replace(workload, batch_size=16))


def test_every_shipped_profile_has_the_selective_and_outer_tables() -> None:
    from pathlib import Path

    from autotune.envs.calibration import load_profile

    files = sorted((Path(__file__).parents[2] / "envs" / "profiles").glob("*.json"))
    assert len(files) == 12
    for path in files:
        p = load_profile(path)
        assert p.selective_peak_table is not None and p.outer_peak_table is not None, path.name
        assert p.outer_selective_peak_table is not None, path.name
        assert all(b.selective_per_sample is not None for b in p.blocks), path.name


def test_a_model_held_in_bf16_gets_an_fp32_profile_without_a_reduced_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.envs import calibration

    from autotune.resolve import load_workload
    from tests.paths import HELD_BF16

    workload = load_workload(f"{HELD_BF16}:build")
    passes: list[str] = []
    real = calibration._linear_fit

    def fit(wl: object, precision: str, b1: int, b2: int) -> list[tuple[float, float]]:
        passes.append(precision)
        return real(wl, precision, b1, b2)  # type: ignore[arg-type]

    monkeypatch.setattr(calibration, "_linear_fit", fit)
    blocks, failure = calibration._block_bytes(workload, "bf16", 2, 8)
    assert (passes, failure) == (["fp32"], "held-net's parameters are bfloat16 already")
    assert [(b.reduced_fixed, b.reduced_per_sample) for b in blocks] == [
        (b.fp32_fixed, b.fp32_per_sample) for b in blocks
    ]


def test_the_per_block_forwards_run_where_the_calibration_steps_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a GPU they ran on the host: the CPU's kernels timed for a GPU run (its blocks' share of the
    # forward), and at real size tens of seconds and gigabytes of host memory per forward. The meta
    # device stands in for the GPU: nothing computed, every tensor on it.
    import torch
    from autotune.envs import calibration

    from tests.conftest import make_resmlp

    monkeypatch.setattr(calibration, "resolve_device", lambda device: torch.device("meta"))
    user = make_resmlp(n=64)
    seen: list[tuple[str, str]] = []

    def loss_fn(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        seen.append((next(model.parameters()).device.type, batch[0].device.type))
        return user.loss_fn(model, batch)

    wl = dataclasses.replace(user, loss_fn=loss_fn)
    inputs = calibration._block_input_bytes(wl, 8)
    shares, fraction = calibration._block_forward_shares(wl, 8, repeats=2)
    assert seen == [("meta", "meta")] * 4  # the input bytes' forward, a warm-up, two timed
    assert inputs == [8 * 32 * 64 * 4] * 4  # each block's input: 8 x 32 x 64 fp32
    assert len(shares) == 4 and 0.0 <= fraction <= 1.0
    assert wl.model.inp.weight.device.type == "cpu"  # the user's model stays where it was


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script_method:DeprecationWarning")
def test_a_compiled_models_blocks_are_timed_eagerly() -> None:
    # Dynamo traced the timing hooks (a host clock, a list index per block): a graph break and a
    # warning at every block ("Dynamo does not know how to trace the builtin time.perf_counter"),
    # then recompiles up to its limit. The per-block clocks are eager ones.
    import torch
    from autotune.envs import calibration

    from tests.conftest import make_resmlp

    user = make_resmlp(n=64)
    wl = dataclasses.replace(user, model=torch.compile(user.model, backend="eager"))
    shares, fraction = calibration._block_forward_shares(wl, 8, repeats=2)
    assert len(shares) == 4 and sum(shares) == pytest.approx(1.0) and 0.0 < fraction <= 1.0


def test_the_default_s_memory_is_measured_on_the_worst_case_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # The memory tables predict the worst case; the default measured on a drawn batch of padded
    # sequences came out shorter (17% under on TRL's prompt-completion data), and every adaptive
    # run over such data lost its start plan ("more than 5% off").
    import torch
    from autotune.envs import calibration

    from autotune import TrainConfig, load_workload
    from autotune.worst_case import at_worst_case
    from tests.paths import PADDED_WORKLOAD

    user = load_workload(f"{PADDED_WORKLOAD}:build_map_style")
    lengths = [48] + [6] * 63  # one long sequence: a drawn batch of 8 seldom holds it
    data = [torch.arange(1, n + 1) % 50 + 1 for n in lengths]
    wl = dataclasses.replace(user, dataset=data)
    measured: list[int] = []
    real = calibration.measure

    def spy(workload: object, config: TrainConfig, **kwargs: object) -> object:
        m = real(workload, config, **kwargs)  # type: ignore[arg-type]
        measured.append(m.peak_bytes)
        return m

    monkeypatch.setattr(calibration, "measure", spy)
    default = calibration._default_measured(wl, 8)
    worst = real(at_worst_case(wl, 8), TrainConfig(micro_batch_size=8), steps=1, warmup=1)
    drawn = real(wl, TrainConfig(micro_batch_size=8), steps=1, warmup=1)
    assert default.memory is not None and worst.memory is not None
    assert measured == [default.peak_bytes] and default.memory.total == worst.memory.total
    assert drawn.peak_bytes is not None and drawn.peak_bytes < worst.memory.total  # what it measured before


# ---- the reduced precision's two factors: per sample and per micro-batch (issue 40) ---------------


def _times(x_ps: float, x_f: float, *, t_fixed: float, t_mf: float, t_ps: float, phi: float) -> dict[str, float]:
    """Step times the two-factor model gives calibrate's seven configurations (micro-batch 32, 8, 1x4;
    every block reduced in the reduced ones, recompute at +40% of block time)."""

    def t(b: int, k: int = 1, x_f_: float = 1.0, x_ps_: float = 1.0, rho: float = 0.0) -> float:
        return t_fixed + k * (
            t_mf * (1 - phi + phi * x_f_ * (1 + rho)) + b * t_ps * (1 - phi + phi * x_ps_ * (1 + rho))
        )

    return {
        "small": t(8),
        "default": t(32),
        "reduced": t(32, x_f_=x_f, x_ps_=x_ps),
        "checkpoint": t(32, rho=0.4),
        "accum": t(8, 2),
        "tiny": t(1, 4),
        "reduced_tiny": t(1, 4, x_f_=x_f, x_ps_=x_ps),
    }


@pytest.mark.parametrize(("x_ps", "x_f"), [(0.25, 1.05), (12.0, 3.0), (0.8, 0.8)])
def test_the_reduced_precision_s_factor_on_samples_and_on_micro_batches_are_solved_apart(
    x_ps: float, x_f: float
) -> None:
    # A GPU's bf16 (tensor cores: 4x faster per sample, launches as slow), an AVX2 CPU's, one factor.
    times = _times(x_ps, x_f, t_fixed=0.01, t_mf=0.02, t_ps=0.004, phi=0.8)
    t_fixed, t_mf, t_ps = _linear_time_terms(times, 32, 8, 4)
    assert (t_fixed, t_mf, t_ps) == pytest.approx((0.01, 0.02, 0.004), rel=1e-9)
    terms = TimeTerms(micro_fixed=t_mf, per_sample=t_ps, micro=32, tiny_accum=4)
    slowdown, fixed, recompute = _block_time_ratios(times, terms, 0.8, failure=None)
    assert (slowdown, fixed, recompute) == pytest.approx((x_ps, x_f, 0.4), rel=1e-9)
    # Without the micro-batch of one in reduced precision: one factor on the whole micro-batch.
    one = {k: v for k, v in times.items() if k != "reduced_tiny"}
    slowdown, fixed, _ = _block_time_ratios(one, terms, 0.8, failure=None)
    micro = 0.02 + 32 * 0.004
    assert fixed is None and slowdown == pytest.approx(1 + (times["reduced"] - times["default"]) / (0.8 * micro))
    # Where reduced precision cannot run: no factor to solve.
    assert _block_time_ratios(one, terms, 0.8, failure="no bf16 LSTM")[:2] == (1.0, None)


def test_a_factor_out_of_any_kernel_s_range_is_clamped() -> None:
    times = _times(0.25, 1.0, t_fixed=0.01, t_mf=0.02, t_ps=0.004, phi=0.8)
    times["reduced_tiny"] = times["tiny"] - 1.0  # noise: a micro-batch of one "faster" than free
    terms = TimeTerms(micro_fixed=0.02, per_sample=0.004, micro=32, tiny_accum=4)
    slowdown, fixed, _ = _block_time_ratios(times, terms, 0.8, failure=None)
    assert fixed == SLOWDOWN_RANGE[0] and SLOWDOWN_RANGE[0] <= slowdown <= SLOWDOWN_RANGE[1]
