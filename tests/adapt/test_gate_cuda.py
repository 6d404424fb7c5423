"""The budget gate and the memory model on CUDA, on the CPU: the allocator's figures given exactly."""

from __future__ import annotations

import dataclasses
import re

import pytest

from autotune import ConfigError, MemoryEstimate, TrainConfig, Workload, load_workload
from autotune.adapt.controller import Controller
from autotune.adapt.records import Change
from autotune.errors import PredictionWarning
from autotune.measurement.cuda_memory import AllocatorStats
from autotune.memory import check
from autotune.memory.check import StepPeak
from autotune.memory.gate import BudgetGate, Verdict
from autotune.memory.predict import profile_memory
from autotune.memory.profile import MemoryProfile
from autotune.units import MemoryBudget, format_bytes
from tests.paths import USER_WORKLOAD

A = TrainConfig(micro_batch_size=4)
B = TrainConfig(micro_batch_size=8)
PREDICTED_B = 61_184  # allocated bytes the memory model predicts for B on the tiny workload


def _stats(allocated: int, reserved: int) -> AllocatorStats:
    return AllocatorStats(allocated_peak=allocated, reserved_peak=reserved, alloc_retries=0, ooms=0)


@pytest.fixture(scope="module")
def tiny() -> Workload:
    return load_workload(f"{USER_WORKLOAD}:build")


@pytest.fixture(scope="module")
def profile(tiny: Workload) -> MemoryProfile:
    return profile_memory(tiny, modes=("fp32",))


def _gate(tiny: Workload, profile: MemoryProfile, budget: int, device_type: str = "cuda") -> BudgetGate:
    return BudgetGate(tiny, budget, profile=profile, device_type=device_type)


def test_before_a_real_step_a_cuda_prediction_is_of_allocated_bytes(tiny: Workload, profile: MemoryProfile) -> None:
    verdict = _gate(tiny, profile, 10**9).admits(B)
    assert verdict.admitted and verdict.predicted == PREDICTED_B
    # The profile's checks ran on the host: they stand for the CPU only.
    assert verdict.reason == (
        "predicted 61184 B (+2% headroom) <= budget 1000000000 B "
        "(allocated: no reserved/allocated ratio measured on this device yet); unverified on cuda until a step "
        "of its kind (default) is measured there: its first step is"
    )


def test_a_measured_ratio_scales_predictions_to_reserved(tiny: Workload, profile: MemoryProfile) -> None:
    # 61_184 x 1.25 = 76_480 reserved; + 5% headroom (more than the gate's 2%) = 80_304.
    gate = _gate(tiny, profile, 80_304)
    gate.record(A, 60_640, allocator=_stats(4_000_000, 5_000_000))
    assert gate.reserved_ratio == 1.25
    assert gate.admits(B).reason == (
        "predicted 61184 B allocated x 1.2500 reserved/allocated = 76480 B reserved (+5% headroom: 80304 B) "
        "<= budget 80304 B"
    )
    gate.budget = 80_303
    assert not gate.admits(B).admitted


def test_the_highest_ratio_seen_stands(tiny: Workload, profile: MemoryProfile) -> None:
    gate = _gate(tiny, profile, 10**9)
    gate.record(A, 60_640, allocator=_stats(4_000_000, 5_000_000))
    gate.record(B, 61_184, allocator=_stats(4_000_000, 4_400_000))
    assert gate.reserved_ratio == 1.25


def test_a_measured_config_is_checked_by_its_reserved_peak(tiny: Workload, profile: MemoryProfile) -> None:
    # The tracked peak (60_640) fits easily; the reserved 6_291_456 + 5% = 6_606_029 must fit.
    gate = _gate(tiny, profile, 6_606_029)
    gate.record(A, 60_640, allocator=_stats(4_700_160, 6_291_456))
    verdict = gate.admits(A)
    assert verdict.admitted and verdict.measured == 60_640
    assert verdict.reason == "measured 6291456 B reserved (+5% headroom: 6606029 B) <= budget 6606029 B"
    gate.budget = 6_606_028
    assert gate.admits(A).reason == "measured 6291456 B reserved (+5% headroom: 6606029 B) > budget 6606028 B"


def test_on_the_cpu_nothing_changes(tiny: Workload, profile: MemoryProfile) -> None:
    gate = _gate(tiny, profile, 10**9, device_type="cpu")
    gate.record(A, 60_640)
    assert (gate.reserved_ratio, gate.reserved) == (None, {})
    assert gate.admits(B).reason == "predicted 61184 B (+2% headroom) <= budget 1000000000 B"
    assert gate.admits(A).reason == "measured 60640 B <= budget 1000000000 B"


