"""What an :class:`~autotune.adapt.adaptive.Adaptive` run holds and reports: its attributes (set
at its construction) and the read-only views of its decisions, budget, model and optimizer."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from autotune.adapt.loop import AdaptLoop, InPlaceTrainer
from autotune.adapt.records import AdaptStep, Change, ConfigRecord, OverBudgetStep
from autotune.config import TrainConfig
from autotune.errors import UnsupportedError

if TYPE_CHECKING:
    from autotune.adapt.controller import Controller
    from autotune.adapt.decider import Decider
    from autotune.adapt.loop import LoopHooks
    from autotune.adapt.shape_guard import ShapeGuard
    from autotune.adapt.sources import DecisionSource
    from autotune.memory.gate import BudgetGate
    from autotune.workload import Workload

__all__ = ["RunViews"]

_NO_LOCAL_MODEL = (
    "Adaptive.on_ranks trains the model in the rank processes: there is no model or optimizer object in this one."
)


class RunViews:
    """The base of :class:`~autotune.adapt.adaptive.Adaptive`: its attributes and read-only views."""

    workload: Workload
    source: DecisionSource | None
    decide_every: int
    adapt_batch: bool
    min_efficiency: float
    max_batch_size: int | None
    track_memory: str
    gate: BudgetGate
    guard: ShapeGuard
    controller: Controller
    decider: Decider
    trainer: AdaptLoop
    steps: list[AdaptStep]
    _device_type: str
    _hooks: LoopHooks
    _noise: bool
    _ran: set[TrainConfig]  # configurations that ran a step in this process

    @property
    def config(self) -> TrainConfig:
        """The configuration the next step runs under."""
        return self.trainer.config

    @property
    def history(self) -> tuple[Change, ...]:
        """Every decision so far: applied, refused by the budget gate, or reverted."""
        return tuple(self.decider.history)

    @property
    def over_budget_steps(self) -> tuple[OverBudgetStep, ...]:
        """Every step whose measured peak was over the budget; empty if the run kept to its budget.

        Each was also warned of with an :class:`~autotune.errors.OverBudgetWarning`.
        """
        return tuple(self.controller.over_budget)

    @property
    def configs(self) -> tuple[ConfigRecord, ...]:
        """Every configuration judged so far (known peak and throughput), in the order first run."""
        return tuple(self.decider.judged.values())

    @property
    def best(self) -> ConfigRecord | None:
        """The judged configuration within the budget with the most throughput per GiB of peak
        (the ``throughput`` objective: the most throughput).

        Goodput with ``adapt_batch``: what a study would recommend among them. None before any
        configuration is judged.
        """
        return self.decider.best

    @property
    def budget_bytes(self) -> int:
        """The memory budget in bytes (per rank on ranks)."""
        return self.gate.budget

    @property
    def model(self) -> torch.nn.Module:
        """The user's model (on ranks there is none here: each rank trains its own copy)."""
        return self._in_place().model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The user's optimizer (on ranks there is none here, as for :attr:`model`)."""
        return self._in_place().optimizer

    def _in_place(self, refusal: str = _NO_LOCAL_MODEL) -> InPlaceTrainer:
        """The local loop; on ranks (the training lives in the rank processes) ``refusal``."""
        if not isinstance(self.trainer, InPlaceTrainer):
            raise UnsupportedError(refusal)
        return self.trainer
