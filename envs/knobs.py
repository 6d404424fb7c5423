"""Model-agnostic knobs: the configuration an agent controls, independent of model depth.

A policy trained on one model must act on another with a different number of blocks, so the
knobs never name a block. Precision and checkpointing are *levels*: level l of 4 puts
round(l/4 * L) blocks in reduced precision (or recompute), choosing the blocks with the most
activation bytes first (``BlockProfile.ranked``): that is where each change saves the most memory.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError

__all__ = ["ACCUM_LEVELS", "MICRO_LEVELS", "FRACTION_LEVELS", "Knobs", "knobs_to_config", "apply_action"]

ACCUM_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16)
MICRO_LEVELS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
FRACTION_LEVELS = 5  # 0, 1/4, 1/2, 3/4, all of the blocks
ZERO_STAGES = 4


@dataclass(frozen=True, kw_only=True)
class Knobs:
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
                raise ConfigError(f"Knobs.{name} must be an int in [0, {n - 1}], but got {value!r}.")

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
    def default_for(cls, batch_size: int) -> Knobs:
        """PyTorch's default way to train: the whole batch in one fp32 pass, nothing recomputed."""
        micro = min(range(len(MICRO_LEVELS)), key=lambda i: abs(math.log2(MICRO_LEVELS[i] / batch_size)))
        return cls(micro=micro)


def blocks_at_level(level: int, ranking: tuple[int, ...]) -> frozenset[int]:
    """The ``round(level/4 * L)`` hungriest blocks."""
    n = round(level / (FRACTION_LEVELS - 1) * len(ranking))
    return frozenset(ranking[:n])


def knobs_to_config(knobs: Knobs, ranking: tuple[int, ...], *, reduced: Precision = "bf16",
                    base: TrainConfig | None = None) -> TrainConfig:  # fmt: skip
    """The TrainConfig for ``knobs`` on a model whose blocks rank as ``ranking`` (hungriest first)."""
    low = blocks_at_level(knobs.precision, ranking)
    ckpt = blocks_at_level(knobs.checkpoint, ranking)
    n = len(ranking)
    return dataclasses.replace(
        base or TrainConfig(),
        micro_batch_size=knobs.micro_batch_size,
        grad_accum_steps=knobs.accum_steps,
        precision=tuple(reduced if i in low else "fp32" for i in range(n)),
        checkpoint=tuple(i in ckpt for i in range(n)),
        zero_stage=knobs.zero_stage,
    )


def apply_action(knobs: Knobs, action: tuple[int, ...], *, max_zero_stage: int) -> Knobs:
    """Apply a MultiDiscrete action ``(accum, micro, precision, checkpoint, zero)``.

    The first four are deltas (0: down, 1: keep, 2: up) clipped at the ends of their tables; the
    last is the ZeRO stage, mapped to ``min(stage, max_zero_stage)`` (0 when there is one rank
    or no ZeRO runner), so every action is valid and no masking is needed.
    """
    a_acc, a_micro, a_prec, a_ckpt, a_zero = (int(x) for x in action)

    def step(value: int, delta: int, n: int) -> int:
        return min(max(value + delta - 1, 0), n - 1)

    return Knobs(
        accum=step(knobs.accum, a_acc, len(ACCUM_LEVELS)),
        micro=step(knobs.micro, a_micro, len(MICRO_LEVELS)),
        precision=step(knobs.precision, a_prec, FRACTION_LEVELS),
        checkpoint=step(knobs.checkpoint, a_ckpt, FRACTION_LEVELS),
        zero_stage=min(a_zero, max_zero_stage),
    )
