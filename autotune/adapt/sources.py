"""Where an adaptive run's decisions come from: a small ABC and the fixed-configuration source.

A source sees an :class:`Observation` every ``decide_every`` steps and may propose a config; the
run passes every proposal through the budget gate before it touches the model. Sources keep the
effective batch: only how it is computed changes (the batch grows only through the run's own
``adapt_batch`` rule). What a source may propose decides what the run's budget gate profiles:
:func:`selective_in_play` (the selective recompute runs) and :func:`outer_in_play` (the outer
precisions' modes), here beside the sources so that a source itself can ask them.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.measurement.progress import Note, quiet

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from autotune.config import Precision
    from autotune.memory.blocks import BlockProfile
    from autotune.workload import Workload

__all__ = [
    "DecisionSource",
    "FixedConfig",
    "Observation",
    "Proposal",
    "RunContext",
    "outer_in_play",
    "reduced_in_play",
    "reduced_of",
    "selective_in_play",
]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What a source knows of the run before its first step (:meth:`DecisionSource.start`).

    Attributes:
        workload: The run's workload.
        start: The configuration the run starts from (its ranks: the run's, fixed).
        budget: Returns the run's budget gate's budget in bytes (per rank on ranks) when asked;
            read it as :attr:`budget_bytes`.
        blocks: Each block's saved bytes (one forward of a copy, taken once per run).
        device_type: ``"cpu"`` or ``"cuda"``.
        admits: Whether the loop can run a configuration from the start as it is and the run's
            budget gate would admit it now (a plan can pick the best candidate that passes
            instead of proposing one that is refused).
        note: Says one line per phase of the source's own setup, with its seconds (the run's
            ``progress``; default: nothing).

    Example:
        A decision source reads it in :meth:`DecisionSource.start`, before the run's first step:

        >>> from autotune.adapt import DecisionSource
        >>> import torch
        >>> from torch import nn
        >>> from autotune import Adaptive
        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return nn.functional.cross_entropy(model(x), y)
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        >>> class Starts(DecisionSource):
        ...     def start(self, context):
        ...         print(context.start.micro_batch_size, context.device_type, context.budget_bytes > 0)
        ...     def propose(self, observation):
        ...         return None
        >>> with Adaptive(model, optimizer, loss_fn, data, batch_size=16, policy=Starts()) as run:
        ...     step = run.step()
        16 cpu True
    """

    workload: Workload
    start: TrainConfig  # the configuration the run starts from (its ranks: the run's, fixed)
    #: The run's budget gate's budget in bytes (per rank), read when asked: the gate's budget can
    #: change during the run (a percentage re-based on the default's measured peak), and a copy
    #: taken before the first step would go stale.
    budget: Callable[[], int]
    blocks: BlockProfile  # each block's saved bytes (one forward of a copy, taken once per run)
    device_type: str
    #: Whether the loop can run a configuration from the start as it is (a framework's loop keeps
    #: its split, the user's flags pin precisions) and the run's budget gate would admit it now:
    #: a plan can pick the best candidate that passes instead of proposing one that is refused.
    admits: Callable[[TrainConfig], bool]
    #: Where a source says what its own setup does, one line per phase with its seconds (a
    #: plan's calibration takes a minute on a real model on the CPU): the run's ``progress``.
    note: Note = quiet

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
    """The run between two decisions, as measured (no extra step is run to make it).

    Attributes:
        step: Optimizer steps done.
        config: The configuration the run is on.
        throughput: Median samples/s of the untracked steps since the last change.
        peak_bytes: Measured peak of ``config`` (its tracked step), else its prediction.
        b_noise: Gradient noise scale (McCandlish et al. 2018), in samples; None when not
            estimated (only sources with ``needs_noise`` get one).
        losses: The recent steps' losses, oldest first.

    Example:
        What :meth:`DecisionSource.propose` is given every ``decide_every`` steps:

        >>> from autotune import TrainConfig
        >>> from autotune.adapt import Observation
        >>> seen = Observation(step=50, config=TrainConfig(micro_batch_size=32), throughput=640.0,
        ...                    peak_bytes=90_000_000, b_noise=None, losses=(0.71, 0.69))
        >>> seen.throughput / (seen.peak_bytes / 2**30)  # samples/s per GiB, the objective
        7635.49...
    """

    step: int  # optimizer steps done
    config: TrainConfig
    throughput: float  # median samples/s of the untracked steps since the last change
    peak_bytes: int  # measured peak of ``config`` (its tracked step), else its prediction
    b_noise: float | None  # gradient noise scale (McCandlish et al. 2018), None when not estimated
    losses: tuple[float, ...]  # every step's loss so far


