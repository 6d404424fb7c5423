"""The observation every policy sees (``observation_vector``): never a NaN (issue 19)."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from autotune.envs.core import OBSERVATION_SIZE, Interval, MachineDescriptor, ModelDescriptor, observation_vector

from autotune.errors import NonFiniteLossError
from autotune.knobs import KnobLevels


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
        levels=KnobLevels(),
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
