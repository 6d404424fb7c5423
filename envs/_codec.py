"""The environments' action codec, private to them: the level tables, an action as a step on
:class:`~autotune.knobs.Knobs`, and a Knobs as the observation's level entries.

Every searcher moves :class:`~autotune.knobs.Knobs` (the study, its refinement, the
environments, the climb, an adaptive run's decider); only the policy's action and observation are
in *levels*, indices into small tables, so that an action means the same on every model:
accumulation and micro-batch move by powers of two, and precision and checkpointing by quarters of
the blocks: level l of 4 puts round(l/4 * L) blocks in reduced precision (or recompute), the ones
with the most activation bytes first (``BlockProfile.ranked``), where each change saves the most
memory. :meth:`Levels.knobs` decodes levels to Knobs; :func:`levels_near` and :func:`levels_of`
encode.

Why one private module and not the vocabulary's: the tables and the action are the shipped
policy's contract (its observation vector and its ``MultiDiscrete`` action), not a way to name a
configuration; adding a knob touches them here only, and only if the policy is to see it. The
module is private (no ``__all__`` entry in ``autotune.envs``); the environments, the climb
(``policies/climb.py``), the policies' transfer and study tools and an adaptive run's policy
source import it.

On a model of fewer than four blocks two levels cover the same count of blocks, so the encoding
of a Knobs is not unique there: the environments keep the level they are on (their codec's
position) next to their Knobs, and an action moves from it, as the policy was trained.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import NamedTuple

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError
from autotune.knobs import Knobs

ACCUM_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
MICRO_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
FRACTION_LEVELS = 5  # 0, 1/4, 1/2, 3/4, all of the blocks
ZERO_STAGES = 4


@dataclass(frozen=True, kw_only=True)
class Levels:
    """Indices into the level tables, plus the ZeRO stage.

    ``checkpoint`` is the level of the blocks recomputed whole, and ``selective`` that of the
    ones recomputed selectively after them (:attr:`Knobs.selective_blocks`): together at most
    all of the blocks (``checkpoint + selective <= 4``), the first ``round((c + s)/4 L)`` blocks
    recomputed at all. The policy moves it (:func:`apply_action`'s sixth entry) and sees it (the
    observation's entry 20), as it moves and sees ``outer`` (the seventh entry, observation 21).

    Attributes:
        accum: Index into the accumulation levels (1, 2, 4, ... 128).
        micro: Index into the micro-batch levels (1, 2, 4, ... 128).
        precision: Quarters of the blocks in reduced precision, hungriest first (0-4).
        checkpoint: Quarters of the blocks recomputed whole, hungriest first (0-4).
        zero_stage: The ZeRO stage (0-3).
        selective: Quarters of the blocks recomputed selectively after the whole ones (0-4).
        outer: Whether everything outside the blocks (embeddings, final norm, head, loss) runs in
            the reduced precision too (:attr:`Knobs.outer_low_precision`).

    Example:
        >>> from autotune.envs._codec import Levels
        >>> levels = Levels(accum=1, micro=3)
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
                raise ConfigError(f"Levels.{name} must be an int in [0, {n - 1}], but got {value!r}.")
        if self.checkpoint + self.selective > FRACTION_LEVELS - 1:
            raise ConfigError(
                f"Levels.checkpoint + selective must be <= {FRACTION_LEVELS - 1}, but got "
                f"{self.checkpoint} + {self.selective}."
            )
        if not isinstance(self.outer, bool):
            raise ConfigError(f"Levels.outer must be a bool, but got {self.outer!r}.")

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
    def default_for(cls, batch_size: int) -> Levels:
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


def levels_near(knobs: Knobs, near: Levels, num_blocks: int) -> Levels:
    """``knobs`` (one rank's split in the tables, counts that :func:`level_counts` reaches) as knob
    levels on a model of ``num_blocks`` blocks: where two levels cover the same count, the one
    nearest ``near``'s; on one rank the ZeRO stage is ``near``'s (Knobs keep 0 there). The
    selective level is the one whose band (:attr:`Levels.selective`) ends at the full and
    selective blocks together; ``outer`` is ``knobs.outer_low_precision``."""

    def level(count: int, here: int, lowest: int = 0) -> int:
        matches = [lv for lv in range(lowest, FRACTION_LEVELS) if level_blocks(lv, num_blocks) == count]
        assert matches, f"{count} blocks is no level's on {num_blocks} blocks"
        return min(matches, key=lambda lv: abs(lv - here))

    checkpoint = level(knobs.checkpoint_blocks, near.checkpoint)
    recomputed = knobs.checkpoint_blocks + knobs.selective_blocks
    band = level(recomputed, near.checkpoint + near.selective, checkpoint) if knobs.selective_blocks else checkpoint
    return Levels(
        accum=ACCUM_LEVELS.index(knobs.grad_accum_steps),
        micro=MICRO_LEVELS.index(knobs.micro_batch_size),
        precision=level(knobs.low_precision_blocks, near.precision),
        checkpoint=checkpoint,
        zero_stage=knobs.zero_stage if knobs.ranks > 1 else near.zero_stage,
        selective=band - checkpoint,
        outer=knobs.outer_low_precision,
    )


def knobs_to_config(
    levels: Levels,
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
        >>> from autotune.envs._codec import Levels, knobs_to_config
        >>> config = knobs_to_config(Levels(accum=1, micro=3, checkpoint=2), ranking=(2, 0, 1, 3))
        >>> config.micro_batch_size, config.grad_accum_steps, config.checkpoint  # the 2 hungriest of 4 blocks
        (8, 2, (True, False, True, False))
    """
    return levels.knobs(len(ranking), reduced=reduced, ranks=ranks).to_config(ranking, base=base)


def levels_of(config: TrainConfig, num_blocks: int) -> Levels | None:
    """``config`` as knob levels on a model of ``num_blocks`` blocks, or None when the tables
    cannot express it: a split that is not in them (a micro-batch or accumulation that is not a
    power of two up to 128). Per-block settings count as the nearest quarter of the blocks they
    cover: the wholly recomputed ones the ``checkpoint`` level, and the recomputed ones together
    (selective too) the band that ends the ``selective`` level; a reduced outer precision is
    ``outer`` (the levels' reduced precision is the caller's, as in :func:`knobs_to_config`).

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.envs._codec import levels_of
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
    return Levels(
        accum=ACCUM_LEVELS.index(config.grad_accum_steps),
        micro=MICRO_LEVELS.index(config.micro_batch_size),
        precision=round(low / num_blocks * quarters),
        checkpoint=full,
        zero_stage=config.zero_stage,
        selective=band - full,
        outer=config.outer_precision != "fp32",
    )


class Action(NamedTuple):
    """One ``MultiDiscrete`` action of the environments and the policy (:func:`apply_action`):
    ``split``, ``batch``, ``precision``, ``checkpoint`` and ``selective`` are 0 (down), 1 (keep)
    or 2 (up); ``zero`` is the ZeRO stage itself, not a move; ``outer`` is 0 (fp32), 1 (keep) or
    2 (the reduced precision)."""

    split: int
    batch: int
    precision: int
    checkpoint: int
    zero: int
    selective: int = 1
    outer: int = 1


class Move(enum.Enum):
    """The one-knob moves, named: what an action does to one knob on one process (ZeRO 0)."""

    KEEP = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0)
    LARGER_MICRO_BATCH = Action(split=0, batch=1, precision=1, checkpoint=1, zero=0)  # accumulation halves
    SMALLER_MICRO_BATCH = Action(split=2, batch=1, precision=1, checkpoint=1, zero=0)  # accumulation doubles
    LESS_RECOMPUTE = Action(split=1, batch=1, precision=1, checkpoint=0, zero=0)
    MORE_RECOMPUTE = Action(split=1, batch=1, precision=1, checkpoint=2, zero=0)
    LESS_REDUCED_PRECISION = Action(split=1, batch=1, precision=0, checkpoint=1, zero=0)
    MORE_REDUCED_PRECISION = Action(split=1, batch=1, precision=2, checkpoint=1, zero=0)
    LESS_SELECTIVE = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0, selective=0)
    MORE_SELECTIVE = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0, selective=2)
    OUTER_FP32 = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0, outer=0)
    OUTER_REDUCED = Action(split=1, batch=1, precision=1, checkpoint=1, zero=0, outer=2)

    @property
    def action(self) -> Action:
        value: Action = self.value
        return value