@dataclass(frozen=True, kw_only=True)
class Proposal:
    """A configuration a decision source wants the run to switch to.

    Args:
        config: The configuration; its effective batch must be the run's (the batch grows only
            through the run's ``adapt_batch`` rule).
        reason: Why, in words: it is in the run's history.

    Example:
        >>> import dataclasses
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import Proposal
        >>> now = TrainConfig(micro_batch_size=32)
        >>> Proposal(config=dataclasses.replace(now, checkpoint=True), reason="recompute every block").config.checkpoint
        True
    """

    config: TrainConfig
    reason: str


class DecisionSource(ABC):
    """Proposes configurations during a run: subclass it and implement :meth:`propose`.

    Pass an instance as ``policy=`` to :class:`autotune.Adaptive` or a callback. Every
    ``decide_every`` steps the run calls :meth:`propose` with an :class:`Observation`; what it
    returns passes the budget gate before it touches the model, and a proposal that measures no
    better than the configuration it replaced is undone.

    Attributes:
        name: The source's name in the run's history.
        needs_noise: Whether :meth:`propose` reads ``Observation.b_noise`` (the run then hooks
            the gradients: ~3-5% of a step, so only when someone reads it).

    Example:
        >>> import dataclasses
        >>> import torch
        >>> from torch import nn
        >>> from autotune import Adaptive
        >>> from autotune.adapt import DecisionSource, Proposal
        >>> class HalfMicroBatch(DecisionSource):
        ...     name = "half"
        ...     def propose(self, observation):
        ...         config = observation.config
        ...         if config.micro_batch_size < 16:
        ...             return None  # stay
        ...         smaller = dataclasses.replace(config, micro_batch_size=8, grad_accum_steps=2)
        ...         return Proposal(config=smaller, reason="half the micro-batch")
        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return nn.functional.cross_entropy(model(x), y)
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        >>> with Adaptive(model, optimizer, loss_fn, data, batch_size=16, policy=HalfMicroBatch(),
        ...               decide_every=2) as run:
        ...     for _ in range(3):
        ...         step = run.step()
        >>> print(run.history[0].describe())  # doctest: +ELLIPSIS
        step 2: applied micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0 (half: half the micro-batch; ...)
    """

    name: str = "source"
    #: Whether :meth:`propose` reads ``Observation.b_noise`` (the run then hooks the gradients:
    #: ~3-5% of a step, so only when someone reads it).
    needs_noise: bool = False

    def start(self, context: RunContext) -> None:  # noqa: B027 (optional hook)
        """Called once before the first step; by default nothing.

        Args:
            context: What the source knows of the run.

        Raises:
            ConfigError: the run is one this source cannot serve (say why).
        """

    def plan(self, context: RunContext) -> Proposal | None:
        """Where the run should start, decided before its first step (after :meth:`start`).

        Args:
            context: What the source knows of the run.

        Returns:
            A proposal, which passes the budget gate like any other, or None (the default): where
            the budget put the run.
        """
        return None

    @abstractmethod
    def propose(self, observation: Observation) -> Proposal | None:
        """A configuration to switch to, decided at a decision step.

        Args:
            observation: The run since the last decision.

        Returns:
            A proposal, or None to stay.
        """

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs of this source; by default nothing.

        Called by :meth:`autotune.adapt.Adaptive.state_dict`.

        Returns:
            Plain values (``torch.load(weights_only=True)`` reads them back).
        """
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:  # noqa: B027 (optional hook)
        """Restore :meth:`state_dict`'s values (called after :meth:`start`); by default nothing.

        Args:
            state: What :meth:`state_dict` returned.
        """


class FixedConfig(DecisionSource):
    """Always the same configuration, e.g. a study's ``best``.

    The run starts in it if the budget gate admits it (its plan), else switches to it at the
    first decision the gate does, and stays. Only the knobs come from it (micro-batch,
    accumulation, precision, checkpointing, ZeRO stage): the run keeps its own LR scaling,
    clipping and seed. ``policy=TrainConfig(...)`` makes one.

    Args:
        config: The configuration. Its effective batch must be the run's, and it must run on
            the run's ranks (one process: ``ranks=1``, ``zero_stage=0``).

    Raises:
        ConfigError: ``config`` is not a :class:`~autotune.TrainConfig`; at the run's start, an
            effective batch or ranks other than the run's.

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import FixedConfig
        >>> FixedConfig(TrainConfig(micro_batch_size=8, grad_accum_steps=2)).name
        'fixed'
    """

    name = "fixed"

    def __init__(self, config: TrainConfig) -> None:
        if not isinstance(config, TrainConfig):
            raise ConfigError(f"FixedConfig needs a TrainConfig, but got {type(config).__name__}.")
        self.config = config

    def start(self, context: RunContext) -> None:
        """Check the configuration against the run and take the run's own hygiene.

        Args:
            context: What the source knows of the run.

        Raises:
            ConfigError: an effective batch or ranks other than the run's.
        """
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
            outer_precision=self.config.outer_precision,
            checkpoint=self.config.checkpoint,
            zero_stage=self.config.zero_stage,
        )

    def plan(self, context: RunContext) -> Proposal | None:
        """Start in the configuration (if the budget gate admits it)."""
        return Proposal(config=self.config, reason="the fixed configuration")

    def propose(self, observation: Observation) -> Proposal | None:
        """The configuration, at the run's effective batch if ``adapt_batch`` grew it; None once there."""
        config, batch = self.config, observation.config.effective_batch_size
        if batch != config.effective_batch_size and batch % config.micro_batch_size == 0:
            # The run's batch grew (``adapt_batch``): keep it, in this configuration's micro-batches.
            config = dataclasses.replace(config, grad_accum_steps=batch // config.micro_batch_size)
        if observation.config == config:
            return None
        return Proposal(config=config, reason="the fixed configuration")


def reduced_of(config: TrainConfig) -> Precision:
    """The reduced precision ``config`` runs (its blocks' or its outer parts'; bf16 where it runs
    none): what a move to more reduced precision, or of the outer parts, reduces to. The policy's
    levels carry no precision of their own, and a run in fp16 stays in fp16.

    Example:
        >>> from autotune import TrainConfig
        >>> reduced_of(TrainConfig(micro_batch_size=4)), reduced_of(TrainConfig(micro_batch_size=4, precision="fp16"))
        ('bf16', 'fp16')
    """
    blocks = config.precision if isinstance(config.precision, tuple) else (config.precision,)
    low = [p for p in (*blocks, config.outer_precision) if p != "fp32"]
    return low[0] if low else "bf16"


def selective_in_play(source: DecisionSource | None, default: TrainConfig, num_blocks: int) -> bool:
    """Whether a run may train a selectively recomputed block, so that its budget gate's memory
    profile must hold the selective runs (two more fake runs per mode; without them a selective
    configuration has no prediction and is measured before it counts).

    Args:
        source: The run's decision source (None: it stays on ``default``).
        default: The run's own configuration.
        num_blocks: The model's blocks.

    Returns:
        True where ``default`` has a selective block, where ``source`` is a fixed configuration
        with one, for the policy (its actions, its neighbours and its start plan move the
        level), and for a source of the user's own (it may propose anything); False without a
        source or for a fixed configuration without one.

    Example:
        >>> from autotune import TrainConfig
        >>> plain = TrainConfig(micro_batch_size=4)
        >>> selective_in_play(FixedConfig(plain), plain, 2)
        False
        >>> selective_in_play(FixedConfig(TrainConfig(micro_batch_size=4, checkpoint="selective")), plain, 2)
        True
    """
    if "selective" in default.checkpoint_levels(num_blocks):
        return True
    if source is None:
        return False
    if isinstance(source, FixedConfig):
        return "selective" in source.config.checkpoint_levels(num_blocks)
    # The policy's action space has the selective level (its sixth entry) and its neighbours and
    # plan move it: without the selective runs the gate would refuse each such proposal unpredicted.
    return True


def reduced_in_play(source: DecisionSource | None, workload: Workload) -> bool:
    """Whether a run's blocks may move to a reduced precision, so that its budget gate must profile
    those modes: a decision source may propose them, but on a model held in 16 bits
    (:attr:`Workload.held_in_16_bits`: autocast has nothing to cast) only a fixed configuration
    that asks for them does.

    Example:
        >>> import torch
        >>> from autotune import TrainConfig, Workload
        >>> w = Workload(name="w", model=torch.nn.Linear(2, 2).bfloat16(), dataset=[torch.zeros(2)] * 4,
        ...              loss_fn=lambda m, b: m(b.bfloat16()).sum(), batch_size=2)
        >>> reduced_in_play(None, w), reduced_in_play(FixedConfig(TrainConfig(micro_batch_size=2)), w)
        (False, True)
    """
    if source is None:
        return False
    return isinstance(source, FixedConfig) or workload.held_in_16_bits is None


def outer_in_play(source: DecisionSource | None, default: TrainConfig, *, held: bool = False) -> tuple[Precision, ...]:
    """The outer precisions (embeddings, final norm, head, loss) a run may train, so that its
    budget gate's memory profile must hold their modes (:func:`autotune.memory.gate.profile_modes`:
    a reduced outer precision is two more modes, and on the CPU one more kind of check step;
    without them such a configuration has no prediction and is measured before it counts).

    Args:
        source: The run's decision source (None: it stays on ``default``).
        default: The run's own configuration.
        held: Whether the model is held in 16 bits (:attr:`Workload.held_in_16_bits`): a source
            other than a fixed configuration then moves no precision, to a reduced one or back.

    Returns:
        ``default``'s outer precision first; then a fixed configuration's; for the policy (its
        seventh action entry, its neighbours and its start plan move the outer parts between fp32
        and the run's reduced precision, :func:`reduced_of` ``default``) and for a source of the
        user's own, fp32 and that reduced precision (fp32 only where ``held``).

    Example:
        >>> from autotune import TrainConfig
        >>> plain = TrainConfig(micro_batch_size=4)
        >>> outer_in_play(FixedConfig(plain), plain)
        ('fp32',)
        >>> outer_in_play(FixedConfig(TrainConfig(micro_batch_size=4, outer_precision="bf16")), plain)
        ('fp32', 'bf16')
    """
    if source is None:
        return (default.outer_precision,)
    if isinstance(source, FixedConfig):
        return tuple(dict.fromkeys((default.outer_precision, source.config.outer_precision)))
    # The codec maps the outer level to the run's reduced precision (knobs_to_config's ``reduced``,
    # the policy source's reduced_of): without its modes each such proposal is refused unpredicted.
    moved = ("fp32",) if held else ("fp32", reduced_of(default))
    return tuple(dict.fromkeys((default.outer_precision, *moved)))
