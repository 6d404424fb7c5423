"""A study's memory model is checked by its own measured trials, not by check steps up front: the
first measured trial of each kind of configuration is that kind's check (predicted next to its
exactly tracked peak), stored on the study for its other workers."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune import TrainConfig, Workload, load_workload, predict_memory
from autotune.errors import PredictionError, PredictionWarning
from autotune.memory.check import StepPeak, check_step
from autotune.memory.predict import profile_memory
from autotune.procs.isolation import MeasurementProcess
from autotune.search.memory_checks import stored_checks
from autotune.search.opening import open_study
from autotune.search.predictor import load_memory_predictor
from autotune.search.spec import MeasureSpec, SpaceSpec, StudySpec
from autotune.search.study import RunOptions, prepare, run_study
from autotune.search.trial_record import ATTR
from autotune.units import MemoryBudget
from tests.paths import TINY_WORKLOAD


@pytest.fixture(scope="module")
def tiny() -> Workload:
    return load_workload(f"{TINY_WORKLOAD}:build")


def _real(workload: Workload, config: TrainConfig) -> int:
    """The real memory model's figure for ``config``, from an unchecked profile."""
    return predict_memory(workload, config, profile=profile_memory(workload, verify=False)).total


def test_a_lazy_predictor_runs_no_check_step_and_its_first_measured_kind_verifies_it(tiny: Workload) -> None:
    steps: list[TrainConfig] = []

    def step(config: TrainConfig, predicted: int) -> StepPeak:
        steps.append(config)
        return check_step(tiny, config, device="cpu", predicted=predicted)

    lines: list[str] = []
    predictor = load_memory_predictor(step=step, note=lines.append, lazy=True)
    assert predictor is not None
    plain, recomputed = TrainConfig(micro_batch_size=8), TrainConfig(micro_batch_size=8, checkpoint=True)
    message = (
        "unverified memory prediction for 'tiny': no measured trial on cpu has checked its kind of configuration yet"
    )
    with pytest.raises(PredictionError, match=f"^{re.escape(message)}$"):
        predictor(tiny, plain)
    assert steps == [] and lines == []  # unverified whatever a profile says: none taken, no step
    predicted = _real(tiny, plain)
    measured = check_step(tiny, plain, device="cpu").measured  # what a trial's tracked step holds
    assert measured is not None
    (check,) = predictor.trial_measured(tiny, plain, measured, trial=3)
    assert [re.sub(r"\d+\.\d s", "#", line) for line in lines] == [  # profiled for the trial's check
        "memory model: fake-tensor profile of fp32 (no real compute, #)"
    ]
    assert (check.kind, check.predicted, check.measured, check.verified, check.trial, check.device) == (
        "default",
        predicted,
        measured,
        True,
        3,
        "cpu",
    )
    assert check.relative_error == (predicted - measured) / measured
    assert predictor(tiny, plain) == predicted  # verified from now on
    assert predictor(tiny, TrainConfig(micro_batch_size=4)) == _real(tiny, TrainConfig(micro_batch_size=4))
    # Recomputing is another kind: still unverified, with covering's reason, until a trial of it.
    with pytest.raises(PredictionError, match="no real step on cpu checked recomputed configurations"):
        predictor(tiny, recomputed)
    assert predictor.trial_measured(tiny, plain, measured, trial=4) == ()  # the default is checked already
    assert steps == []


def test_a_trial_with_two_new_kinds_checks_both_when_it_agrees_and_neither_when_it_does_not(
    tiny: Workload,
) -> None:
    predictor = load_memory_predictor(lazy=True)
    assert predictor is not None
    config = TrainConfig(micro_batch_size=8, checkpoint=True)
    with pytest.raises(PredictionError):
        predictor(tiny, config)
    predicted = _real(tiny, config)
    # Off by 50%: either kind could be the one that is off, so neither is recorded.
    assert predictor.trial_measured(tiny, config, 2 * predicted, trial=0) == ()
    checks = predictor.trial_measured(tiny, config, predicted, trial=1)
    assert [(v.kind, v.verified, v.measured, v.trial) for v in checks] == [
        ("default", True, predicted, 1),
        ("recompute", True, predicted, 1),
    ]
    assert predictor(tiny, config) == predicted