def _estimate(**kwargs: object) -> MemoryEstimate:
    values: dict[str, object] = dict(
        parameters=4_000,
        gradients=4_000,
        optimizer_state=8_000,
        activations=3_000,
        temporaries=0,
        buffers=0,
        other=0,
        phase="forward/backward",
        ranks=1,
    )
    return MemoryEstimate(**(values | kwargs))  # type: ignore[arg-type]


def test_an_estimate_says_it_predicts_allocated_and_carries_the_ratio() -> None:
    estimate = _estimate()
    assert (estimate.predicts, estimate.reserved_ratio, estimate.reserved) == ("allocated", None, None)
    scaled = estimate.with_reserved_ratio(6_291_456 / 4_700_160)
    assert scaled.total == 19_000 and scaled.reserved == 25_433  # 19_000 x 1.33856... rounded up
    d = scaled.to_dict()
    assert (d["predicts"], d["reserved_ratio"], d["reserved"]) == ("allocated", 6_291_456 / 4_700_160, 25_433)


@pytest.mark.parametrize("ratio", [0.99, float("inf"), True, "1.2"])
def test_an_estimate_refuses_a_ratio_below_one(ratio: object) -> None:
    msg = f"MemoryEstimate.reserved_ratio must be a finite number >= 1 or None, but got {ratio!r}."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        _estimate(reserved_ratio=ratio)


@pytest.fixture(scope="module")
def two_modes(tiny: Workload) -> MemoryProfile:
    return profile_memory(tiny, modes=("fp32", "bf16"))


def test_a_kind_measured_above_its_prediction_is_scaled_and_no_longer_trusted(
    tiny: Workload, two_modes: MemoryProfile
) -> None:
    """On an H100 the decoder's fp32 step measured 1.157x the host profile's prediction, where
    bf16 was exact: the gate learns it per kind from the first real step and scales from then on."""
    gate = _gate(tiny, two_modes, 10**9)
    bf16 = TrainConfig(micro_batch_size=8, precision="bf16")
    # Checked on the host: admitted, but trusted on CUDA only once a step of its kind ran there.
    assert gate.predict(B) == (61_184, True) and not gate.trusts(B)
    gate.record(A, 60_640)  # exact: nothing learnt but that the kind holds here
    assert gate.device_error == {} and gate.trusts(B)
    gate.record(A, 72_768)  # 1.2x the 60_640 predicted: fp32 ("default") configurations are off here
    assert gate.device_error == {"default": 1.2}
    assert gate.predict(B) == (73_421, True)  # ceil(61_184 x 1.2)
    assert not gate.trusts(B)  # its first step is measured before it is relied on
    assert gate.predict(bf16) == (61_184, True) and not gate.trusts(bf16)  # another kind: not yet measured here
    gate.budget = 74_890  # 73_421 + 2% = 74_889.42 -> 74_889
    assert gate.admits(B).reason == (
        "predicted 73421 B (+2% headroom) <= budget 74890 B (allocated: no reserved/allocated ratio measured on "
        "this device yet); x1.2000: real steps on this device came above the memory model (default)"
    )
    gate.budget = 74_888
    assert not gate.admits(B).admitted


def test_a_step_within_the_headroom_above_its_prediction_teaches_nothing(
    tiny: Workload, two_modes: MemoryProfile
) -> None:
    gate = _gate(tiny, two_modes, 10**9, device_type="cpu")
    gate.record(B, 62_407)  # 61_184 x 1.02 = 62_407.68: within the 2% headroom
    assert gate.device_error == {} and gate.trusts(B)


def test_a_failed_step_is_refused_and_teaches_nothing_of_its_kinds(tiny: Workload, two_modes: MemoryProfile) -> None:
    """A bf16 step with a block recomputed that failed (an LSTM on a CPU without bf16 kernels)
    says nothing of the memory of other recompute configurations."""
    gate = _gate(tiny, two_modes, 10**9, device_type="cpu")
    failed = TrainConfig(micro_batch_size=8, precision="bf16", checkpoint=True)
    recompute = TrainConfig(micro_batch_size=8, checkpoint=True)
    before = gate.admits(recompute)
    gate.record_failure(failed, "RuntimeError: could not create a primitive descriptor")
    assert gate.admits(failed) == Verdict(
        admitted=False,
        reason="a real step failed: RuntimeError: could not create a primitive descriptor",
        predicted=None,
        measured=None,
    )
    assert gate.device_error == {} and gate.admits(recompute) == before and before.admitted


class _Loop:
    """A loop that takes every configuration at once (the controller's front-end)."""

    paired, splits_now = False, True

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return proposed

    def apply(self, change: Change) -> Change | None:
        return change

    def b_noise(self) -> float | None:
        return None

    def run_stats(self) -> AllocatorStats | None:
        return None


