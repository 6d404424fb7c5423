"""The configuration vocabulary: one configuration in two encodings, and the conversions.

* :class:`~autotune.config.TrainConfig`: what runs, every block named (a precision and a
  checkpoint flag each).
* :class:`Knobs`: what every searcher moves (the study and its refinement, the environments and
  the climb that ends a ``tune`` episode, an adaptive run's decider), in terms that do not depend
  on the model's depth (below).

Conversions, all here: :meth:`Knobs.to_config` (Knobs -> TrainConfig) and
:func:`knobs_of_config` (TrainConfig -> Knobs). The environments' action codec (an action of the
policy as a step on Knobs, a Knobs as the observation's entries) is theirs, private
(``autotune/envs/_codec.py``).


A :class:`TrainConfig` names every block (a precision and a checkpoint flag each), so its size
grows with the model. Searchers use a handful of numbers instead: the effective batch, how it
splits into micro-batch x accumulation x ranks, the ZeRO stage, and two *counts* over the blocks
ranked by the activation bytes they save for backward (:meth:`autotune.memory.blocks.BlockProfile.ranked`):
"the n hungriest blocks run in low precision, the c hungriest are recomputed". The first unit of
each count buys the most memory, and the same numbers mean the same thing on any model.

The Optuna study samples these knobs directly (``autotune.search.space``); the Gymnasium
environments move through them by the policy's actions. A configuration found by one is therefore
a point of the other: ``SearchSpace.params(knobs)`` enqueues an environment's result in a study.

The effective batch (micro-batch x accumulation x ranks) is the user's training maths: its
learning rate, its schedule, its statistical efficiency. A move therefore changes the *split*
of the batch (micro-batch x2 and accumulation /2, or the reverse), never the product; only with
batch adaptation on may the batch change, and then never below the user's (Pollux, Qiao et al.
OSDI'21, adapts the batch upward from the one the user's learning rate was tuned for).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.config import PRECISIONS, Checkpoint, Precision, TrainConfig
from autotune.errors import AutotuneError, ConfigError

__all__ = [
    "Knobs",
    "check_min_micro_batch",
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
            study's every count from 0 to the blocks; the quarters the
            environments' level tables reach).
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
