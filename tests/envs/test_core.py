"""The observation every policy sees (``observation_vector``): never a NaN (issue 19)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from autotune.envs._codec import Levels
from autotune.envs.core import (
    OBSERVATION_SIZE,
    Interval,
    MachineDescriptor,
    ModelDescriptor,
    TuningEnv,
    observation_vector,
)

from autotune.errors import NonFiniteLossError


def _interval(loss: float) -> Interval:
    return Interval(
        batch=32, throughput=100.0, peak_bytes=1000, b_noise=None, loss=loss, train_seconds=1.0, reconfig_seconds=0.0
    )


def _observe(*, loss: float = 1.0, first: float = 2.0, losses: tuple[float, ...] = (2.0, 1.0)) -> np.ndarray:
    model = ModelDescriptor(
        num_parameters=1000, activation_bytes_per_sample=100.0, num_blocks=4, top_quarter_share=0.25
    )
    return observation_vector(
        _interval(loss),
        first=_interval(first),
        losses=list(losses),
        t=1,
        horizon=8,
        levels=Levels(),
        model=model,
        machine=MachineDescriptor(reduced_speed=1.0, budget_ratio=2.0),
        budget=2000,
        batch=32,
        batch0=32,
        ranks=1,
        adapt_batch=False,
    )


def test_finite_losses_give_a_finite_observation() -> None:
    obs = _observe()
    assert obs.shape == (OBSERVATION_SIZE,) and np.isfinite(obs).all()


@pytest.mark.parametrize(
    ("kwargs", "value"),
    [
        ({"loss": math.nan}, "nan"),
        ({"loss": math.inf}, "inf"),
        ({"first": -math.inf}, "-inf"),
        ({"losses": (2.0, math.nan, 1.0)}, "nan"),  # a recent loss: the slope reads it
    ],
)
def test_a_non_finite_loss_never_reaches_a_policy(kwargs: dict[str, object], value: str) -> None:
    message = f"the loss is {value}: a policy cannot act on a diverged run"
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        _observe(**kwargs)  # type: ignore[arg-type]


class _Peaks(TuningEnv):
    """A 16-sample batch whose peak is 10 B per sample of the micro-batch, plus 50 B without
    recompute, under a budget of 100 B: the PyTorch default (16 x 1, 210 B) is over it."""

    def __init__(self, floor: int | None) -> None:
        super().__init__(horizon=4)
        self.start_within_budget, self.micro_floor = True, floor

    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        model = ModelDescriptor(num_parameters=1, activation_bytes_per_sample=1.0, num_blocks=4, top_quarter_share=0.5)
        return Levels.default_for(16), model, MachineDescriptor(reduced_speed=1.0, budget_ratio=2.0), 100

    def _peak_bytes(self, knobs: Levels) -> int:
        return 10 * knobs.micro_batch_size + (0 if knobs.checkpoint else 50)

    def _train(self, knobs: Levels) -> Interval:
        return Interval(
            batch=16, throughput=1.0, peak_bytes=1, b_noise=None, loss=1.0, train_seconds=1.0, reconfig_seconds=0.0
        )


@pytest.mark.parametrize(
    ("floor", "start"),
    [
        (1, Levels(micro=2, accum=2)),  # 4 x 4: 90 B, the first smaller micro-batch within
        (8, Levels(micro=3, accum=1, checkpoint=4)),  # 8 x 2 at most: then every block recomputed
        (None, Levels(micro=4, accum=0)),  # no split and 160 B recomputed: none fits, the default
    ],
)
def test_an_episode_over_the_budget_starts_where_an_adaptive_run_would(floor: int | None, start: Levels) -> None:
    env = _Peaks(floor)
    env.reset(seed=0)
    assert env._cursor == start
    assert env._verdict(Levels.default_for(16)).reason == "measured 210 B > budget 100 B"