def test_on_cuda_no_check_step_runs_on_the_host_and_the_first_measured_step_of_a_kind_checks_it(
    tiny: Workload, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Adaptive and the callbacks build it for a model on a GPU: the profile is the fake one
    only, the default starts on its prediction, and its first measured step is the check of its
    kind on the device (said in the history); recomputing is another kind, still unverified."""

    def no_step(*args: object, **kwargs: object) -> StepPeak:
        raise AssertionError("a check step ran on the host for a model on CUDA")

    monkeypatch.setattr(check, "check_step", no_step)
    default = TrainConfig(micro_batch_size=8, grad_clip=None)
    recomputed = dataclasses.replace(default, checkpoint=True)
    gate = BudgetGate.build(tiny, MemoryBudget.parse("1GiB"), default, reduced_precision=False, device_type="cuda")
    assert gate.profile is not None and gate.profile.checks == ()
    controller = Controller(frontend=_Loop(), source=None, gate=gate, default=default, fraction=None, decide_every=4)
    assert controller.begin(tiny, device_type="cuda") == default
    assert gate.admits(default).reason == (
        f"predicted {PREDICTED_B} B (+2% headroom) <= budget 1073741824 B (allocated: no reserved/allocated ratio "
        "measured on this device yet); unverified on cuda until a step of its kind (default) is measured there: "
        "its first step is"
    )
    assert not gate.trusts(default)
    measured = PREDICTED_B + 64  # what the device's tracked step held
    controller.after_step(0, config=default, loss=1.0, peak=measured)
    (note,) = controller.history
    assert (note.source, note.applied, note.measured_bytes) == ("memory", False, measured)
    assert note.reason == (
        f"memory model checked by a measured step (fp32 on cuda, micro-batch 8): predicted "
        f"{format_bytes(PREDICTED_B)}, measured {format_bytes(measured)} (-0.1%), verified"
    )
    assert [(v.kind, v.device, v.verified, v.trial) for v in gate.profile.checks] == [("default", "cuda", True, None)]
    assert gate.trusts(default) and gate.predict(default) == (PREDICTED_B, True)
    assert gate.admits(recomputed).admitted and not gate.trusts(recomputed)
    controller.after_step(1, config=default, loss=1.0, peak=measured)  # the kind is checked: nothing new
    assert len(controller.history) == 1 and len(gate.profile.checks) == 1


def test_on_cuda_a_first_step_off_its_prediction_is_said_and_its_kind_refused_unless_measured(
    tiny: Workload,
) -> None:
    """As a check step off by more than 5% does on the CPU: the kind is unverified, with the figures."""
    gate = _gate(tiny, profile_memory(tiny, modes=("fp32",), verify=False), 10**9)
    with pytest.warns(PredictionWarning, match=r"is unverified: predicted 61184 bytes, measured 73421 bytes"):
        (off,) = gate.record(B, 73_421)  # 1.2x the prediction
    assert (off.kind, off.device, off.verified, off.reason) == (
        "default",
        "cuda",
        False,
        "the prediction is 16.7% below the measured peak",
    )
    assert gate.device_error == {"default": pytest.approx(1.2, abs=1e-4)}
    assert gate.admits(A) == Verdict(
        admitted=False,
        reason="predicted 72769 B, but the prediction is unverified and the config was never measured; x1.2000: "
        "real steps on this device came above the memory model (default)",
        predicted=72_769,
        measured=None,
    )
    assert gate.admits(B).admitted  # measured


def test_on_cuda_only_a_step_of_a_layerdrop_model_that_ran_every_layer_checks_its_kind(tiny: Workload) -> None:
    # The user's own steps may skip layers (LayerDrop), so they peak below the step the profile
    # predicts (every layer running): a check by one would fail as "above the measured peak".
    # Only a step that did not come in under the prediction checks it.
    model = tiny.model_copy()
    model.layerdrop = 0.1  # type: ignore[assignment]  # as a Hugging Face speech encoder holds it
    dropping = dataclasses.replace(tiny, model=model)
    gate = _gate(dropping, profile_memory(dropping, modes=("fp32",), verify=False), 10**9)
    assert gate.record(B, PREDICTED_B * 4 // 5) == ()  # a step that skipped a layer
    assert gate.device_error == {} and not gate.trusts(B)
    assert gate.admits(B).admitted  # measured
    # A step that ran every layer is the step predicted: it checks the kind.
    (check,) = gate.record(B, PREDICTED_B + 64)
    assert (check.kind, check.device, check.verified) == ("default", "cuda", True)


def test_on_the_cpu_a_gate_checks_on_the_host_as_before(tiny: Workload, monkeypatch: pytest.MonkeyPatch) -> None:
    default = TrainConfig(micro_batch_size=8)
    gate = BudgetGate.build(tiny, MemoryBudget.parse("1GiB"), default, reduced_precision=False, device_type="cpu")
    assert gate.profile is not None
    assert [(v.kind, v.device) for v in gate.profile.checks] == [("default", "cpu"), ("recompute", "cpu")]
    assert gate.record(default, 61_184) == () and gate.trusts(default)
