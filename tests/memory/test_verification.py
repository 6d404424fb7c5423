"""The memory model on an LSTM (fake kernels under-size oneDNN's workspace) and its self-check:
a profile that disagrees with a real step is flagged, never trusted silently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune import TrainConfig, Workload, measure, predict_memory
from autotune.cli import main
from autotune.errors import PredictionError, PredictionWarning
from autotune.memory.check import TOLERANCE
from autotune.memory.predict import profile_memory
from autotune.memory.profile import MemoryProfile
from autotune.search.predictor import load_memory_predictor
from tests.memory.lstm import build, build_gru
from tests.phase_lines import without_phase_lines

HERE = Path(__file__).parent
LSTM_REF = f"{HERE / 'lstm.py'}:build"
DATA_DEPENDENT_REF = f"{HERE.parent / 'data' / 'data_dependent.py'}:build"


@pytest.fixture(scope="module")
def lstm() -> Workload:
    return build()


@pytest.fixture(scope="module")
def lstm_profile(lstm: Workload) -> MemoryProfile:
    return profile_memory(lstm)


@pytest.fixture
def blind_to_workspaces(monkeypatch: pytest.MonkeyPatch) -> None:
    """The profile as it was before the fix: oneDNN's LSTM workspace at the meta kernel's 0 bytes."""
    monkeypatch.setattr("autotune.memory.fake_workspaces._UNDERSIZED", {})


def _measured(workload: Workload, config: TrainConfig) -> int:
    m = measure(workload, config, steps=1, warmup=1)
    assert m.status == "ok" and m.memory is not None
    return m.memory.total


@pytest.mark.parametrize(
    "config",
    [
        TrainConfig(micro_batch_size=3),
        TrainConfig(micro_batch_size=8, grad_accum_steps=2),
        TrainConfig(micro_batch_size=16, checkpoint=True),
        TrainConfig(micro_batch_size=8, checkpoint=(True, False, True, False), grad_accum_steps=2),
        TrainConfig(micro_batch_size=32),
    ],
    ids=["micro3", "micro8-accum2", "micro16-ckpt", "micro8-ckpt-alternate-accum2", "micro32"],
)
def test_lstm_prediction_is_within_tolerance_of_the_measured_peak(
    lstm: Workload, lstm_profile: MemoryProfile, config: TrainConfig
) -> None:
    estimate = predict_memory(lstm, config, profile=lstm_profile)
    measured = _measured(lstm, config)
    assert abs(estimate.total - measured) <= TOLERANCE * measured, (estimate.total, measured)
    # The profile's own check: the same figures, agreeing to a few bytes (micro-batch 4 is profiled).
    check = lstm_profile.verification
    assert check is not None and check.verified and check.reason is None
    assert (estimate.verified, check.config.micro_batch_size) == (True, 4)
    assert check.measured is not None and abs(check.predicted - check.measured) <= 16


def test_gru_prediction_is_within_tolerance_of_the_measured_peak() -> None:
    gru = build_gru()
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=2)  # no checkpointing: half the profile's runs
    estimate = predict_memory(gru, config, verify=False)
    measured = _measured(gru, config)
    assert abs(estimate.total - measured) <= TOLERANCE * measured, (estimate.total, measured)
    assert (estimate.verified, estimate.verification) == (False, None)  # not checked, so not verified


def test_a_profile_that_misses_memory_is_flagged_with_both_figures(lstm: Workload, blind_to_workspaces: None) -> None:
    with pytest.warns(PredictionWarning) as caught:
        profile = profile_memory(lstm, checkpointed=False)
    check = profile.verification
    assert check is not None and check.measured is not None and check.relative_error is not None
    assert not check.verified and check.predicted < 0.8 * check.measured  # the workspaces are most of it
    assert check.relative_error == (check.predicted - check.measured) / check.measured
    assert check.reason == f"the prediction is {-check.relative_error:.1%} below the measured peak"
    assert [str(w.message) for w in caught] == [
        f"memory prediction for workload 'lstm-test' is unverified: predicted {check.predicted} bytes, "
        f"measured {check.measured} bytes (micro-batch 4, fp32, local on cpu): {check.reason}; "
        "configurations will be measured, not pruned on the prediction."
    ]
    estimate = predict_memory(lstm, TrainConfig(micro_batch_size=8), profile=profile)
    assert (estimate.verified, estimate.verification) == (False, check)
    assert estimate.to_dict()["verified"] is False


def test_the_study_predictor_never_prunes_on_an_unverified_prediction(
    lstm: Workload, blind_to_workspaces: None
) -> None:
    predictor = load_memory_predictor()
    assert predictor is not None
    message = "unverified memory prediction for 'lstm-test': the prediction is "
    warned = pytest.warns(PredictionWarning, match="^memory prediction for workload 'lstm-test' is unverified")
    with warned, pytest.raises(PredictionError, match=f"^{re.escape(message)}"):
        predictor(lstm, TrainConfig(micro_batch_size=2))
    # The check ran once per workload: later configs raise the same way with no new warning or step.
    with pytest.raises(PredictionError, match=f"^{re.escape(message)}"):
        predictor(lstm, TrainConfig(micro_batch_size=64))


def test_a_model_the_fake_run_cannot_go_through_cannot_be_predicted() -> None:
    from autotune import load_workload

    workload = load_workload(DATA_DEPENDENT_REF)
    msg = (
        "cannot profile workload 'data-dependent' under fake tensors: "
        "DataDependentOutputException: aten._local_scalar_dense.default"
    )
    with pytest.raises(PredictionError, match=f"^{re.escape(msg)}$"):
        profile_memory(workload)
    predictor = load_memory_predictor()
    assert predictor is not None
    warned = pytest.warns(PredictionWarning, match=f"^{re.escape(msg)}; configurations will be measured")
    with warned, pytest.raises(PredictionError, match=f"^{re.escape(msg)}$"):
        predictor(workload, TrainConfig())


def test_predict_cli_json_says_verified(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "-w", LSTM_REF, "--micro-batch", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    check = out["verification"]
    assert (out["verified"], check["verified"], check["reason"], check["config"]["micro_batch_size"]) == (
        True,
        True,
        None,
        4,
    )
    assert abs(check["relative_error"]) <= 0.001
    assert check["relative_error"] == (check["predicted"] - check["measured"]) / check["measured"]


def test_predict_cli_says_unverified_and_does_not_just_say_fits(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, blind_to_workspaces: None
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # one table row per line
    assert main(["predict", "-w", LSTM_REF, "--micro-batch", "8", "--memory-budget", "1GiB"]) == 0
    captured = capsys.readouterr()
    assert "fits (UNVERIFIED prediction)" in captured.out and "NO (UNVERIFIED on cpu)" in captured.out
    assert re.fullmatch(
        r"autotune predict: UNVERIFIED: memory prediction for workload 'lstm-test' is unverified: predicted \d+ "
        r"bytes, measured \d+ bytes \(micro-batch 4, fp32, local on cpu\): the prediction is \d+\.\d% below the "
        r"measured peak; configurations will be measured, not pruned on the prediction.\n",
        without_phase_lines(captured.err),
    )


def test_predict_cli_on_an_unprofilable_model_prints_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "-w", DATA_DEPENDENT_REF, "--json"]) == 1
    captured = capsys.readouterr()
    reason = (
        "cannot profile workload 'data-dependent' under fake tensors: "
        "DataDependentOutputException: aten._local_scalar_dense.default"
    )
    assert json.loads(captured.out) == {"workload": "data-dependent", "verified": False, "reason": reason}
    assert without_phase_lines(captured.err) == f"autotune predict: {reason}\n"
