"""The controller's start search, on scripted verdicts (no model)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autotune import TrainConfig
from autotune.adapt.controller import Controller
from autotune.adapt.gate import Verdict
from autotune.adapt.records import Change
from autotune.errors import ConfigError

UNVERIFIED = "predicted 500 B, but the prediction is unverified and the config was never measured"


class _Loop:
    """A framework's loop: per-block knobs only, no new split before the first step."""

    paired, splits_now = False, False

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return dataclasses.replace(current, precision=proposed.precision, checkpoint=proposed.checkpoint)

    def apply(self, change: Change) -> Change | None:
        return change

    def b_noise(self) -> float | None:
        return None

    def run_stats(self) -> Any:
        return None


class _Gate:
    """The default is over the budget; recompute is small enough but its prediction unverified."""

    budget, headroom = 1000, 0.02

    def __init__(self) -> None:
        self.measured: dict[TrainConfig, int] = {}

    def check(self, config: TrainConfig) -> Verdict:
        if config.checkpoint:
            return Verdict(admitted=False, reason=UNVERIFIED, predicted=500, measured=None)
        return Verdict(admitted=False, reason="predicted 2000 B > budget 1000 B", predicted=2000, measured=None)


def test_a_start_small_enough_but_unverified_says_so_not_that_the_budget_is_too_small() -> None:
    default = TrainConfig(micro_batch_size=8)
    controller = Controller(frontend=_Loop(), source=None, gate=_Gate(), default=default, fraction=None, decide_every=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        controller.start()
    assert str(caught.value) == (
        "no fp32 configuration of batch 8 at the loop's split 8 x 1 is known to fit memory_budget 1000 B: " + UNVERIFIED
    )
