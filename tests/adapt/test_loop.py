from __future__ import annotations

import re

import pytest
import torch

from autotune import TrainConfig
from autotune.adapt.loop import InPlaceTrainer
from autotune.errors import ConfigError
from autotune.train import Trainer
from tests.conftest import make_resmlp


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
    trainer = InPlaceTrainer(wl, TrainConfig(micro_batch_size=32), model=wl.model, optimizer=opt, device=None,
                             track_noise=False)  # fmt: skip
    trainer.step()
    trainer.reconfigure(TrainConfig(micro_batch_size=8, grad_accum_steps=4))
    trainer.step()
    trainer.close()
    assert (trainer.stream.epoch, trainer.stream.offset) == (0, 64)  # no sample replayed, none skipped
