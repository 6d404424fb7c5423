from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch
from torch import nn

from autotune import ConfigError, Measurement, TrainConfig, TrainingError, UnsupportedError, Workload, measure
from autotune.train import Trainer
from tests.conftest import make_resmlp


def _m(wl: Workload, **cfg: object) -> Measurement:
    return measure(wl, TrainConfig(**cfg), steps=2, warmup=1)  # type: ignore[arg-type]


def test_checkpointing_every_block_lowers_activations_and_keeps_the_first_loss() -> None:
    wl = make_resmlp()
    plain, ckpt = _m(wl, micro_batch_size=8), _m(wl, micro_batch_size=8, checkpoint=True)
    assert plain.ok and ckpt.ok
    assert plain.category_peaks is not None and ckpt.category_peaks is not None
    # Exact bytes for this model (4 blocks, d=64, seq 32, micro-batch 8), identical on every run.
    # The dataset's own storage is not in them (the tracker ignores views of it).
    assert (plain.category_peaks.activations, ckpt.category_peaks.activations) == (2_779_136, 804_864)
    assert ckpt.losses[0] == plain.losses[0]
    assert ckpt.memory is not None and plain.memory is not None
    assert ckpt.memory.parameters == plain.memory.parameters == wl.num_parameters * 4 == 536_848


def test_bf16_autocast_on_every_block_lowers_activations() -> None:
    wl = make_resmlp()
    fp32, bf16 = _m(wl, micro_batch_size=8), _m(wl, micro_batch_size=8, precision="bf16")
    assert fp32.category_peaks is not None and bf16.category_peaks is not None
    assert bf16.category_peaks.activations < fp32.category_peaks.activations
    assert (fp32.category_peaks.activations, bf16.category_peaks.activations) == (2_779_136, 1_829_504)


def test_memory_repeats_exactly_across_runs() -> None:
    wl = make_resmlp()
    config = TrainConfig(
        micro_batch_size=8,
        grad_accum_steps=2,
        precision=("bf16", "fp32", "fp16", "fp32"),
        checkpoint=(True, False, False, True),
    )
    first, second = measure(wl, config, steps=1, warmup=1), measure(wl, config, steps=1, warmup=1)
    assert first.memory == second.memory
    assert first.category_peaks == second.category_peaks
    assert first.losses == second.losses


def test_over_budget_is_reported_with_reason_and_no_throughput() -> None:
    wl = make_resmlp()
    m = measure(wl, TrainConfig(micro_batch_size=8), steps=2, warmup=1, memory_budget=1_000_000)
    assert m.status == "over_budget"
    assert m.reason == f"peak {m.peak_bytes} bytes exceeds the memory budget of 1000000 bytes"
    assert m.throughput is None and m.throughput_per_gib is None
    assert m.peak_bytes == 4_653_260


def test_real_out_of_memory_is_a_result() -> None:
    base = make_resmlp()

    def greedy_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        torch.empty(2**62, dtype=torch.uint8)  # the CPU allocator refuses: a real OOM
        return base.loss_fn(model, batch)

    wl = Workload(name="greedy", model=base.model, dataset=base.dataset, loss_fn=greedy_loss)
    m = _m(wl, micro_batch_size=8)
    assert m.status == "oom"
    assert m.reason is not None and m.reason.startswith("out of memory: ")
    assert "DefaultCPUAllocator: can't allocate memory" in m.reason


def test_other_training_errors_are_raised_as_training_error() -> None:
    base = make_resmlp()

    def broken_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        raise RuntimeError("shape mismatch in user code")

    wl = Workload(name="broken", model=base.model, dataset=base.dataset, loss_fn=broken_loss)
    message = (
        "training 'broken' failed under micro x acc x ranks 8x1x1 | fp32 | ckpt none | ZeRO 0: "
        "RuntimeError: shape mismatch in user code"
    )
    with pytest.raises(TrainingError, match=f"^{re.escape(message)}$") as info:
        _m(wl, micro_batch_size=8)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_divergence_is_detected() -> None:
    base = make_resmlp()

    def nan_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return base.loss_fn(model, batch) * float("nan")

    wl = Workload(name="nan", model=base.model, dataset=base.dataset, loss_fn=nan_loss)
    m = _m(wl, micro_batch_size=8)
    assert m.status == "diverged"
    assert m.reason == "loss is nan at step 1"


def test_gradient_noise_and_loss_trend_are_reported() -> None:
    m = measure(make_resmlp(), TrainConfig(micro_batch_size=8, grad_accum_steps=4), steps=4, warmup=2)
    # Every step has 4 micro-batches: 2-6 warmup (more while step times had not settled: the
    # measurement says how many) + 1 tracked + 4 timed.
    assert 2 <= m.warmup <= 6 and m.noise.steps == m.warmup + 5
    assert m.noise.b_simple is not None and m.noise.b_simple > 0
    assert m.noise.sigma2 is not None and m.noise.sigma2 > 0
    assert len(m.losses) == m.warmup + 5 and m.loss_slope is not None
    assert m.throughput is not None and m.throughput_p25 is not None and m.throughput_p75 is not None
    assert m.throughput_p25 <= m.throughput <= m.throughput_p75


