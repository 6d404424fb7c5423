"""The configuration vocabulary: one configuration in its three encodings, and the conversions.

* :class:`~autotune.config.TrainConfig`: what runs, every block named (a precision and a
  checkpoint flag each).
* :class:`Knobs`: the depth-free encoding the study samples (below).
* :class:`KnobLevels`: indices into small tables, what an agent (the environments, the policy)
  steps through; :class:`Move` names the steps.

Conversions, all here: :meth:`Knobs.to_config` (Knobs -> TrainConfig), :meth:`KnobLevels.knobs`
(levels -> Knobs), :func:`knobs_to_config` (levels -> TrainConfig) and :func:`levels_of`
(TrainConfig -> levels, where the tables can express it).


A :class:`TrainConfig` names every block (a precision and a checkpoint flag each), so its size
grows with the model. Searchers use a handful of numbers instead: the effective batch, how it
splits into micro-batch x accumulation x ranks, the ZeRO stage, and two *counts* over the blocks
ranked by the activation bytes they save for backward (:meth:`autotune.memory.blocks.BlockProfile.ranked`):
"the n hungriest blocks run in low precision, the c hungriest are recomputed". The first unit of
each count buys the most memory, and the same numbers mean the same thing on any model.

The Optuna study samples these knobs directly (``autotune.search.space``); the Gymnasium
environments move through them by levels (:meth:`KnobLevels.knobs`). A
configuration found by one is therefore a point of the other: ``SearchSpace.params(knobs)``
enqueues an environment's result in a study.

An agent steps through them by *levels* (indices into small tables) so that an action means the
same on every model: accumulation and micro-batch move by powers of two, and precision and
checkpointing by quarters of the blocks: level l of 4 puts round(l/4 * L) blocks in reduced
precision (or recompute), the ones with the most activation bytes first (``BlockProfile.ranked``),
where each change saves the most memory. :meth:`KnobLevels.knobs` gives the shared Knobs.

The effective batch (micro-batch x accumulation x ranks) is the user's training maths: its
learning rate, its schedule, its statistical efficiency. An action therefore moves the *split*
of the batch (micro-batch x2 and accumulation /2, or the reverse), never the product; only with
batch adaptation on may the batch change, and then never below the user's (Pollux, Qiao et al.
OSDI'21, adapts the batch upward from the one the user's learning rate was tuned for).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from autotune.config import PRECISIONS, Checkpoint, Precision, TrainConfig
from autotune.errors import AutotuneError, ConfigError

__all__ = [
    "ACCUM_LEVELS",
    "FRACTION_LEVELS",
    "MICRO_LEVELS",
    "ZERO_STAGES",
    "Action",
    "KnobLevels",
    "Knobs",
    "Move",
    "apply_action",
    "blocks_at_level",
    "check_min_micro_batch",
    "knobs_to_config",
    "level_blocks",
    "level_counts",
    "levels_near",
    "levels_of",
    "knobs_of_config",
    "neighbours",
    "smallest_micro_batch",
]


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """One configuration, in terms that do not depend on the model's depth.

    Args:
        batch_size: Effective batch: ``micro_batch_size x grad_accum_steps x ranks``.
        micro_batch_size: Samples per forward/backward on one rank; with ``ranks`` it must divide
            ``batch_size`` (the quotient is the accumulation).
        ranks: Data-parallel ranks.
        zero_stage: DeepSpeed ZeRO stage 0-3 (0 with one rank).
        low_precision: The precision of the low-precision blocks.
        low_precision_blocks: How many blocks, hungriest first, run in ``low_precision``.
        checkpoint_blocks: How many blocks, hungriest first, are recomputed whole in backward.
        selective_blocks: How many of the next hungriest blocks (after the ``checkpoint_blocks``)
            are recomputed selectively (``TrainConfig.checkpoint`` ``"selective"``: they keep the
            outputs of their matmul-like operations and recompute the rest). Full recompute goes
            to the hungriest blocks because it saves the most of each (all but the input), at the
            most time; selective recompute saves less for far less time (only cheap elementwise
            operations run again), so it is the middle level, on the blocks next in line. The
            levels nest: every block recomputed whole is hungrier than every selective one, and
            one block moves between the two without the others moving
            (:func:`neighbours`).
        outer_low_precision: Whether everything outside the blocks (embeddings, head, loss) runs
            in ``low_precision`` too (``TrainConfig.outer_precision``); with every block low
            precision, the whole model is (Hugging Face's ``bf16=True``).

    Raises:
        ConfigError: a knob out of its range, or ``micro_batch_size x ranks`` not dividing
            ``batch_size``, with the rule and the value received.

    Example:
        >>> from autotune import Knobs
        >>> knobs = Knobs(batch_size=32, micro_batch_size=8, low_precision_blocks=2, checkpoint_blocks=1)
        >>> knobs.describe(), knobs.grad_accum_steps
        ('8x4 bf16:2 ckpt:1', 4)
        >>> config = knobs.to_config([2, 0, 3, 1])  # block indices, most activation bytes first
        >>> config.precision, config.checkpoint
        (('bf16', 'fp32', 'bf16', 'fp32'), (False, False, True, False))
    """

    batch_size: int
    micro_batch_size: int
    ranks: int = 1
    zero_stage: int = 0
    low_precision: Precision = "bf16"
    low_precision_blocks: int = 0
    checkpoint_blocks: int = 0
    outer_low_precision: bool = False
    selective_blocks: int = 0

    def __post_init__(self) -> None:
        for name, low in (
            ("batch_size", 1),
            ("micro_batch_size", 1),
            ("ranks", 1),
            ("low_precision_blocks", 0),
            ("checkpoint_blocks", 0),
            ("selective_blocks", 0),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"Knobs.{name} must be an int >= {low}, but got {value!r}.")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"Knobs.zero_stage must be one of 0, 1, 2, 3, but got {self.zero_stage!r}.")
        if self.low_precision not in PRECISIONS:
            raise ConfigError(f"Knobs.low_precision must be one of {PRECISIONS}, but got {self.low_precision!r}.")
        if not isinstance(self.outer_low_precision, bool):
            raise ConfigError(f"Knobs.outer_low_precision must be a bool, but got {self.outer_low_precision!r}.")
        if self.batch_size % (self.micro_batch_size * self.ranks):
            raise ConfigError(
                "Knobs.micro_batch_size x ranks must divide batch_size, but got "
                f"{self.micro_batch_size} x {self.ranks} and {self.batch_size}."
            )

    @property
    def grad_accum_steps(self) -> int:
        """Micro-batches accumulated per optimizer step: ``batch_size / (micro_batch_size x ranks)``."""
        return self.batch_size // (self.micro_batch_size * self.ranks)

    def blocks(self, ranking: Sequence[int]) -> tuple[tuple[Precision, ...], tuple[Checkpoint, ...]]:
        """Per-block precision and checkpointing (``True``, ``"selective"`` or ``False``, the
        entries of ``TrainConfig.checkpoint``) on a model whose blocks rank as ``ranking`` (block
        indices, hungriest first).

        Raises:
            ConfigError: ``ranking`` is no permutation, or a count exceeds the blocks (the
                recomputed ones together: ``checkpoint_blocks + selective_blocks``).
        """
        n = len(ranking)
        if sorted(ranking) != list(range(n)):
            raise ConfigError(f"ranking must be a permutation of the block indices, but got {tuple(ranking)}.")
        for name in ("low_precision_blocks", "checkpoint_blocks", "selective_blocks"):
            if getattr(self, name) > n:
                raise ConfigError(
                    f"Knobs.{name} must be <= the {n} blocks of the model, but got {getattr(self, name)}."
                )
        if self.checkpoint_blocks + self.selective_blocks > n:
            raise ConfigError(
                f"Knobs.checkpoint_blocks + selective_blocks must be <= the {n} blocks of the model, but got "
                f"{self.checkpoint_blocks} + {self.selective_blocks}."
            )
        low = set(ranking[: self.low_precision_blocks])
        ckpt = set(ranking[: self.checkpoint_blocks])
        selective = set(ranking[self.checkpoint_blocks : self.checkpoint_blocks + self.selective_blocks])
        checkpoints: tuple[Checkpoint, ...] = tuple(
            True if i in ckpt else "selective" if i in selective else False for i in range(n)
        )
        return tuple(self.low_precision if i in low else "fp32" for i in range(n)), checkpoints

    def to_config(self, ranking: Sequence[int], *, base: TrainConfig | None = None) -> TrainConfig:
        """The TrainConfig these knobs stand for; ``base`` supplies the other fields (LR schedule,
        clipping, seed). Uniform per-block settings collapse to one value."""
        precisions, checkpoints = self.blocks(ranking)
        return dataclasses.replace(
            base or TrainConfig(),
            micro_batch_size=self.micro_batch_size,
            grad_accum_steps=self.grad_accum_steps,
            ranks=self.ranks,
            zero_stage=self.zero_stage,
            precision=precisions[0] if len(set(precisions)) == 1 else precisions,
            outer_precision=self.outer_precision,
            checkpoint=checkpoints[0] if len(set(checkpoints)) == 1 else checkpoints,
        )

    @property
    def outer_precision(self) -> Precision:
        """The precision of everything outside the blocks: ``low_precision`` or fp32."""
        return self.low_precision if self.outer_low_precision else "fp32"

    def describe(self) -> str:
        """Short human form, e.g. ``8x4 bf16:3 ckpt:2 sel:1 zero2x2``; ``+outer`` when the outer parts
        run in the low precision too (``8x4 bf16:6+outer``)."""
        text = f"{self.micro_batch_size}x{self.grad_accum_steps}"
        if self.low_precision_blocks or self.outer_low_precision:
            text += f" {self.low_precision}:{self.low_precision_blocks}"
        if self.outer_low_precision:
            text += "+outer"
        if self.checkpoint_blocks:
            text += f" ckpt:{self.checkpoint_blocks}"
        if self.selective_blocks:
            text += f" sel:{self.selective_blocks}"
        if self.ranks > 1:
            text += f" zero{self.zero_stage}x{self.ranks}"
        return text


def neighbours(
    knobs: Knobs,
    *,
    micro_batches: Sequence[int],
    block_counts: Sequence[int],
    zero_stages: Sequence[int] = (),
    low_precision: bool = True,
    outer: bool = True,
    selective: bool = False,
) -> list[Knobs]:
    """The points one knob one step away from ``knobs``, each knob stepping to the next value of
    its own table: THE neighbourhood every searcher moves through (the study's refinement, the
    climb that ends a ``tune`` episode).

    Moves that usually raise throughput come first: a larger micro-batch (more work per kernel
    launch and optimizer step), one recomputed count fewer, with ``selective`` one wholly
    recomputed block recomputed selectively instead and one selective block fewer, one
    low-precision count more, the outer parts in low precision, one ZeRO stage lower; then the
    reverses, which lower the peak. The effective batch and the ranks stay. A knob whose value is
    not in its table does not move.

    The recompute levels move as a band over the ranked blocks: the wholly recomputed ones
    (``checkpoint_blocks``), then the selective ones, both ends in ``block_counts`` (the first
    ``checkpoint_blocks`` and the first ``checkpoint_blocks + selective_blocks``). "One recomputed
    count fewer" moves both ends a step (the selective blocks shift along, as many as before on
    the study's every count); the selective moves move one end: the full end a step down with the
    other kept (one block from full to selective recompute), the other end a step down (one
    selective block fewer), and their reverses.

    Args:
        knobs: Where to move from.
        micro_batches: The micro-batches ``knobs.batch_size`` may split into, ascending (the
            study's space: every divisor the data feeds; the environments': their power-of-two
            tables).
        block_counts: The counts of low-precision and of recomputed blocks, ascending (the
            study's every count from 0 to the blocks; the environments' quarters,
            :func:`level_counts`).
        zero_stages: The ZeRO stages, ascending (empty: the stage does not move, as on one rank).
        low_precision: Whether blocks may move into or out of low precision.
        outer: Whether the outer parts may move into or out of low precision.
        selective: Whether blocks may move into or out of selective recompute (a ``knobs`` with
            selective blocks keeps them otherwise, shifted with the band).

    Returns:
        The neighbours, in that order, each once.

    Example:
        >>> here = Knobs(batch_size=8, micro_batch_size=2, checkpoint_blocks=1)
        >>> [k.describe() for k in neighbours(here, micro_batches=(1, 2, 4, 8), block_counts=(0, 1, 2), outer=False)]
        ['4x2 ckpt:1', '2x4', '2x4 bf16:1 ckpt:1', '1x8 ckpt:1', '2x4 ckpt:2']
        >>> tables = {"micro_batches": (2,), "block_counts": (0, 1, 2), "low_precision": False}
        >>> [k.describe() for k in neighbours(here, **tables, selective=True)]
        ['2x4', '2x4 sel:1', '2x4 ckpt:2', '2x4 ckpt:1 sel:1']
    """
    up: list[dict[str, object]] = []  # moves that usually raise throughput
    down: list[dict[str, object]] = []  # their reverses, which lower the peak

    def along(name: str, table: Sequence[int] | tuple[bool, ...], forward: int) -> None:
        value = getattr(knobs, name)
        if value not in table:
            return
        i = list(table).index(value)
        for moves, j in ((up, i + forward), (down, i - forward)):
            if 0 <= j < len(table):
                moves.append({name: table[j]})

    along("micro_batch_size", micro_batches, 1)
    _recompute_moves(knobs, list(block_counts), selective, up, down)
    along("low_precision_blocks", block_counts if low_precision else (), 1)
    along("outer_low_precision", (False, True) if outer and low_precision else (), 1)
    along("zero_stage", zero_stages, -1)
    return [dataclasses.replace(knobs, **change) for change in up + down]  # type: ignore[arg-type]


def _recompute_moves(
    knobs: Knobs, table: list[int], selective: bool, up: list[dict[str, object]], down: list[dict[str, object]]
) -> None:
    """:func:`neighbours`' recompute moves: the band's two ends (the full count, and the full and
    selective count together) as indices into ``table``, each move a pair of new indices."""
    full, recomputed = knobs.checkpoint_blocks, knobs.checkpoint_blocks + knobs.selective_blocks
    if full not in table or recomputed not in table:
        return
    i, j = table.index(full), table.index(recomputed)
    fewer = [(i - 1, j - 1)]  # the band one step down: one recomputed count fewer
    more = [(i + 1, j + 1)]
    if selective:
        fewer += [(i - 1, j), (i, j - 1)]  # a full block selective instead; one selective block fewer
        more += [(i + 1, j), (i, j + 1)]  # a selective block full instead; one selective block more
    for moves, pairs in ((up, fewer), (down, more)):
        for a, b in pairs:
            if 0 <= a <= b < len(table):
                moves.append({"checkpoint_blocks": table[a], "selective_blocks": table[b] - table[a]})


ACCUM_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
MICRO_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
FRACTION_LEVELS = 5  # 0, 1/4, 1/2, 3/4, all of the blocks
ZERO_STAGES = 4


@dataclass(frozen=True, kw_only=True)
class KnobLevels:
    """Indices into the level tables, plus the ZeRO stage.

    ``checkpoint`` is the level of the blocks recomputed whole, and ``selective`` that of the
    ones recomputed selectively after them (:attr:`Knobs.selective_blocks`): together at most
    all of the blocks (``checkpoint + selective <= 4``), the first ``round((c + s)/4 L)`` blocks
    recomputed at all. ``selective`` is outside the environments' action space and observation
    (the shipped policy's): no action of the policy moves it, and where it is not 0 the policy
    sees the configuration as its ``checkpoint`` level; the climb that ends a ``tune`` episode
    moves it (:func:`apply_action`'s sixth entry).

    Attributes:
        accum: Index into the accumulation levels (1, 2, 4, ... 128).
        micro: Index into the micro-batch levels (1, 2, 4, ... 128).
        precision: Quarters of the blocks in reduced precision, hungriest first (0-4).
        checkpoint: Quarters of the blocks recomputed whole, hungriest first (0-4).
        zero_stage: The ZeRO stage (0-3).
        selective: Quarters of the blocks recomputed selectively after the whole ones (0-4).
        outer: Whether everything outside the blocks (embeddings, final norm, head, loss) runs in
            the reduced precision too (:attr:`Knobs.outer_low_precision`). Like ``selective`` it
            is outside the action space and the observation (the policy sees such a
            configuration as its blocks' levels and never proposes it); the climb moves it
            (:func:`apply_action`'s seventh entry).

    Example:
        >>> from autotune.envs import KnobLevels
        >>> levels = KnobLevels(accum=1, micro=3)
        >>> levels.micro_batch_size, levels.accum_steps, levels.effective_batch_size
        (8, 2, 16)
    """

    accum: int = 0
    micro: int = 5
    precision: int = 0
    checkpoint: int = 0
    zero_stage: int = 0
    selective: int = 0
    outer: bool = False

    def __post_init__(self) -> None:
        for name, n in (
            ("accum", len(ACCUM_LEVELS)),
            ("micro", len(MICRO_LEVELS)),
            ("precision", FRACTION_LEVELS),
            ("checkpoint", FRACTION_LEVELS),
            ("zero_stage", ZERO_STAGES),
            ("selective", FRACTION_LEVELS),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < n:
                raise ConfigError(f"KnobLevels.{name} must be an int in [0, {n - 1}], but got {value!r}.")
        if self.checkpoint + self.selective > FRACTION_LEVELS - 1:
            raise ConfigError(
                f"KnobLevels.checkpoint + selective must be <= {FRACTION_LEVELS - 1}, but got "
                f"{self.checkpoint} + {self.selective}."
            )
        if not isinstance(self.outer, bool):
            raise ConfigError(f"KnobLevels.outer must be a bool, but got {self.outer!r}.")

    @property
    def accum_steps(self) -> int:
        """Gradient accumulation steps at this level."""
        return ACCUM_LEVELS[self.accum]

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch at this level."""
        return MICRO_LEVELS[self.micro]

    @property
    def effective_batch_size(self) -> int:
        """Micro-batch x accumulation: the samples of one optimizer step (on one rank)."""
        return self.accum_steps * self.micro_batch_size

    @classmethod
    def default_for(cls, batch_size: int) -> KnobLevels:
        """PyTorch's default way to train: the whole batch in one fp32 pass, nothing recomputed.

        The batch is rounded to the nearest power of two the tables reach (exact for the powers of
        two up to 128 x 128); a batch above the largest micro-batch is accumulated.
        """
        total = min(range(len(MICRO_LEVELS) + len(ACCUM_LEVELS) - 1), key=lambda i: abs(i - math.log2(batch_size)))
        micro = min(total, len(MICRO_LEVELS) - 1)
        return cls(micro=micro, accum=total - micro)

    def knobs(self, num_blocks: int, *, reduced: Precision = "bf16", ranks: int = 1) -> Knobs:
        """These levels on a model of ``num_blocks`` blocks with ``ranks`` ranks, as shared Knobs."""
        return Knobs(
            batch_size=self.effective_batch_size * ranks,
            micro_batch_size=self.micro_batch_size,
            ranks=ranks,
            zero_stage=self.zero_stage if ranks > 1 else 0,
            low_precision=reduced,
            low_precision_blocks=level_blocks(self.precision, num_blocks),
            checkpoint_blocks=level_blocks(self.checkpoint, num_blocks),
            selective_blocks=level_blocks(self.checkpoint + self.selective, num_blocks)
            - level_blocks(self.checkpoint, num_blocks),
            outer_low_precision=self.outer,
        )


def smallest_micro_batch(per_rank_batch: int, floor: int | None) -> int:
    """The smallest micro-batch a rank's ``per_rank_batch`` samples may be split into: ``floor``
    (None: the whole per-rank batch, no accumulation), never above the per-rank batch.

    Accumulating gradients over micro-batches computes the same update as one pass over the batch
    only when samples do not interact in the forward: BatchNorm in training normalises each
    micro-batch by its own statistics (and updates its running ones from them), so a smaller
    micro-batch trains a different model (:attr:`autotune.Workload.micro_batch_floor`).

    Example:
        >>> smallest_micro_batch(16, None), smallest_micro_batch(16, 4), smallest_micro_batch(2, 4)
        (16, 4, 2)
    """
    return per_rank_batch if floor is None else max(1, min(floor, per_rank_batch))


def check_min_micro_batch(
    value: object, *, name: str = "min_micro_batch", error: type[AutotuneError] = ConfigError
) -> int | None:
    """``value`` as a micro-batch floor (the smallest micro-batch the user accepts), checked: the
    one rule for ``Workload.min_micro_batch``, the study's space, the simulator and the callbacks.

    Args:
        value: An int >= 1, or None (the workload's own floor).
        name: The field's name, as the message states it.
        error: The exception the caller raises for a bad field (``WorkloadError``, ``SpecError``).

    Returns:
        ``value``, unchanged.

    Raises:
        AutotuneError: ``error``, when ``value`` is not None and not an int >= 1 (a bool is no int here).
    """
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise error(f"{name} must be an int >= 1 or None, but got {value!r}.")
    return value


def blocks_at_level(level: int, ranking: tuple[int, ...]) -> frozenset[int]:
    """The ``round(level/4 * L)`` hungriest blocks."""
    return frozenset(ranking[: level_blocks(level, len(ranking))])


def level_blocks(level: int, num_blocks: int) -> int:
    """How many blocks level ``level`` covers: ``round(level/4 * L)``."""
    return round(level / (FRACTION_LEVELS - 1) * num_blocks)


def level_counts(num_blocks: int) -> tuple[int, ...]:
    """The block counts the fraction levels reach on ``num_blocks`` blocks, ascending, each once
    (:func:`level_blocks`; on fewer than four blocks two levels may cover the same count)."""
    return tuple(dict.fromkeys(level_blocks(level, num_blocks) for level in range(FRACTION_LEVELS)))


def levels_near(knobs: Knobs, near: KnobLevels, num_blocks: int) -> KnobLevels:
    """``knobs`` (one rank's split in the tables, counts that :func:`level_counts` reaches) as knob
    levels on a model of ``num_blocks`` blocks: where two levels cover the same count, the one
    nearest ``near``'s; on one rank the ZeRO stage is ``near``'s (Knobs keep 0 there). The
    selective level is the one whose band (:attr:`KnobLevels.selective`) ends at the full and
    selective blocks together; ``outer`` is ``knobs.outer_low_precision``."""

    def level(count: int, here: int, lowest: int = 0) -> int:
        matches = [lv for lv in range(lowest, FRACTION_LEVELS) if level_blocks(lv, num_blocks) == count]
        assert matches, f"{count} blocks is no level's on {num_blocks} blocks"
        return min(matches, key=lambda lv: abs(lv - here))

    checkpoint = level(knobs.checkpoint_blocks, near.checkpoint)
    recomputed = knobs.checkpoint_blocks + knobs.selective_blocks
    band = level(recomputed, near.checkpoint + near.selective, checkpoint) if knobs.selective_blocks else checkpoint
    return KnobLevels(
        accum=ACCUM_LEVELS.index(knobs.grad_accum_steps),
        micro=MICRO_LEVELS.index(knobs.micro_batch_size),
        precision=level(knobs.low_precision_blocks, near.precision),
        checkpoint=checkpoint,
        zero_stage=knobs.zero_stage if knobs.ranks > 1 else near.zero_stage,
        selective=band - checkpoint,
        outer=knobs.outer_low_precision,
    )


def knobs_to_config(
    levels: KnobLevels,
    ranking: tuple[int, ...],
    *,
    reduced: Precision = "bf16",
    ranks: int = 1,
    base: TrainConfig | None = None,
) -> TrainConfig:
    """The TrainConfig for ``levels`` on a model whose blocks rank as ``ranking`` (hungriest first).

    Args:
        levels: The knob levels.
        ranking: The blocks' indices, hungriest first.
        reduced: The precision of the blocks the precision level reduces.
        ranks: Data-parallel ranks.
        base: The configuration whose other fields it keeps (None: the defaults).

    Returns:
        The configuration.

    Example:
        >>> from autotune.envs import KnobLevels, knobs_to_config
        >>> config = knobs_to_config(KnobLevels(accum=1, micro=3, checkpoint=2), ranking=(2, 0, 1, 3))
        >>> config.micro_batch_size, config.grad_accum_steps, config.checkpoint  # the 2 hungriest of 4 blocks
        (8, 2, (True, False, True, False))
    """
    return levels.knobs(len(ranking), reduced=reduced, ranks=ranks).to_config(ranking, base=base)


def levels_of(config: TrainConfig, num_blocks: int) -> KnobLevels | None:
    """``config`` as knob levels on a model of ``num_blocks`` blocks, or None when the tables
    cannot express it: a split that is not in them (a micro-batch or accumulation that is not a
    power of two up to 128). Per-block settings count as the nearest quarter of the blocks they
    cover: the wholly recomputed ones the ``checkpoint`` level, and the recomputed ones together
    (selective too) the band that ends the ``selective`` level; a reduced outer precision is
    ``outer`` (the levels' reduced precision is the caller's, as in :func:`knobs_to_config`).

    Example:
        >>> from autotune import TrainConfig
        >>> levels = levels_of(TrainConfig(micro_batch_size=8, precision="bf16", outer_precision="bf16"), 4)
        >>> levels.precision, levels.outer
        (4, True)
    """
    if config.micro_batch_size not in MICRO_LEVELS or config.grad_accum_steps not in ACCUM_LEVELS:
        return None
    quarters = FRACTION_LEVELS - 1
    low = sum(p != "fp32" for p in config.block_precisions(num_blocks))
    recompute = config.checkpoint_levels(num_blocks)
    full = round(recompute.count("full") / num_blocks * quarters)
    band = round((len(recompute) - recompute.count("none")) / num_blocks * quarters)
    return KnobLevels(
        accum=ACCUM_LEVELS.index(config.grad_accum_steps),
        micro=MICRO_LEVELS.index(config.micro_batch_size),
        precision=round(low / num_blocks * quarters),
        checkpoint=full,
        zero_stage=config.zero_stage,
        selective=band - full,
        outer=config.outer_precision != "fp32",
    )


def knobs_of_config(config: TrainConfig, num_blocks: int) -> Knobs:
    """``config`` as Knobs on a model of ``num_blocks`` blocks: its split, ranks and ZeRO stage,
    and its per-block settings as counts (blocks in its reduced precision, recomputed whole,
    recomputed selectively; the outer parts in the reduced precision). The counts say how many,
    not which: :meth:`Knobs.to_config` puts them on the hungriest blocks.

    Example:
        >>> from autotune import TrainConfig
        >>> config = TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=(True, "selective", False))
        >>> knobs_of_config(config, 3).describe()
        '4x2 ckpt:1 sel:1'
    """
    precisions = config.block_precisions(num_blocks)
    reduced = [p for p in precisions if p != "fp32"]
    low: Precision = reduced[0] if reduced else config.outer_precision if config.outer_precision != "fp32" else "bf16"
    levels = config.checkpoint_levels(num_blocks)
    return Knobs(
        batch_size=config.effective_batch_size,
        micro_batch_size=config.micro_batch_size,
        ranks=config.ranks,
        zero_stage=config.zero_stage,
        low_precision=low,
        low_precision_blocks=len(reduced),
        checkpoint_blocks=levels.count("full"),
        selective_blocks=levels.count("selective"),
        outer_low_precision=config.outer_precision != "fp32",
    )


class Action(NamedTuple):
    """One ``MultiDiscrete`` action of the environments and the policy (:func:`apply_action`):
    ``split``, ``batch``, ``precision`` and ``checkpoint`` are 0 (down), 1 (keep) or 2 (up);
    ``zero`` is the ZeRO stage itself, not a move."""

    split: int
    batch: int
    precision: int
    checkpoint: int
    zero: int


class Move(enum.Enum):
    """The one-knob moves, named: what an action does to one knob on one process (ZeRO 0)."""

    KEEP = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0)
    LARGER_MICRO_BATCH = Action(split=0, batch=1, precision=1, checkpoint=1, zero=0)  # accumulation halves
    SMALLER_MICRO_BATCH = Action(split=2, batch=1, precision=1, checkpoint=1, zero=0)  # accumulation doubles
    LESS_RECOMPUTE = Action(split=1, batch=1, precision=1, checkpoint=0, zero=0)
    MORE_RECOMPUTE = Action(split=1, batch=1, precision=1, checkpoint=2, zero=0)
    LESS_REDUCED_PRECISION = Action(split=1, batch=1, precision=0, checkpoint=1, zero=0)
    MORE_REDUCED_PRECISION = Action(split=1, batch=1, precision=2, checkpoint=1, zero=0)

    @property
    def action(self) -> Action:
        value: Action = self.value
        return value


def apply_action(
    knobs: KnobLevels,
    action: Action | tuple[int, ...],
    *,
    max_zero_stage: int,
    adapt_batch: bool = False,
    min_batch: int = 1,
    min_micro: int = 1,
) -> KnobLevels:
    """The knob levels after a MultiDiscrete action ``(split, batch, precision, checkpoint, zero)``.

    The action may have a sixth entry, ``selective``, and a seventh, ``outer``, outside the action
    space (the shipped policy never proposes them; the climb that ends a ``tune`` episode does,
    :mod:`autotune.policies.climb`).

    ``split`` (0: fewer, larger micro-batches; 1: keep; 2: more, smaller ones) doubles one of
    micro-batch and accumulation and halves the other, so the effective batch never changes; a
    split the tables cannot take (micro-batch 1, or accumulation at its end), or that would take
    the micro-batch below ``min_micro`` (:func:`smallest_micro_batch`), keeps the knobs.
    ``batch`` (0: halve, 1: keep, 2: double) acts only with ``adapt_batch`` and never takes the
    effective batch (one rank's: the caller divides by the ranks) below ``min_batch``; it moves
    the accumulation first, so the micro-batch, and with it the activation memory, stays.
    Precision and checkpoint are deltas clipped at the ends of their tables; the fifth entry is the
    ZeRO stage, mapped to ``min(stage, max_zero_stage)`` (0 when there is one rank or no ZeRO
    runner). ``selective`` (0: one selective level fewer, 1: keep, 2: one more) moves the level of
    the blocks recomputed selectively after the wholly recomputed ones (:attr:`KnobLevels.selective`),
    clipped where the two together cover every block; a checkpoint level up there turns a
    selective quarter into a full one (the blocks recomputed at all stay). Without selective blocks
    (every action of the policy) the checkpoint delta acts as it always did. ``outer`` (0: the
    outer parts in fp32, 1: keep, 2: in the reduced precision) moves :attr:`KnobLevels.outer`;
    without it (five or six entries) the outer precision stays where it is. Every action is
    valid: no masking in the action space.

    Args:
        knobs: The levels the action moves from.
        action: ``(split, batch, precision, checkpoint, zero)``, or that and ``selective``, and ``outer``.
        max_zero_stage: The highest ZeRO stage the fifth entry reaches.
        adapt_batch: Whether ``batch`` acts (otherwise it is ignored).
        min_batch: The smallest effective batch (one rank's) ``batch`` may reach.
        min_micro: The smallest micro-batch ``split`` may reach.

    Returns:
        The levels after the action.

    Example:
        >>> from autotune.envs import KnobLevels, apply_action
        >>> levels = KnobLevels(accum=1, micro=3)  # 8 x 2
        >>> after = apply_action(levels, (2, 1, 1, 1, 0), max_zero_stage=0)  # more, smaller micro-batches
        >>> after.micro_batch_size, after.accum_steps, after.effective_batch_size
        (4, 4, 16)
    """
    a_split, a_batch, a_prec, a_ckpt, a_zero, *extra = (int(x) for x in action)
    assert len(extra) <= 2, f"an action has 5 entries, 6 with the selective move, 7 with the outer one: {tuple(action)}"
    a_sel, a_outer = (*extra, 1, 1)[:2]

    def step(value: int, delta: int, n: int) -> int:
        return min(max(value + delta - 1, 0), n - 1)

    micro, accum = knobs.micro, knobs.accum
    if a_split != 1:
        up = 1 if a_split == 0 else -1  # micro-batch level up by `up`, accumulation down by it
        if (
            0 <= micro + up < len(MICRO_LEVELS)
            and 0 <= accum - up < len(ACCUM_LEVELS)
            and MICRO_LEVELS[micro + up] >= min(min_micro, MICRO_LEVELS[micro])
        ):
            micro, accum = micro + up, accum - up
    if adapt_batch and a_batch == 2:
        if accum + 1 < len(ACCUM_LEVELS):
            accum += 1
        elif micro + 1 < len(MICRO_LEVELS):
            micro += 1
    elif adapt_batch and a_batch == 0 and ACCUM_LEVELS[accum] * MICRO_LEVELS[micro] >= 2 * min_batch:
        if accum > 0:
            accum -= 1
        elif MICRO_LEVELS[micro - 1] >= min_micro:
            micro -= 1
    checkpoint = step(knobs.checkpoint, a_ckpt, FRACTION_LEVELS)
    # The selective band after the full one: its level kept as the full one moves, clipped at the
    # end of the blocks (a full level up at the end takes one of its quarters).
    selective = min(step(knobs.selective, a_sel, FRACTION_LEVELS), FRACTION_LEVELS - 1 - checkpoint)
    return KnobLevels(
        accum=accum,
        micro=micro,
        precision=step(knobs.precision, a_prec, FRACTION_LEVELS),
        checkpoint=checkpoint,
        zero_stage=min(a_zero, max_zero_stage),
        selective=selective,
        outer=knobs.outer if a_outer == 1 else a_outer == 2,
    )
