"""The CUDA allocator seam, on the CPU: a fake memory_stats source with exact bytes."""

from __future__ import annotations

import json
import re

import pytest
import torch

from autotune import ConfigError, Measurement, TrainConfig
from autotune.measurement.cuda_memory import (
    RESERVED_HEADROOM,
    AllocatorStats,
    TorchCudaStats,
    alloc_conf_with,
    allocator_source,
    reserved_with_headroom,
)
from autotune.measurement.schedule import Schedule, assemble
from autotune.measurement.tracker import tracked_step
from autotune.report import measurement_table
from autotune.train import Trainer
from tests.conftest import make_resmlp
from tests.measurement.fake_cuda import FakeAllocator

GIB = 1 << 30


def test_stats_are_read_from_the_memory_stats_keys() -> None:
    fake = FakeAllocator(allocated=int(74.2 * GIB), reserved=int(80.8 * GIB), retries=3, ooms=1)
    stats = AllocatorStats.read(fake, torch.device("cuda", 0))
    assert stats == AllocatorStats(allocated_peak=79_671_643_340, reserved_peak=86_758_339_379, alloc_retries=3, ooms=1)
    assert fake.devices == [torch.device("cuda", 0)]
    assert stats.reserved_ratio == 86_758_339_379 / 79_671_643_340


def test_an_empty_memory_stats_reads_as_zeros() -> None:
    # torch.cuda.memory_stats() is {} until the device's first allocation.
    stats = AllocatorStats.from_memory_stats({})
    assert stats == AllocatorStats(allocated_peak=0, reserved_peak=0, alloc_retries=0, ooms=0)
    assert stats.reserved_ratio is None


def test_the_cpu_has_no_allocator_and_cuda_has_torchs() -> None:
    assert allocator_source(torch.device("cpu")) is None
    assert isinstance(allocator_source(torch.device("cuda", 1)), TorchCudaStats)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"allocated_peak": -1}, "AllocatorStats.allocated_peak must be an int >= 0, but got -1."),
        ({"alloc_retries": 1.5}, "AllocatorStats.alloc_retries must be an int >= 0, but got 1.5."),
        ({"ooms": True}, "AllocatorStats.ooms must be an int >= 0, but got True."),
        (
            {"allocated_peak": 11, "reserved_peak": 10},
            "AllocatorStats.reserved_peak must be >= allocated_peak, but got reserved_peak=10 with allocated_peak=11.",
        ),
    ],
)
def test_stats_validation(kwargs: dict[str, object], msg: str) -> None:
    values: dict[str, object] = {"allocated_peak": 0, "reserved_peak": 10, "alloc_retries": 0, "ooms": 0} | kwargs
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        AllocatorStats(**values)  # type: ignore[arg-type]


def test_headroom_arithmetic_is_exact() -> None:
    assert RESERVED_HEADROOM == 0.05
    # 1000 * 1.05 is 1050.0000000000002 in floats: rounding up must not make it 1051.
    assert reserved_with_headroom(1000) == 1050
    assert reserved_with_headroom(1001) == 1052  # 1051.05 rounded up
    assert reserved_with_headroom(18_683_107_737) == 19_617_263_124  # 17.4 GiB reserved
    assert reserved_with_headroom(1000, 0.0) == 1000
    with pytest.raises(ConfigError, match=re.escape("headroom must be in [0, 1), but got 1.0.")):
        reserved_with_headroom(1000, 1.0)
    with pytest.raises(ConfigError, match=re.escape("reserved must be an int >= 0 bytes, but got -1.")):
        reserved_with_headroom(-1)


def _schedule(fake: FakeAllocator, *, budget: int | None) -> tuple[Trainer, Schedule]:
    trainer = Trainer(make_resmlp(), TrainConfig(micro_batch_size=8), device="cpu")
    schedule = Schedule(
        trainer,
        steps=1,
        warmup=1,
        memory_budget=budget,
        tracked_step=lambda: tracked_step(trainer),
        allocator=fake,
    )
    return trainer, schedule


def _measurement(trainer: Trainer, schedule: Schedule, budget: int | None) -> Measurement:
    status, reason = schedule.execute()
    trainer.close()
    report = schedule.report(status, reason)
    return assemble(
        "resmlp", trainer.config, device="cuda:0", warmup=1, steps=1, memory_budget=budget, reports=[report]
    )


# The tracked step of resmlp at micro-batch 8 peaks at 4_653_260 tensor bytes (test_schedule.py).
def test_measurement_reports_allocated_reserved_and_retries() -> None:
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456, retries=2, ooms=0)
    trainer, schedule = _schedule(fake, budget=None)
    m = _measurement(trainer, schedule, None)
    assert m.ok
    assert fake.resets == 1  # the peaks are of the tracked step alone
    assert fake.releases == 1  # with nothing an earlier configuration left (StatsSource.release)
    assert m.allocator == AllocatorStats(allocated_peak=4_700_160, reserved_peak=6_291_456, alloc_retries=2, ooms=0)
    assert (m.device_peak_bytes, m.reserved_bytes, m.peak_bytes) == (4_700_160, 6_291_456, 4_653_260)
    again = Measurement.from_dict(json.loads(m.to_json()))
    assert again == m and again.to_dict()["reserved_bytes"] == 6_291_456
    rows = dict(zip(*(list(c.cells) for c in measurement_table(m).columns[:3:2]), strict=True))
    assert rows["reserved peak"] == "CUDA allocator: segments held (what runs out)"
    assert rows["allocator retries"] == "cache flushed and retried; 0 OOMs so far"