def test_with_single_micro_batch_the_warmup_steps_feed_the_noise_estimate() -> None:
    m = measure(make_resmlp(), TrainConfig(micro_batch_size=8), steps=2, warmup=3)
    assert 3 <= m.warmup <= 7 and m.noise.steps == m.warmup  # every warmup step, however many ran


def test_fp16_uses_loss_scaling_and_counts_overflows() -> None:
    m = _m(make_resmlp(), micro_batch_size=8, precision="fp16")
    assert m.ok
    assert m.overflow_steps == 0


def test_measurement_json_round_trip() -> None:
    m = _m(make_resmlp(), micro_batch_size=8, precision=("bf16", "fp32", "fp32", "fp32"))
    again = Measurement.from_dict(__import__("json").loads(m.to_json()))
    assert again == m


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"steps": 0}, "measure: steps must be an int >= 1, but got 0."),
        ({"warmup": 0}, "measure: warmup must be an int >= 1, but got 0."),
        ({"memory_budget": -5}, "measure: memory_budget must be a positive number of bytes, but got -5."),
    ],
)
def test_bad_arguments(kwargs: dict[str, int], msg: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        measure(make_resmlp(), TrainConfig(), **kwargs)


def test_micro_batch_larger_than_dataset() -> None:
    msg = "TrainConfig.micro_batch_size must be <= the dataset size of workload 'resmlp' (1024), but got 2048."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        _m(make_resmlp(), micro_batch_size=2048)


def test_fp16_on_cpu_deepspeed_ranks_is_unsupported() -> None:
    # zero_stage > 0 or ranks > 1 runs on DeepSpeed ranks (tests/train/test_zero.py); DeepSpeed
    # refuses fp16 on this CPU, and measure says so before starting any rank.
    msg = (
        "TrainConfig.precision fp16 cannot run on a CPU DeepSpeed engine (DeepSpeed refuses it: "
        "'Type fp16 is not supported on your device'); use bf16 or fp32, or a CUDA device."
    )
    wl = dataclasses.replace(make_resmlp(), source="tests.conftest:make_resmlp")
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        measure(wl, TrainConfig(zero_stage=2, ranks=2, precision="fp16"), device="cpu")


def test_the_measurement_home_leaves_deepspeed_ranks_to_autotune_measure() -> None:
    from autotune.measurement import measure_local

    config = TrainConfig(zero_stage=2, ranks=2)
    msg = (
        "measure_local runs one process: a DeepSpeed configuration is measured on its ranks by autotune.measure, "
        f"but got {config.describe()}."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        measure_local(make_resmlp(), config)


def test_the_local_trainer_runs_one_process_only() -> None:
    msg = (
        "Trainer runs one local process (zero_stage=0, ranks=1), but got zero_stage=2 with ranks=2; "
        "measure() runs those on DeepSpeed ranks."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        Trainer(make_resmlp(), TrainConfig(zero_stage=2, ranks=2))


@pytest.mark.parametrize(
    ("seconds", "warmed"),
    [((3.0, 1.0, 1.05), 3), ((1.0, 1.02), 2), ((9.0, 7.0, 5.0, 3.0, 2.0, 1.0, 0.5), 6)],
    ids=["compiles-then-settles", "settled-at-once", "capped"],
)
def test_warmup_runs_until_two_successive_steps_agree(seconds: tuple[float, ...], warmed: int) -> None:
    """Scripted step times: 2 warmup steps at least, more while the last two differ by over 10%,
    at most 2 + EXTRA_WARMUP; the tracked step and the timed ones come after."""
    from autotune.measurement.schedule import EXTRA_WARMUP, Schedule
    from autotune.measurement.tracker import tracked_step

    trainer = Trainer(make_resmlp(), TrainConfig(micro_batch_size=8), device="cpu")
    real, script = trainer.step, iter(seconds)

    def step(**kwargs: Any) -> Any:
        return dataclasses.replace(real(**kwargs), seconds=next(script, 0.5))

    trainer.step = step  # type: ignore[method-assign]
    schedule = Schedule(trainer, steps=2, warmup=2, memory_budget=None, tracked_step=lambda: tracked_step(trainer))
    try:
        assert schedule.execute() == ("ok", None)
    finally:
        trainer.close()
    assert schedule.warmed == warmed <= 2 + EXTRA_WARMUP
    assert schedule.report("ok", None).warmup_steps == warmed
    assert len(schedule.results) == warmed + 1 + 2


def test_a_closed_trainer_is_freed_without_the_cyclic_collector() -> None:
    """Measured one after another in one process, each configuration's model copy and optimizer
    state go when its measurement ends (on an H100 each closed trainer's +0.9 GiB stayed allocated
    into the next measurement until the cyclic collector ran)."""
    import gc

    wl = make_resmlp()
    gc.collect()
    gc.disable()
    try:
        for batch in (4, 8, 4):
            measure(wl, TrainConfig(micro_batch_size=batch), steps=1, warmup=1)
        alive = sum(type(o) is Trainer for o in gc.get_objects())
    finally:
        gc.enable()
    assert alive <= 1
