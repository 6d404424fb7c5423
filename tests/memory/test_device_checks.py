"""A memory prediction is verified only by a real step on the device type it is for: the host's
kernels are not a GPU's, so a profile checked on the CPU says nothing about CUDA, and a study's
checks run in its measuring child, on its device (never as real steps on the host)."""

from __future__ import annotations

import re

import pytest

from autotune import TrainConfig, predict_memory
from autotune.cli import main
from autotune.memory import check
from autotune.memory.check import StepPeak, check_step
from autotune.memory.gate import BudgetGate
from autotune.memory.predict import profile_memory
from autotune.procs.isolation import MeasurementProcess
from autotune.resolve import load_workload
from autotune.search.predictor import load_memory_predictor
from tests.paths import TINY_WORKLOAD
from tests.phase_lines import without_phase_lines


@pytest.fixture(scope="module")
def tiny():  # type: ignore[no-untyped-def]
    return load_workload(f"{TINY_WORKLOAD}:build")


def test_a_profile_checked_on_the_cpu_verifies_cpu_predictions_only(tiny) -> None:  # type: ignore[no-untyped-def]
    profile = profile_memory(tiny)
    assert [(v.kind, v.device, v.verified) for v in profile.checks] == [
        ("default", "cpu", True),
        ("recompute", "cpu", True),
    ]
    config = TrainConfig(micro_batch_size=8)
    on_cpu = predict_memory(tiny, config, profile=profile)
    on_cuda = predict_memory(tiny, config, profile=profile, device_type="cuda")
    assert on_cpu.verified and on_cpu.verification == profile.checks[0]
    assert on_cuda.total == on_cpu.total and not on_cuda.verified
    assert on_cuda.verification is not None
    assert (on_cuda.verification.kind, on_cuda.verification.device, on_cuda.verification.reason) == (
        "unchecked",
        "cuda",
        "no real step on cuda checked fp32 configurations (checked on cpu only)",
    )


def test_predict_for_cuda_on_a_machine_without_it_runs_no_host_step_and_says_unverified(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_step(*args: object, **kwargs: object) -> StepPeak:
        raise AssertionError("a check step ran on the host for a CUDA prediction")

    monkeypatch.setattr(check, "check_step", no_step)
    assert main(["predict", "-w", f"{TINY_WORKLOAD}:build", "--micro-batch", "8", "--device", "cuda"]) == 0
    out, err = capsys.readouterr()
    assert "NO (UNVERIFIED on cuda)" in out and "yes" not in out
    assert without_phase_lines(err) == (
        "autotune predict: UNVERIFIED: memory prediction for workload 'tiny' is unverified: predicted "
        f"{_predicted(err)} bytes: no real step on cuda checked it: this machine has no cuda device; the "
        "configuration will be measured, not admitted on the prediction.\n"
    )


def _predicted(err: str) -> str:
    found = re.search(r"predicted (\d+) bytes", err)
    assert found is not None
    return found.group(1)


def test_a_study_predictor_checks_through_its_step_on_its_device(tiny) -> None:  # type: ignore[no-untyped-def]
    """The study hands its measuring child's check to the predictor: the checks are that step's,
    recorded for the study's device type, and one line per check reaches the display."""
    ran: list[TrainConfig] = []
    lines: list[str] = []

    def step(config: TrainConfig, predicted: int) -> StepPeak:
        ran.append(config)
        return check_step(tiny, config, device="cpu", predicted=predicted)  # stands in for the child on a GPU

    predictor = load_memory_predictor(device="cuda", step=step, note=lines.append)
    assert predictor is not None
    predictor(tiny, TrainConfig(micro_batch_size=8))  # verified on "cuda": no PredictionError
    assert [c.checkpoint for c in ran] == [False, (True, False, True, False)]
    assert [re.sub(r"[\d.]+ (KiB|MiB|B)|[+-]\d+\.\d%|\d+\.\d s", "#", line) for line in lines] == [
        "memory model: fake-tensor profile of fp32 (no real compute, #)",
        "memory check fp32 on cuda (micro-batch 4, fp32, local on cuda): predicted #, measured # (#), verified (#)",
        "memory check recomputed on cuda (micro-batch 2, blocks 0, 2 recomputed, local on cuda): predicted #, "
        "measured # (#), verified (#)",
    ]


def test_the_measuring_child_checks_the_same_bytes_as_this_process(tiny) -> None:  # type: ignore[no-untyped-def]
    config = TrainConfig(micro_batch_size=4, checkpoint=(True, False, True, False))
    with MeasurementProcess(f"{TINY_WORKLOAD}:build", threads=1, device="cpu") as child:
        remote = child.check(config, timeout=120)
    local = check_step(tiny, config, device="cpu")
    assert remote == local and remote.measured is not None and remote.measured > 0


def test_on_cuda_the_gate_admits_on_a_host_check_but_trusts_a_kind_once_measured_there(tiny) -> None:  # type: ignore[no-untyped-def]
    profile = profile_memory(tiny)
    gate = BudgetGate(tiny, 10**9, profile=profile, device_type="cuda")
    plain, recomputed = TrainConfig(micro_batch_size=8), TrainConfig(micro_batch_size=8, checkpoint=True)
    assert gate.admits(plain).admitted and gate.admits(recomputed).admitted
    assert not gate.trusts(plain) and not gate.trusts(recomputed)
    predicted = gate.predict(TrainConfig(micro_batch_size=4))
    assert predicted is not None
    gate.record(TrainConfig(micro_batch_size=4), predicted[0])  # a step of the default kind, measured on the device
    assert gate.trusts(plain) and not gate.trusts(recomputed)
    on_cpu = BudgetGate(tiny, 10**9, profile=profile, device_type="cpu")
    assert on_cpu.trusts(plain) and on_cpu.trusts(recomputed)


def test_a_check_step_that_would_not_fit_is_not_run_and_says_so(
    tiny,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    """A check step the host cannot hold would be ended by the kernel's OOM killer with the whole
    process: where its prediction (with the margin) is more than is free, it does not run."""
    monkeypatch.setattr("autotune.measurement.cuda_memory.free_bytes", lambda device: 5 * 2**20)
    config = TrainConfig(micro_batch_size=4)
    assert check_step(tiny, config, device="cpu", predicted=4 * 2**20 + 1) == StepPeak(
        None, "the check step would not fit on cpu: predicted 4 MiB, 5 MiB free", True
    )
    ran = check_step(tiny, config, device="cpu", predicted=4 * 2**20)  # 5 MiB / 1.25: just fits
    assert ran.measured is not None and ran.failure is None
