"""The policy's proposal for a model it never saw, as ``autotune study`` enqueues it (by default)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from autotune.envs._codec import Move
from autotune.policies.transfer import propose

from autotune import Knobs
from autotune.errors import ProposalError
from autotune.search.baselines import HF_RECIPE, POLICY_PROPOSAL, PYTORCH_DEFAULT, SEED_RECIPE
from autotune.search.opening import open_study
from autotune.search.spec import MeasureSpec, StudySpec
from autotune.search.study import RunOptions, prepare, run_study
from autotune.search.trial_record import ATTR
from autotune.units import format_bytes
from tests.conftest import make_resmlp
from tests.paths import DATA, TINY_WORKLOAD

TINY = TINY_WORKLOAD
DATA_DEPENDENT = DATA / "data_dependent.py"


def test_the_proposal_keeps_the_batch_and_fits_the_budget_in_the_simulator() -> None:
    workload = make_resmlp(n=256)
    knobs = propose(workload, memory_budget=None)
    assert isinstance(knobs, Knobs)
    assert knobs.batch_size == workload.batch_size  # the user's batch


def test_an_episode_that_never_gets_under_the_budget_proposes_nothing() -> None:
    class Stays:
        """A policy that always keeps the knobs."""

        def act(self, observation: object) -> np.ndarray:
            return np.array(Move.KEEP.action)

    # The simulator raises a budget to the least memory any knobs reach (micro-batch 1, every block
    # recomputed); with the split closed the start within the budget (recompute) stays above it.
    workload = dataclasses.replace(make_resmlp(n=256), min_micro_batch=32)
    message = r"the policy reached no configuration within the budget \(\d+ B\) in 8 steps of resmlp's simulator"
    with pytest.raises(ProposalError, match=f"^{message}$"):
        propose(workload, memory_budget=1024, policy=Stays())  # type: ignore[arg-type]


def test_a_study_with_the_policy_proposal_measures_it_as_one_more_baseline(tmp_path: Path) -> None:
    spec = StudySpec(
        workload=f"{TINY}:build", trials=4, measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=120)
    )
    options = RunOptions(
        storage=str(tmp_path / "s.db"),
        cache=None,
        artifact_dir=tmp_path / "artifacts",
        memory_model=None,
        propose=propose,
    )
    prepared = prepare(spec)  # the spec's policy_proposal is on by default
    study = open_study(prepared, options)
    run_study(prepared, study, options)
    baselines = [t.user_attrs.get(ATTR.BASELINE) for t in study.trials]
    assert baselines == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE, POLICY_PROPOSAL]  # made once they ran
    assert study.trials[3].state.name == "COMPLETE"
    assert "micro_batch_size" in study.trials[3].params  # a point of the study's space


def test_without_a_proposal_the_study_goes_on_and_says_why_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = StudySpec(
        workload=f"{DATA_DEPENDENT}:build",
        trials=2,
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=120),
    )
    options = RunOptions(
        storage=str(tmp_path / "s.db"),
        cache=None,
        artifact_dir=tmp_path / "artifacts",
        memory_model=None,
        create_only=True,
        propose=propose,
    )
    prepared = prepare(spec)
    study = open_study(prepared, options)
    capsys.readouterr()
    run_study(prepared, study, options)
    *setup, line = capsys.readouterr().err.splitlines()  # one line per setup phase, then the proposal's
    assert [re.sub(r"\(.*\)$", "(...)", s) for s in setup[1:]] == [
        "blocks: blocks.0..blocks.1 (...)",
        "blocks ranked by the activation bytes they save (...)",
        "baselines enqueued: pytorch-default, seed-recipe, hf-recipe (...)",
        # The proposal's profile, phase by phase (its real steps), up to the one that fails.
        "policy proposal: memory of the default configuration (...)",
        "policy proposal: per-block activation bytes (...)",
        "policy proposal: per-block forward time (...)",
        "policy proposal: step times under seven configurations (...)",
        "policy proposal: loss and gradient-noise curves (...)",
        "policy proposal: peak memory of every knob setting (...)",  # "(memory model) (1.2 s)"
    ]
    # FakeTensorMode cannot run a forward that branches on a value: no memory table, no proposal.
    assert line.startswith("no policy proposal: data-dependent cannot be profiled for the simulator: PredictionError: ")
    assert [t.user_attrs.get(ATTR.BASELINE) for t in study.trials] == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]


def test_a_spec_can_turn_the_proposal_off(tmp_path: Path) -> None:
    spec = StudySpec(workload=f"{TINY}:build", trials=3, policy_proposal=False)
    options = RunOptions(
        storage=str(tmp_path / "s.db"),
        cache=None,
        artifact_dir=tmp_path / "artifacts",
        memory_model=None,
        create_only=True,
        propose=propose,
    )
    prepared = prepare(spec)
    study = open_study(prepared, options)
    run_study(prepared, study, options)
    assert [t.user_attrs.get(ATTR.BASELINE) for t in study.trials] == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]


def test_the_simulated_best_is_the_best_setting_the_gate_admits() -> None:
    from autotune.envs.calibration import load_profile
    from autotune.envs.costmodel import ranked_settings
    from autotune.envs.simulated import PROFILE_DIR
    from autotune.policies.transfer import simulated_best

    profile = load_profile(PROFILE_DIR / "gpt-tiny.json")
    ranked = ranked_settings(profile, 32)
    top = ranked[0][1].knobs(len(profile.blocks))
    assert simulated_best(profile, batch_size=32, admits=lambda k: True) == (top, ranked[0][0])
    # The gate refuses the simulator's best: the next one it admits is the plan.
    second = ranked[1][1].knobs(len(profile.blocks))
    assert simulated_best(profile, batch_size=32, admits=lambda k: k != top) == (second, ranked[1][0])
    fp32 = simulated_best(profile, batch_size=32, admits=lambda k: True, reduced=False)
    assert fp32 is not None and fp32[0].low_precision_blocks == 0
    assert simulated_best(profile, batch_size=32, admits=lambda k: False) is None


def _alone(workload: object, micro: int, *, side_by_side: bool = False) -> int:
    """What the calibration needs at ``micro``: the default's predicted peak with one model alive,
    and six more models with its seven timed ones at once (``side_by_side``)."""
    from autotune import TrainConfig, predict_memory

    e = predict_memory(workload, TrainConfig(micro_batch_size=micro), verify=False)  # type: ignore[arg-type]
    return e.total + (6 * (e.parameters + e.gradients + e.optimizer_state) if side_by_side else 0)


def test_a_calibration_that_would_not_fit_even_at_one_sample_is_refused_before_any_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where not even one sample's default step fits, the fake-tensor profile says so before a
    real step runs."""
    from autotune.policies.transfer import quick_profile

    from autotune.memory.check import StepPeak
    from autotune.resolve import load_workload

    def no_step(*args: object, **kwargs: object) -> StepPeak:
        raise AssertionError("a real step ran")

    workload = load_workload(f"{TINY}:build")
    free = _alone(workload, 1)  # 80% of it is the calibration's share: short of micro-batch 1
    monkeypatch.setattr("autotune.measurement.cuda_memory.free_bytes", lambda device: free)
    monkeypatch.setattr("autotune.envs.calibration.measure", no_step)
    message = (
        "calibrating the simulator runs the PyTorch default (fp32, down to micro-batch 1) on cpu: "
        f"about {format_bytes(free)} at the least, and {format_bytes(free)} is free there"
    )
    with pytest.raises(ProposalError, match=f"^{re.escape(message)}$"):
        quick_profile(workload)


