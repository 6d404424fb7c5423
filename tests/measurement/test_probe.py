from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest
import torch

from autotune import TrainConfig
from autotune.measurement.probe import (
    MachineSpeeds,
    PrecisionSpeeds,
    probe_precisions,
    probe_speeds,
    reduced_precisions,
)
from autotune.resolve import load_workload
from autotune.train.local import Trainer
from autotune.workload import Workload
from tests.paths import DATA


@dataclass
class _Step:
    seconds: float


class ScriptedLoop:
    """Step times by configuration: what the probe must divide, exactly."""

    def __init__(self, seconds: dict[tuple[str, bool], list[float]], fail: Exception | None = None) -> None:
        self.seconds, self.fail = seconds, fail
        self.configs: list[TrainConfig] = []

    def reconfigure(self, config: TrainConfig) -> None:
        self.configs.append(config)

    def step(self) -> _Step:
        config = self.configs[-1]
        if self.fail is not None and config.precision == "bf16":
            raise self.fail
        return _Step(self.seconds[(str(config.precision), bool(config.checkpoint))].pop(0))


BASE = TrainConfig(micro_batch_size=8, grad_accum_steps=2, precision=("fp32", "bf16"), checkpoint=(True, False))


def test_speeds_are_best_of_steps_ratios_and_the_loop_ends_on_its_base() -> None:
    loop = ScriptedLoop({("fp32", False): [0.5, 0.4], ("fp32", True): [0.6, 0.7], ("bf16", False): [0.3, 0.1]})
    speeds = probe_speeds(loop, BASE)
    assert speeds == MachineSpeeds(reduced_speed=0.4 / 0.1, recompute_cost=0.6 / 0.4 - 1.0)
    plain = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    assert loop.configs == [
        plain,
        TrainConfig(micro_batch_size=8, grad_accum_steps=2, checkpoint=True),
        TrainConfig(micro_batch_size=8, grad_accum_steps=2, precision="bf16"),
        BASE,
    ]


def test_reduced_precision_that_cannot_run_reads_as_speed_zero_once_cleaned_up() -> None:
    cleaned: list[bool] = []
    loop = ScriptedLoop(
        {("fp32", False): [1.0, 1.0], ("fp32", True): [1.5, 1.5]},
        fail=RuntimeError("could not create a primitive descriptor\nfor bf16"),
    )
    speeds = probe_speeds(loop, BASE, recover=lambda: cleaned.append(True))
    assert speeds == MachineSpeeds(
        reduced_speed=0.0, recompute_cost=0.5, reduced_failure="RuntimeError: could not create a primitive descriptor"
    )
    assert cleaned == [True] and loop.configs[-1] == BASE


def test_without_recovery_or_on_out_of_memory_the_error_propagates() -> None:
    seconds = {("fp32", False): [1.0] * 4, ("fp32", True): [1.0] * 4}
    with pytest.raises(RuntimeError, match="primitive"):
        probe_speeds(ScriptedLoop(dict(seconds), fail=RuntimeError("primitive")), BASE)
    with pytest.raises(torch.OutOfMemoryError):
        probe_speeds(
            ScriptedLoop(dict(seconds), fail=torch.OutOfMemoryError("CUDA out of memory")), BASE, recover=lambda: None
        )


def test_known_unusable_reduced_precision_is_not_stepped() -> None:
    loop = ScriptedLoop({("fp32", False): [1.0, 2.0], ("fp32", True): [3.0, 3.0]}, fail=AssertionError("stepped"))
    assert probe_speeds(loop, BASE, probe_reduced=False) == MachineSpeeds(reduced_speed=0.0, recompute_cost=2.0)


def test_a_real_trainer_that_cannot_run_bf16_gets_speed_zero_and_no_stale_gradients() -> None:
    workload: Workload = load_workload(f"{DATA / 'no_low_precision.py'}:build")
    config = TrainConfig(micro_batch_size=8)
    trainer = Trainer(workload, config, track_noise=False)
    speeds = probe_speeds(trainer, config, recover=lambda: trainer.optimizer.zero_grad(set_to_none=True))
    assert speeds.reduced_speed == 0.0 and math.isfinite(speeds.recompute_cost)
    assert speeds.reduced_failure == (
        "RuntimeError: could not create a primitive descriptor for this op in reduced precision"
    )
    assert trainer.config == config
    assert all(p.grad is None for p in trainer.model.parameters())


def test_every_precision_is_timed_against_fp32_and_the_loop_ends_on_its_base() -> None:
    loop = ScriptedLoop({("fp32", False): [0.6, 0.5], ("bf16", False): [0.2, 0.25], ("fp16", False): [0.3, 0.25]})
    speeds = probe_precisions(loop, BASE, precisions=("bf16", "fp16"))
    assert speeds == PrecisionSpeeds(speeds={"fp32": 1.0, "bf16": 0.5 / 0.2, "fp16": 0.5 / 0.25}, failures={})
    plain = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    assert loop.configs == [
        plain,
        dataclasses.replace(plain, precision="bf16"),
        dataclasses.replace(plain, precision="fp16"),
        BASE,
    ]


def test_a_precision_that_cannot_run_reads_as_zero_and_the_others_are_still_timed() -> None:
    loop = ScriptedLoop({("fp32", False): [1.0], ("fp16", False): [0.5]}, fail=RuntimeError("no bf16 LSTM\nhere"))
    speeds = probe_precisions(loop, BASE, precisions=("bf16", "fp16"), steps=1, recover=lambda: None)
    assert speeds == PrecisionSpeeds(
        speeds={"fp32": 1.0, "bf16": 0.0, "fp16": 2.0}, failures={"bf16": "RuntimeError: no bf16 LSTM"}
    )


def test_fp16_is_probed_on_cuda_only() -> None:
    assert reduced_precisions("cuda") == ("bf16", "fp16")
    assert reduced_precisions("cpu") == ("bf16",)


def test_a_model_held_in_bf16_is_probed_without_a_bf16_step_and_reads_as_speed_zero(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.measurement import probe

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()) for _ in range(2)))
    workload = Workload(
        name="held",
        model=model.to(torch.bfloat16),
        dataset=torch.utils.data.TensorDataset(torch.randn(16, 8)),
        loss_fn=lambda m, b: m(b[0].bfloat16()).float().square().mean(),
        batch_size=8,
        blocks=["0", "1"],
    )
    stepped: list[object] = []
    real = probe._time_probes

    def timed(loop: object, probes: dict[str, TrainConfig], **kwargs: object) -> object:
        stepped.extend(probes)
        return real(loop, probes, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(probe, "_time_probes", timed)
    speeds = probe.probe_workload(workload, TrainConfig(micro_batch_size=8))
    assert stepped == ["plain", "recompute"]  # no bf16 step: it would be the same step
    assert speeds.reduced_speed == 0.0 and speeds.reduced_failure == "held's parameters are bfloat16 already"
