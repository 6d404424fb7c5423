"""Where an adaptive run's decisions come from: a small ABC and the fixed-configuration source.

A source sees an :class:`Observation` every ``decide_every`` steps and may propose a config; the
run passes every proposal through the budget gate before it touches the model. Sources keep the
effective batch: only how it is computed changes (the batch grows only through the run's own
``adapt_batch`` rule).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from autotune.memory.blocks import BlockProfile
    from autotune.workload import Workload

__all__ = ["DecisionSource", "FixedConfig", "Observation", "Proposal", "RunContext"]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What a source knows of the run before its first step."""

    workload: Workload
    start: TrainConfig  # the configuration the run starts from (its ranks: the run's, fixed)
    #: The run's budget gate's budget in bytes (per rank), read when asked: the gate's budget can
    #: change during the run (a percentage re-based on the default's measured peak), and a copy
    #: taken before the first step would go stale.
    budget: Callable[[], int]
    blocks: BlockProfile  # each block's saved bytes (one forward of a copy, taken once per run)
    device_type: str
    #: Whether the run's budget gate would admit a configuration now (a plan can pick the best
    #: candidate that passes instead of proposing one that is refused).
    admits: Callable[[TrainConfig], bool]

    @property
    def budget_bytes(self) -> int:
        """The run's memory budget in bytes (per rank on ranks), as its budget gate has it now."""
        return self.budget()

    @property
    def ranking(self) -> tuple[int, ...]:
        """Block indices, most activation bytes first (what the knobs' "hungriest blocks" means)."""
        return self.blocks.ranked()


@dataclass(frozen=True, kw_only=True)
class Observation:
    """The run between two decisions, as measured (no extra step is run to make it)."""

    step: int  # optimizer steps done
    config: TrainConfig
    throughput: float  # median samples/s of the untracked steps since the last change
    peak_bytes: int  # measured peak of ``config`` (its tracked step), else its prediction
    b_noise: float | None  # gradient noise scale (McCandlish et al. 2018), None when not estimated
    losses: tuple[float, ...]  # every step's loss so far


@dataclass(frozen=True, kw_only=True)
class Proposal:
    config: TrainConfig
    reason: str


class DecisionSource(ABC):
    """Proposes configurations during a run. ``name`` appears in the run's history."""

    name: str = "source"
    #: Whether :meth:`propose` reads ``Observation.b_noise`` (the run then hooks the gradients:
    #: ~3-5% of a step, so only when someone reads it).
    needs_noise: bool = False

    def start(self, context: RunContext) -> None:  # noqa: B027 (optional hook)
        """Called once before the first step."""

    def plan(self, context: RunContext) -> Proposal | None:
        """Where the run should start, decided before its first step (after :meth:`start`), or
        None: where the budget put it. Passes the budget gate like any proposal."""
        return None

    @abstractmethod
    def propose(self, observation: Observation) -> Proposal | None:
        """A config to switch to, or None to stay."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this source (plain values: ``torch.load(weights_only=True)``
        reads them back); by default nothing. Called by :meth:`autotune.adapt.Adaptive.state_dict`."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s values (after :meth:`start`)."""


class FixedConfig(DecisionSource):
    """Always the same configuration, e.g. a study's ``best``: the run starts in it if the budget
    gate admits it (its plan), else switches to it at the first decision the gate does, and
    stays. Its effective batch must be the run's."""

    name = "fixed"

    def __init__(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise ConfigError(f"FixedConfig needs a TrainConfig, but got {type(config).__name__}.")
        self.config = config

    def start(self, context: RunContext) -> None:
        if self.config.effective_batch_size != context.start.effective_batch_size:
            raise ConfigError(
                f"FixedConfig's effective batch must be the run's ({context.start.effective_batch_size}), "
                f"but got {self.config.effective_batch_size} ({self.config.describe()})."
            )
        ranks = context.start.ranks
        if self.config.ranks != ranks or (ranks == 1 and self.config.zero_stage != 0):
            where = "one process (ranks=1, zero_stage=0)" if ranks == 1 else f"the run's {ranks} ranks"
            raise ConfigError(
                f"FixedConfig must run on {where}, but got ranks={self.config.ranks}, "
                f"zero_stage={self.config.zero_stage}."
            )
        # The run's own hygiene (LR scaling, clipping, seed) stays: only the knobs come from here.
        self.config = dataclasses.replace(
            context.start,
            micro_batch_size=self.config.micro_batch_size,
            grad_accum_steps=self.config.grad_accum_steps,
            precision=self.config.precision,
            checkpoint=self.config.checkpoint,
            zero_stage=self.config.zero_stage,
        )

    def plan(self, context: RunContext) -> Proposal | None:
        return Proposal(config=self.config, reason="the fixed configuration")

    def propose(self, observation: Observation) -> Proposal | None:
        config, batch = self.config, observation.config.effective_batch_size
        if batch != config.effective_batch_size and batch % config.micro_batch_size == 0:
            # The run's batch grew (``adapt_batch``): keep it, in this configuration's micro-batches.
            config = dataclasses.replace(config, grad_accum_steps=batch // config.micro_batch_size)
        if observation.config == config:
            return None
        return Proposal(config=config, reason="the fixed configuration")