def test_a_calibration_that_does_not_fit_runs_at_a_smaller_micro_batch_and_one_model_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At real size the PyTorch default (the whole batch in one fp32 micro-batch) does not fit on
    the device (GPT-2 small at sequence 1024 and batch 32 on a 24 GB card), nor six models side by
    side (a 1B model's fp32 AdamW state is 16 GB each): the proposal was left out at every real
    size. Its real steps now run at the largest power of two that fits, one model at a time where
    six do not; the memory model's check of the default compares the same micro-batch."""
    from autotune.envs import calibration
    from autotune.policies.transfer import CalibrationSize, calibration_size, quick_profile

    from autotune.resolve import load_workload

    workload = load_workload(f"{TINY}:build")
    assert workload.batch_size == 16
    free = int(_alone(workload, 8) / 0.8) + 1  # micro-batch 8 fits alone; 16 does not, nor 8 with five more models
    assert _alone(workload, 16) > 0.8 * free and _alone(workload, 8, side_by_side=True) > 0.8 * free
    monkeypatch.setattr("autotune.measurement.cuda_memory.free_bytes", lambda device: free)
    assert calibration_size(workload) == CalibrationSize(micro_batch=8, one_at_a_time=True)
    micros: list[int] = []
    together: list[bool] = []
    measure, timed = calibration.measure, calibration.interleaved_step_seconds

    def measured(wl: object, config: object, **kwargs: object) -> object:
        micros.append(config.micro_batch_size)  # type: ignore[attr-defined]
        return measure(wl, config, **kwargs)  # type: ignore[arg-type]

    def interleaved(wl: object, configs: dict[str, object], rounds: int = 8, **kwargs: bool) -> dict[str, float]:
        micros.extend(c.micro_batch_size for c in configs.values())  # type: ignore[attr-defined]
        together.append(kwargs["side_by_side"])
        return timed(wl, configs, rounds=rounds, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(calibration, "measure", measured)
    monkeypatch.setattr(calibration, "interleaved_step_seconds", interleaved)
    lines: list[str] = []
    profile = quick_profile(workload, progress=lines.append)  # raises if the model misses the measured default
    # The default, then small, default, reduced, checkpoint, accum, tiny and tiny reduced.
    assert micros == [8, 2, 8, 8, 8, 2, 1, 1]
    assert together == [False]
    assert lines[0] == "memory of the default configuration at micro-batch 8"
    assert "step times under seven configurations, one at a time" in lines
    assert (profile.batch_size, profile.default_micro_batch) == (16, 8)
    assert profile.curve_samples == (16.0, 32.0)  # the curve's steps keep the whole batch (8 x 2)
    free = int(_alone(workload, 16) / 0.8) + 1  # the whole batch alone: before a smaller micro-batch
    assert calibration_size(workload) == CalibrationSize(one_at_a_time=True)
    free = int(_alone(workload, 16, side_by_side=True) / 0.8) + 1  # everything fits: the calibration as it was
    assert calibration_size(workload) == CalibrationSize()
