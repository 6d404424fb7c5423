from __future__ import annotations

import re

import pytest
import torch

from autotune import TrainConfig
from autotune.adapt.loop import InPlaceTrainer
from autotune.errors import ConfigError
from autotune.train import Trainer
from tests.conftest import make_resmlp
from tests.measurement.fake_cuda import FakeAllocator


def test_the_trainer_trains_given_objects_in_place() -> None:
    wl = make_resmlp()
    model = wl.model
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(wl, TrainConfig(micro_batch_size=16, grad_clip=None), model=model, optimizer=opt)
    trainer.step()
    trainer.close()
    assert trainer.model is model and trainer.optimizer is opt
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_an_optimizer_without_its_model_is_refused() -> None:
    wl = make_resmlp()
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    message = "Trainer(optimizer=...) needs model=... too: the optimizer must hold that model's parameters."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Trainer(wl, TrainConfig(), optimizer=opt)


def test_the_data_stream_keeps_its_place_across_micro_batch_changes() -> None:
    wl = make_resmlp()  # 1024 samples
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    trainer = InPlaceTrainer(
        wl, TrainConfig(micro_batch_size=32), model=wl.model, optimizer=opt, device=None, track_noise=False
    )
    trainer.step()
    trainer.reconfigure(TrainConfig(micro_batch_size=8, grad_accum_steps=4))
    trainer.step()
    trainer.close()
    assert (trainer.stream.epoch, trainer.stream.offset) == (0, 64)  # no sample replayed, none skipped


def test_a_measured_step_reads_the_allocator_where_there_is_one() -> None:
    wl = make_resmlp()
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    trainer = InPlaceTrainer(
        wl, TrainConfig(micro_batch_size=8), model=wl.model, optimizer=opt, device=None, track_noise=False
    )
    assert (trainer.allocator, trainer.allocator_stats) == (None, None)  # the CPU has no allocator to read
    fake = trainer.allocator = FakeAllocator(allocated=4_700_160, reserved=6_291_456, retries=1)
    _, peak = trainer.measured_step()
    trainer.close()
    assert (fake.releases, fake.resets) == (1, 1) and peak > 0
    stats = trainer.allocator_stats
    assert stats is not None and (stats.allocated_peak, stats.reserved_peak, stats.alloc_retries) == (
        4_700_160,
        6_291_456,
        1,
    )


class _Cache(FakeAllocator):
    """Holds the reserved segments of an earlier, larger configuration until released."""

    def __init__(self, *, allocated: int, reserved: int, cached: int) -> None:
        super().__init__(allocated=allocated, reserved=max(reserved, cached))
        self.own = reserved
        self.calls: list[str] = []

    def release(self, device: torch.device) -> None:
        super().release(device)
        self.calls.append("release")
        self.stats["reserved_bytes.all.peak"] = self.own

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        super().reset_peak_memory_stats(device)
        self.calls.append("reset")


def test_a_measured_step_reads_its_own_reserved_segments_not_the_cache_of_earlier_configurations() -> None:
    # On an H200, train --adapt moved from 16x1 to 8x2: the step's reserved peak was 16x1's cached
    # segments, and the reserved/allocated ratio scaling every later prediction read 1.83, not 1.11.
    wl = make_resmlp()
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    trainer = InPlaceTrainer(
        wl, TrainConfig(micro_batch_size=8), model=wl.model, optimizer=opt, device=None, track_noise=False
    )
    fake = trainer.allocator = _Cache(allocated=4_700_160, reserved=5_242_880, cached=8_589_312)
    trainer.measured_step()
    trainer.close()
    assert fake.calls == ["release", "reset"]
    stats = trainer.allocator_stats
    assert stats is not None and (stats.reserved_peak, stats.reserved_ratio) == (5_242_880, 5_242_880 / 4_700_160)
