"""How an agent moves through the knobs: levels, so one policy fits any model depth.

The knobs themselves are :class:`autotune.knobs.Knobs`, the encoding the Optuna study uses too.
An agent steps through them by *levels* (indices into small tables) so that an action means the
same on every model: accumulation and micro-batch move by powers of two, and precision and
checkpointing by quarters of the blocks: level l of 4 puts round(l/4 * L) blocks in reduced
precision (or recompute), the ones with the most activation bytes first (``BlockProfile.ranked``),
where each change saves the most memory. :meth:`KnobLevels.knobs` gives the shared Knobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError
from autotune.knobs import Knobs

__all__ = ["ACCUM_LEVELS", "MICRO_LEVELS", "FRACTION_LEVELS", "KnobLevels", "knobs_to_config", "apply_action"]

ACCUM_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16)
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
        """PyTorch's default way to train: the whole batch in one fp32 pass, nothing recomputed."""
        micro = min(range(len(MICRO_LEVELS)), key=lambda i: abs(math.log2(MICRO_LEVELS[i] / batch_size)))
        return cls(micro=micro)

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


def apply_action(knobs: KnobLevels, action: tuple[int, ...], *, max_zero_stage: int) -> KnobLevels:
    """Apply a MultiDiscrete action ``(accum, micro, precision, checkpoint, zero)``.

    The first four are deltas (0: down, 1: keep, 2: up) clipped at the ends of their tables; the
    last is the ZeRO stage, mapped to ``min(stage, max_zero_stage)`` (0 when there is one rank
    or no ZeRO runner), so every action is valid and no masking is needed.
    """
    a_acc, a_micro, a_prec, a_ckpt, a_zero = (int(x) for x in action)

    def step(value: int, delta: int, n: int) -> int:
        return min(max(value + delta - 1, 0), n - 1)

    return KnobLevels(
        accum=step(knobs.accum, a_acc, len(ACCUM_LEVELS)),
        micro=step(knobs.micro, a_micro, len(MICRO_LEVELS)),
        precision=step(knobs.precision, a_prec, FRACTION_LEVELS),
        checkpoint=step(knobs.checkpoint, a_ckpt, FRACTION_LEVELS),
        zero_stage=min(a_zero, max_zero_stage),
    )