def apply_action(
    knobs: Levels,
    action: Action | tuple[int, ...],
    *,
    max_zero_stage: int,
    adapt_batch: bool = False,
    min_batch: int = 1,
    min_micro: int = 1,
) -> Levels:
    """The knob levels after a MultiDiscrete action ``(split, batch, precision, checkpoint, zero,
    selective, outer)`` (the environments' action space; a shorter action, the first five entries
    or six, keeps the knobs of the entries it leaves off).

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
    the blocks recomputed selectively after the wholly recomputed ones (:attr:`Levels.selective`),
    clipped where the two together cover every block; a checkpoint level up there turns a
    selective quarter into a full one (the blocks recomputed at all stay). Without selective blocks
    the checkpoint delta acts as it did before the level existed. ``outer`` (0: the outer parts
    in fp32, 1: keep, 2: in the reduced precision) moves :attr:`Levels.outer`. Every action is
    valid: no masking in the action space.

    Args:
        knobs: The levels the action moves from.
        action: ``(split, batch, precision, checkpoint, zero, selective, outer)``, or its first five or six entries.
        max_zero_stage: The highest ZeRO stage the fifth entry reaches.
        adapt_batch: Whether ``batch`` acts (otherwise it is ignored).
        min_batch: The smallest effective batch (one rank's) ``batch`` may reach.
        min_micro: The smallest micro-batch ``split`` may reach.

    Returns:
        The levels after the action.

    Example:
        >>> from autotune.envs._codec import Levels, apply_action
        >>> levels = Levels(accum=1, micro=3)  # 8 x 2
        >>> after = apply_action(levels, (2, 1, 1, 1, 0, 1, 1), max_zero_stage=0)  # more, smaller micro-batches
        >>> after.micro_batch_size, after.accum_steps, after.effective_batch_size
        (4, 4, 16)
    """
    a_split, a_batch, a_prec, a_ckpt, a_zero, *extra = (int(x) for x in action)
    assert len(extra) <= 2, f"an action has 7 entries (or its first 5 or 6): {tuple(action)}"
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
    return Levels(
        accum=accum,
        micro=micro,
        precision=step(knobs.precision, a_prec, FRACTION_LEVELS),
        checkpoint=checkpoint,
        zero_stage=min(a_zero, max_zero_stage),
        selective=selective,
        outer=knobs.outer if a_outer == 1 else a_outer == 2,
    )