def test_a_kind_a_trial_finds_off_is_flagged_with_its_figures_and_stays_unverified(tiny: Workload) -> None:
    predictor = load_memory_predictor("tests.search.wrong_memory_model", lazy=True)
    assert predictor is not None
    config = TrainConfig(micro_batch_size=8)
    with pytest.raises(PredictionError):
        predictor(tiny, config)
    predicted = 2 * _real(tiny, config)
    measured = predicted // 2
    warning = (
        f"memory prediction for workload 'tiny' is unverified: predicted {predicted} bytes, measured {measured} "
        "bytes (micro-batch 8, fp32, local on cpu): the prediction is 100.0% above the measured peak; "
        "configurations will be measured, not pruned on the prediction."
    )
    with pytest.warns(PredictionWarning, match=f"^{re.escape(warning)}$"):
        (check,) = predictor.trial_measured(tiny, config, measured, trial=0)
    assert (check.kind, check.verified, check.predicted, check.measured, check.relative_error) == (
        "default",
        False,
        predicted,
        measured,
        1.0,
    )
    message = "unverified memory prediction for 'tiny': the prediction is 100.0% above the measured peak"
    for other in (config, TrainConfig(micro_batch_size=2)):
        with pytest.raises(PredictionError, match=f"^{re.escape(message)}$"):
            predictor(tiny, other)
    # A kind no trial measured yet says so first, as with check steps (covering's order).
    with pytest.raises(PredictionError, match=r"no real step on cpu checked recomputed configurations$"):
        predictor(tiny, TrainConfig(micro_batch_size=2, checkpoint=True))


def test_data_of_several_shapes_is_checked_by_check_steps_as_before() -> None:
    """A trial's tracked step need not run at the worst case the model predicts: where the data is
    not of one shape, the lazy predictor runs the check steps, and no trial checks anything."""
    varlen = load_workload("varlen-lm")
    assert not varlen.worst_case.uniform
    steps: list[TrainConfig] = []

    def step(config: TrainConfig, predicted: int) -> StepPeak:
        steps.append(config)
        return check_step(varlen, config, device="cpu", predicted=predicted)

    predictor = load_memory_predictor(step=step, lazy=True)
    assert predictor is not None
    config = TrainConfig(micro_batch_size=2)
    with contextlib.suppress(PredictionError):  # verified or not, the check steps decided it
        predictor(varlen, config)
    assert [c.checkpoint for c in steps][:1] == [False] and len(steps) >= 1
    assert predictor.trial_measured(varlen, config, 10**6, trial=0) == ()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every measurement and check step the study's measuring child is asked for, in order."""
    calls: list[str] = []
    measure, check = MeasurementProcess.measure, MeasurementProcess.check

    def counted_measure(self: MeasurementProcess, config: TrainConfig, **kw: object) -> object:
        calls.append("measure")
        return measure(self, config, **kw)  # type: ignore[arg-type]

    def counted_check(self: MeasurementProcess, config: TrainConfig, **kw: object) -> StepPeak:
        calls.append("check")
        return check(self, config, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(MeasurementProcess, "measure", counted_measure)
    monkeypatch.setattr(MeasurementProcess, "check", counted_check)
    return calls


def _study(tmp_path: Path, budget: int, model: str, trials: int) -> tuple[optuna.Study, Workload]:
    spec = StudySpec(
        workload=f"{TINY_WORKLOAD}:build",
        trials=trials,
        memory_budget=MemoryBudget(bytes=budget),
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=120),
        policy_proposal=False,
        space=SpaceSpec(precisions=("fp32",)),
    )
    options = RunOptions(storage=str(tmp_path / "s.db"), cache=None, artifact_dir=tmp_path / "a", memory_model=model)
    prepared = prepare(spec)
    study = open_study(prepared, options)
    run_study(prepared, study, options)
    return study, prepared.workload