def test_the_budget_is_checked_against_reserved_with_headroom() -> None:
    # Allocated (4_700_160) fits 6_500_000; reserved 6_291_456 + 5% = 6_606_029 does not.
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456)
    trainer, schedule = _schedule(fake, budget=6_500_000)
    m = _measurement(trainer, schedule, 6_500_000)
    assert m.status == "over_budget"
    assert m.reason == (
        "reserved peak 6291456 bytes (+5% headroom: 6606029) exceeds the memory budget of 6500000 bytes"
    )
    assert m.throughput is None and m.reserved_bytes == 6_291_456


def test_reserved_with_headroom_at_the_budget_fits() -> None:
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456)
    trainer, schedule = _schedule(fake, budget=6_606_029)
    assert _measurement(trainer, schedule, 6_606_029).ok


def test_an_allocated_peak_over_the_budget_is_named_as_the_peak() -> None:
    fake = FakeAllocator(allocated=5_000_000, reserved=6_291_456)
    trainer, schedule = _schedule(fake, budget=4_900_000)
    m = _measurement(trainer, schedule, 4_900_000)
    assert m.reason == "peak 5000000 bytes exceeds the memory budget of 4900000 bytes"


def test_old_records_without_allocator_read_back() -> None:
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456)
    trainer, schedule = _schedule(fake, budget=None)
    data = _measurement(trainer, schedule, None).to_dict()
    del data["allocator"], data["reserved_bytes"]
    assert Measurement.from_dict(data).allocator is None


@pytest.mark.parametrize(
    ("existing", "expandable", "conf"),
    [
        (None, True, "expandable_segments:True"),
        ("", False, "expandable_segments:False"),
        ("max_split_size_mb:128", True, "max_split_size_mb:128,expandable_segments:True"),
        (
            "expandable_segments:False, garbage_collection_threshold:0.6",
            True,
            "garbage_collection_threshold:0.6,expandable_segments:True",
        ),
    ],
)
def test_the_allocator_conf_keeps_the_users_other_settings(existing: str | None, expandable: bool, conf: str) -> None:
    assert alloc_conf_with(existing, expandable_segments=expandable) == conf


class _Compiled(torch.nn.Module):
    """A stand-in for ``torch.compile(model)``: calls the model, counts the calls, and moves the
    fake allocator's peaks to what the compiled step holds (so the test tells whose peaks are read)."""

    def __init__(self, model: torch.nn.Module, fake: FakeAllocator) -> None:
        super().__init__()
        self.inner, self.fake, self.calls = model, fake, 0

    def forward(self, *args: object, **kwargs: object) -> object:
        self.calls += 1
        self.fake.stats["allocated_bytes.all.peak"] = 3_000_000
        self.fake.stats["reserved_bytes.all.peak"] = 4_194_304
        return self.inner(*args, **kwargs)


def test_a_compiled_configuration_reads_the_allocator_over_one_more_compiled_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456)
    made: list[_Compiled] = []

    def compile_(model: torch.nn.Module, **kwargs: object) -> torch.nn.Module:
        made.append(_Compiled(model, fake))
        return made[-1]

    monkeypatch.setattr(torch, "compile", compile_)
    trainer = Trainer(make_resmlp(), TrainConfig(micro_batch_size=8, compile="default"), device="cpu")
    forwards: list[int] = []
    trainer.model.register_forward_hook(lambda *_: forwards.append(len(schedule.results)))
    schedule = Schedule(
        trainer, steps=1, warmup=1, memory_budget=None, tracked_step=lambda: tracked_step(trainer), allocator=fake
    )
    status, _ = schedule.execute()
    trainer.close()
    assert status == "ok" and len(made) == 1
    # The tracked step ran eagerly (not through the compiled module); one more, compiled step
    # followed it, with the allocator's peaks reset before it and read after it.
    # Warm-up steps train as two halves (the noise split), then the extra compiled step and the timed one.
    assert made[0].calls == 2 * schedule.warmed + 1 + 1
    assert len(forwards) == made[0].calls + 1  # the tracked step's one forward: the model itself
    assert len(schedule.results) == schedule.warmed + 1 + 1 + 1
    assert fake.resets == 2
    assert schedule.allocator_stats == AllocatorStats(
        allocated_peak=3_000_000, reserved_peak=4_194_304, alloc_retries=0, ooms=0
    )
    assert schedule.tracked is not None and schedule.tracked.at_peak.total == 4_653_260  # the eager peak


def test_an_eager_configuration_runs_no_extra_step(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeAllocator(allocated=4_700_160, reserved=6_291_456)
    trainer, schedule = _schedule(fake, budget=None)
    assert schedule.execute() == ("ok", None)
    trainer.close()
    assert fake.resets == 1 and len(schedule.results) == schedule.warmed + 1 + 1
