"""The knobs in depth-independent terms: one encoding shared by the study and the environments.

A :class:`TrainConfig` names every block (a precision and a checkpoint flag each), so its size
grows with the model. Searchers use a handful of numbers instead: the effective batch, how it
splits into micro-batch x accumulation x ranks, the ZeRO stage, and two *counts* over the blocks
ranked by the activation bytes they save for backward (:meth:`autotune.memory.blocks.BlockProfile.ranked`):
"the n hungriest blocks run in low precision, the c hungriest are recomputed". The first unit of
each count buys the most memory, and the same numbers mean the same thing on any model.

The Optuna study samples these knobs directly (``autotune.search.space``); the Gymnasium
environments move through them by levels (``autotune.envs.knobs.KnobLevels.knobs``). A
configuration found by one is therefore a point of the other: ``SearchSpace.params(knobs)``
enqueues an environment's result in a study.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.config import PRECISIONS, Precision, TrainConfig
from autotune.errors import ConfigError

__all__ = ["Knobs"]


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
        checkpoint_blocks: How many blocks, hungriest first, are recomputed in backward.
    """

    batch_size: int
    micro_batch_size: int
    ranks: int = 1
    zero_stage: int = 0
    low_precision: Precision = "bf16"
    low_precision_blocks: int = 0
    checkpoint_blocks: int = 0

    def __post_init__(self) -> None:
        for name, low in (("batch_size", 1), ("micro_batch_size", 1), ("ranks", 1),
                          ("low_precision_blocks", 0), ("checkpoint_blocks", 0)):  # fmt: skip
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"Knobs.{name} must be an int >= {low}, but got {value!r}.")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ConfigError(f"Knobs.zero_stage must be one of 0, 1, 2, 3, but got {self.zero_stage!r}.")
        if self.low_precision not in PRECISIONS:
            raise ConfigError(f"Knobs.low_precision must be one of {PRECISIONS}, but got {self.low_precision!r}.")
        if self.batch_size % (self.micro_batch_size * self.ranks):
            raise ConfigError(
                "Knobs.micro_batch_size x ranks must divide batch_size, but got "
                f"{self.micro_batch_size} x {self.ranks} and {self.batch_size}."
            )

    @property
    def grad_accum_steps(self) -> int:
        return self.batch_size // (self.micro_batch_size * self.ranks)

    def blocks(self, ranking: Sequence[int]) -> tuple[tuple[Precision, ...], tuple[bool, ...]]:
        """Per-block precision and checkpointing on a model whose blocks rank as ``ranking``
        (block indices, hungriest first)."""
        n = len(ranking)
        if sorted(ranking) != list(range(n)):
            raise ConfigError(f"ranking must be a permutation of the block indices, but got {tuple(ranking)}.")
        for name in ("low_precision_blocks", "checkpoint_blocks"):
            if getattr(self, name) > n:
                raise ConfigError(
                    f"Knobs.{name} must be <= the {n} blocks of the model, but got {getattr(self, name)}."
                )
        low = set(ranking[: self.low_precision_blocks])
        ckpt = set(ranking[: self.checkpoint_blocks])
        return (
            tuple(self.low_precision if i in low else "fp32" for i in range(n)),
            tuple(i in ckpt for i in range(n)),
        )

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
            checkpoint=checkpoints[0] if len(set(checkpoints)) == 1 else checkpoints,
        )

    def describe(self) -> str:
        """Short human form, e.g. ``8x4 bf16:3 ckpt:2 zero2x2``."""
        text = f"{self.micro_batch_size}x{self.grad_accum_steps}"
        if self.low_precision_blocks:
            text += f" {self.low_precision}:{self.low_precision_blocks}"
        if self.checkpoint_blocks:
            text += f" ckpt:{self.checkpoint_blocks}"
        if self.ranks > 1:
            text += f" zero{self.zero_stage}x{self.ranks}"
        return text