def test_a_study_runs_no_check_step_and_its_first_trial_checks_the_default_kind(
    tmp_path: Path, tiny_budget: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _counting(monkeypatch)
    study, workload = _study(tmp_path, tiny_budget, "autotune.memory.predict", trials=3)
    assert "check" not in calls and calls.count("measure") >= 3
    first, seed, retry = study.trials[:3]
    # The PyTorch default: unverified when it started (measured, not judged), then its own check.
    assert first.user_attrs[ATTR.PREDICTION_ERROR] == (
        "PredictionError: unverified memory prediction for 'tiny': "
        "no measured trial on cpu has checked its kind of configuration yet"
    )
    config = TrainConfig.from_dict(first.user_attrs[ATTR.CONFIG])
    recomputed = TrainConfig.from_dict(seed.user_attrs[ATTR.CONFIG])
    default, recompute = stored_checks(study, "cpu")
    assert (default.kind, default.trial, default.config, default.verified) == ("default", 0, config, True)
    assert (default.predicted, default.measured) == (_real(workload, config), first.user_attrs[ATTR.PEAK])
    # The seed recipe recomputes: a kind of its own, checked by its own measured trial.
    assert seed.user_attrs[ATTR.PREDICTION_ERROR].endswith("no real step on cpu checked recomputed configurations")
    assert (recompute.kind, recompute.trial, recompute.config, recompute.verified) == (
        "recompute",
        1,
        recomputed,
        True,
    )
    assert (recompute.predicted, recompute.measured) == (_real(workload, recomputed), seed.user_attrs[ATTR.PEAK])
    err = capsys.readouterr().err
    assert "memory check" not in err
    # The baselines' mode was profiled while the measuring child built the workload, once: every
    # check and prediction after it reuses that profile.
    setup = [line for line in err.splitlines() if "fake-tensor profile of" in line or "measuring process" in line]
    assert [re.sub(r"\(.*\)$", "(...)", line) for line in setup] == [
        "memory model: fake-tensor profile of fp32 (...)",
        "measuring process ready on cpu: workload built, one warm-up step (...)",
    ]
    lines = re.findall(r"^memory model checked by .*$", err, re.MULTILINE)
    assert [re.sub(r"[\d.]+ (KiB|MiB)|[+-]\d+\.\d%", "#", line) for line in lines] == [
        f"memory model checked by trial 0 (fp32 on cpu, micro-batch {config.micro_batch_size}): "
        "predicted #, measured # (#), verified",
        f"memory model checked by trial 1 (recomputed on cpu, micro-batch {recomputed.micro_batch_size}): "
        "predicted #, measured # (#), verified",
    ]
    # The retried PyTorch default is of a checked kind: its prediction is verified, and decided.
    assert ATTR.PREDICTION_ERROR not in retry.user_attrs
    assert retry.user_attrs[ATTR.PREDICTED] == _real(workload, TrainConfig.from_dict(retry.user_attrs[ATTR.CONFIG]))


def test_a_study_whose_model_is_off_flags_the_kind_and_measures_every_trial(
    tmp_path: Path, tiny_budget: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(monkeypatch)
    with pytest.warns(PredictionWarning, match="the prediction is 100.0% above the measured peak"):
        study, workload = _study(tmp_path, tiny_budget, "tests.search.wrong_memory_model", trials=3)
    assert "check" not in calls
    # Each kind is checked by its first trial, and found off there: the default by the PyTorch
    # default, recomputing by the seed recipe (the default kind is checked, off or not).
    checks = stored_checks(study, "cpu")
    assert [(v.kind, v.trial, v.verified) for v in checks] == [("default", 0, False), ("recompute", 1, False)]
    for check, trial in zip(checks, study.trials, strict=False):
        config = TrainConfig.from_dict(trial.user_attrs[ATTR.CONFIG])
        assert (check.predicted, check.measured) == (2 * _real(workload, config), trial.user_attrs[ATTR.PEAK])
        assert check.relative_error == (check.predicted - check.measured) / check.measured
        assert check.reason == f"the prediction is {check.relative_error:.1%} above the measured peak"
    for trial in study.trials:
        assert trial.user_attrs[ATTR.STATUS] != "predicted_over_budget"  # measured, never pruned on it
        assert trial.user_attrs[ATTR.PREDICTION_ERROR].startswith("PredictionError: unverified memory prediction")
    # The retried PyTorch default came after its kind was found off: unverified with the figures' reason.
    assert study.trials[2].user_attrs[ATTR.PREDICTION_ERROR] == (
        "PredictionError: unverified memory prediction for 'tiny': "
        f"the prediction is {checks[0].relative_error:.1%} above the measured peak"
    )


@pytest.mark.parametrize(("budget", "profiles"), [("1GiB", []), ("80%", [("fp32",)])])
def test_a_study_setup_takes_no_profile_for_predictions_no_trial_could_have_verified(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    budget: str,
    profiles: list[tuple[str, ...]],
) -> None:
    """Before its first trial a study's predictions are unverified (no trial checked a kind): its
    baselines are enqueued without profiling the model for them. Only a percentage budget profiles
    it, once: the default configuration's peak is what the percentage is of."""
    from autotune.cli import main
    from autotune.memory import predict

    calls: list[tuple[str, ...]] = []
    fake_profile = predict.fake_profile

    def counted(workload: Workload, **kw: Any) -> Any:
        calls.append(tuple(kw["modes"]))
        return fake_profile(workload, **kw)

    monkeypatch.setattr(predict, "fake_profile", counted)
    args = ["study", f"{TINY_WORKLOAD}:build", "--create-only", "--no-progress", "--no-policy-proposal"]
    args += ["--memory-budget", budget, "--storage", str(tmp_path / "s.db"), "--cache", str(tmp_path / "c.db")]
    assert main(args) == 0
    assert calls == profiles
    err = capsys.readouterr().err
    assert "baselines enqueued: pytorch-default, seed-recipe, hf-recipe (" in err
    assert "fake-tensor profile" not in err
