"""How an agent moves through the knobs: levels, so one policy fits any model depth.

The knobs themselves are :class:`autotune.knobs.Knobs`, the encoding the Optuna study uses too.
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

import math
from dataclasses import dataclass

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError
from autotune.knobs import Knobs

__all__ = ["ACCUM_LEVELS", "MICRO_LEVELS", "FRACTION_LEVELS", "KnobLevels", "knobs_to_config", "apply_action"]

ACCUM_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
MICRO_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
FRACTION_LEVELS = 5  # 0, 1/4, 1/2, 3/4, all of the blocks
ZERO_STAGES = 4


@dataclass(frozen=True, kw_only=True)
class KnobLevels:
    """Indices into the level tables, plus the ZeRO stage."""

    accum: int = 0
    micro: int = 5
    precision: int = 0
    checkpoint: int = 0
    zero_stage: int = 0

    def __post_init__(self) -> None:
        for name, n in (("accum", len(ACCUM_LEVELS)), ("micro", len(MICRO_LEVELS)),
                        ("precision", FRACTION_LEVELS), ("checkpoint", FRACTION_LEVELS),
                        ("zero_stage", ZERO_STAGES)):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < n:
                raise ConfigError(f"KnobLevels.{name} must be an int in [0, {n - 1}], but got {value!r}.")

    @property
    def accum_steps(self) -> int:
        return ACCUM_LEVELS[self.accum]

    @property
    def micro_batch_size(self) -> int:
        return MICRO_LEVELS[self.micro]

    @property
    def effective_batch_size(self) -> int:
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
        )


def blocks_at_level(level: int, ranking: tuple[int, ...]) -> frozenset[int]:
    """The ``round(level/4 * L)`` hungriest blocks."""
    return frozenset(ranking[: level_blocks(level, len(ranking))])


def level_blocks(level: int, num_blocks: int) -> int:
    """How many blocks level ``level`` covers: ``round(level/4 * L)``."""
    return round(level / (FRACTION_LEVELS - 1) * num_blocks)


def knobs_to_config(levels: KnobLevels, ranking: tuple[int, ...], *, reduced: Precision = "bf16",
                    ranks: int = 1, base: TrainConfig | None = None) -> TrainConfig:  # fmt: skip
    """The TrainConfig for ``levels`` on a model whose blocks rank as ``ranking`` (hungriest first)."""
    return levels.knobs(len(ranking), reduced=reduced, ranks=ranks).to_config(ranking, base=base)


def apply_action(
    knobs: KnobLevels,
    action: tuple[int, ...],
    *,
    max_zero_stage: int,
    adapt_batch: bool = False,
    min_batch: int = 1,
) -> KnobLevels:
    """Apply a MultiDiscrete action ``(split, batch, precision, checkpoint, zero)``.

    ``split`` (0: fewer, larger micro-batches; 1: keep; 2: more, smaller ones) doubles one of
    micro-batch and accumulation and halves the other, so the effective batch never changes; a
    split the tables cannot take (micro-batch 1, or accumulation at its end) keeps the knobs.
    ``batch`` (0: halve, 1: keep, 2: double) acts only with ``adapt_batch`` and never takes the
    effective batch (one rank's: the caller divides by the ranks) below ``min_batch``; it moves
    the accumulation first, so the micro-batch, and with it the activation memory, stays.
    Precision and checkpoint are deltas clipped at the ends of their tables; the last entry is the
    ZeRO stage, mapped to ``min(stage, max_zero_stage)`` (0 when there is one rank or no ZeRO
    runner). Every action is valid: no masking in the action space.
    """
    a_split, a_batch, a_prec, a_ckpt, a_zero = (int(x) for x in action)

    def step(value: int, delta: int, n: int) -> int:
        return min(max(value + delta - 1, 0), n - 1)

    micro, accum = knobs.micro, knobs.accum
    if a_split != 1:
        up = 1 if a_split == 0 else -1  # micro-batch level up by `up`, accumulation down by it
        if 0 <= micro + up < len(MICRO_LEVELS) and 0 <= accum - up < len(ACCUM_LEVELS):
            micro, accum = micro + up, accum - up
    if adapt_batch and a_batch == 2:
        if accum + 1 < len(ACCUM_LEVELS):
            accum += 1
        elif micro + 1 < len(MICRO_LEVELS):
            micro += 1
    elif adapt_batch and a_batch == 0 and ACCUM_LEVELS[accum] * MICRO_LEVELS[micro] >= 2 * min_batch:
        if accum > 0:
            accum -= 1
        else:
            micro -= 1
    return KnobLevels(
        accum=accum,
        micro=micro,
        precision=step(knobs.precision, a_prec, FRACTION_LEVELS),
        checkpoint=step(knobs.checkpoint, a_ckpt, FRACTION_LEVELS),
        zero_stage=min(a_zero, max_zero_stage),
    )
