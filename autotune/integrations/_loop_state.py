"""A framework loop's arguments and state: what every part of
:class:`~autotune.integrations._framework.FrameworkLoop` reads (its mixins included), and what the
callbacks read of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autotune.adapt.controller import Controller
from autotune.adapt.decider import Decider
from autotune.adapt.records import Change
from autotune.adapt.source_choice import PolicyArg, decision_source
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.integrations._flags import LoopPrecision, ModelCheckpointing
from autotune.knobs import check_min_micro_batch
from autotune.measurement.cuda_memory import AllocatorStats, StatsSource
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective
from autotune.measurement.progress import Note, notes
from autotune.memory.gate import BudgetGate
from autotune.train.wrappers import BlockWrappers
from autotune.units import DEFAULT_PEAK, MemoryBudget

__all__ = ["LoopState"]


class LoopState:
    """The loop's checked arguments, its state (set at ``begin``) and the controller's views the
    callbacks read: the base of :class:`~autotune.integrations._framework.FrameworkLoop` and of
    its mixins."""

    def __init__(
        self,
        *,
        policy: PolicyArg,
        memory_budget: MemoryBudget | str | int | None,
        decide_every: int,
        blocks: list[str] | None,
        min_micro_batch: int | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        progress: bool | Note = True,
    ) -> None:
        if not isinstance(decide_every, int) or isinstance(decide_every, bool) or decide_every < 2:
            raise ConfigError(f"decide_every must be an int >= 2, but got {decide_every!r}.")
        self.objective = check_objective(objective)
        self.note = notes(progress)  # the setup's phase lines, as autotune.Adaptive's
        self.source = decision_source(policy)
        self.budget = MemoryBudget.parse(memory_budget, default=DEFAULT_PEAK)
        self.decide_every = decide_every
        self.blocks = blocks
        self.min_micro_batch = check_min_micro_batch(min_micro_batch)
        self.controller: Controller | None = None
        self._model: torch.nn.Module | None = None
        self._wrappers: BlockWrappers | None = None
        self._names: tuple[str, ...] = ()
        # The model's parameter layout (Workload.fingerprint) and size, saved with the state.
        self._model_id: dict[str, Any] = {}
        self._started: float | None = None
        self._warm = False  # whether the step under way is timed: not the first after a change
        self.split = False  # whether the loop lets the micro-batch x accumulation split change
        self.split_why: str | None = None  # why it does not, where begin() found it (a counted loss)
        # The CUDA caching allocator of the model's device (None on the CPU): its reserved/allocated
        # ratio scales the gate's predictions (the framework's steps are not tracked one by one).
        self.allocator: StatsSource | None = None
        self._device: torch.device | None = None
        #: The measured peak bytes of the step that just ran under a configuration, where the loop
        #: can measure one (None: no measurement, the default: see the module's docstring).
        self.measure_peak: Callable[[TrainConfig], int | None] | None = None
        self._resume: dict[str, Any] | None = None  # a saved state, restored at begin()
        #: The first evaluation's measured peak bytes (on CUDA: the allocator's reserved peak), None
        #: before one ran under the callback (see the module's docstring).
        self.evaluation_peak: int | None = None
        self._evaluating = False
        self._tracker: Any = None  # the CPU's exact tracker over the first evaluation
        # CUDA: the training windows' peaks so far (an evaluation's left out), kept across resets.
        self._trained: AllocatorStats | None = None
        #: The loop's own precision, from the user's flags (set at :meth:`begin`).
        self.precision = LoopPrecision()
        # The model's method the loop calls for a step's forward and loss: the outer precision's
        # autocast wraps it (Lightning calls training_step, which need not call forward).
        self.outer_around = "forward"
        #: The model's own checkpointing flags, taken over at :meth:`begin` (None before).
        self.checkpointing: ModelCheckpointing | None = None
        #: How the loop compiles the model (``"torch_compile=True"``; set at :meth:`begin`), None: eager.
        self.compiled: str | None = None

    # ---- what the callbacks read ----------------------------------------------------------------------

    @property
    def history(self) -> list[Change]:
        """Every decision so far (empty before :meth:`begin`)."""
        return self.controller.history if self.controller is not None else []

    @property
    def config(self) -> TrainConfig | None:
        """The configuration on the model (None before :meth:`begin`)."""
        return self.controller.config if self.controller is not None else None

    @property
    def gate(self) -> BudgetGate | None:
        return self.controller.gate if self.controller is not None else None

    @property
    def decider(self) -> Decider | None:
        return self.controller.decider if self.controller is not None else None

    @property
    def pending(self) -> Change | None:
        """An admitted split change waiting for the loop's epoch boundary."""
        return self.controller.pending if self.controller is not None else None
