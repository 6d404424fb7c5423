"""The search space: Optuna parameters over :class:`autotune.knobs.Knobs`, the shared encoding.

The effective batch is fixed by the user (or chosen from ``batch_sizes``), so the search changes
how training runs, not what it computes: micro-batch x accumulation x ranks == effective batch,
and the sampler only picks the micro-batch among the divisors. Per-block precision and
checkpointing are two *levels* applied to blocks ranked by the activation bytes they save for
backward (:func:`autotune.memory.blocks.profile_blocks`): "the n hungriest blocks run in bf16, the c
hungriest are recomputed". That is 2 integers instead of 2L flags, and it orders the blocks so the
first unit of each level buys the most memory. Per-block overrides from the spec pin single blocks.
The environments use the same Knobs, so :meth:`SearchSpace.params` turns a configuration an agent
reached into a trial to enqueue.

Where the space has a low precision, ``outer_low_precision`` (a categorical, False or True) says
whether the parts outside the blocks run in it too. A study started before that parameter existed
has trials without it: :meth:`SearchSpace.knobs_of` reads them back as its default (False: the
outer parts in fp32, which is what they ran).

Where the space recomputes selectively (``selective``, a study's unless its spec says
``space.selective = false``), ``selective_blocks`` (an int in [0, L]) counts the blocks recomputed
selectively after the ``checkpoint_blocks`` recomputed whole (:attr:`autotune.knobs.Knobs.selective_blocks`),
at most the blocks left: a sampled value above them recomputes every one of those selectively (the
parameter's range stays the same in every trial, which the samplers need). Trials of a study
started before the parameter existed read back as 0, what they ran. Where the space reaches the
level by its enqueued trials only (``selective_sampled=False``, a spec's ``space.selective =
"refine"``), the parameter is suggested only to a trial enqueued with it (Optuna's fixed params):
the sampler never sees it, so its trials are those of the space without the level, and a point
with no selective block is enqueued without it (a trial without it reads back as 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from autotune.config import PRECISIONS, Checkpoint, Precision, TrainConfig
from autotune.errors import SpecError
from autotune.knobs import Knobs, check_min_micro_batch, neighbours, smallest_micro_batch
from autotune.search.spec import BlockOverride

if TYPE_CHECKING:
    import optuna

__all__ = ["OUTER_PARAM", "SELECTIVE_PARAM", "SearchSpace", "divisors"]

#: The trial parameter of :attr:`autotune.knobs.Knobs.outer_low_precision`.
OUTER_PARAM = "outer_low_precision"
#: The trial parameter of :attr:`autotune.knobs.Knobs.selective_blocks`.
SELECTIVE_PARAM = "selective_blocks"


def _precision(p: str) -> Precision:
    assert p in PRECISIONS, p  # SpaceSpec and BlockOverride validated it
    return p  # type: ignore[return-value]


def divisors(n: int) -> tuple[int, ...]:
    return tuple(d for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """The knobs of one study.

    Args:
        batch_sizes: Effective batch candidates; more than one makes the batch a knob.
        ranks: Rank counts; any > 1 adds ``zero_stage`` (conditional on ranks > 1).
        zero_stages: ZeRO stages tried when ranks > 1.
        low_precisions: Precisions of the low-precision level (empty: everything stays fp32).
        ranking: Block indices from most to least activation bytes.
        overrides: Per-block pins, applied after the levels.
        max_micro_batch: Largest micro-batch the data allows (the dataset size).
        min_micro_batch: The smallest micro-batch that keeps the user's training
            (:attr:`autotune.Workload.micro_batch_floor`; None: the whole per-rank batch, no
            accumulation, for a model with BatchNorm).
        base: Config whose other fields (LR schedule, clipping, seed) every trial keeps.
        selective: Whether blocks may be recomputed selectively (``selective_blocks``); off for a
            space built by hand, on for a study's unless its spec turns it off
            (:attr:`autotune.search.spec.SpaceSpec.selective`).
        selective_sampled: Whether the sampler suggests ``selective_blocks`` in every trial (where
            ``selective``); False: only a trial enqueued with it carries it (``space.selective =
            "refine"``).
    """

    batch_sizes: tuple[int, ...]
    ranks: tuple[int, ...] = (1,)
    zero_stages: tuple[int, ...] = (0,)
    low_precisions: tuple[Precision, ...] = ("bf16",)
    ranking: tuple[int, ...]
    overrides: Mapping[int, BlockOverride] = field(default_factory=dict)
    max_micro_batch: int
    min_micro_batch: int | None = 1
    base: TrainConfig = field(default_factory=TrainConfig)
    selective: bool = False
    selective_sampled: bool = True

    def __post_init__(self) -> None:
        check_min_micro_batch(self.min_micro_batch, name="SearchSpace.min_micro_batch", error=SpecError)
        if not self.batch_sizes or not self.ranks or not self.zero_stages or not self.ranking:
            raise SpecError(
                "SearchSpace.batch_sizes, ranks, zero_stages and ranking must be non-empty, but got "
                f"({self.batch_sizes}, {self.ranks}, {self.zero_stages}, {self.ranking})."
            )
        bad_low = [p for p in self.low_precisions if p not in PRECISIONS]
        if bad_low:
            raise SpecError(f"SearchSpace.low_precisions must be among {PRECISIONS}, but got {bad_low[0]!r}.")
        if sorted(self.ranking) != list(range(len(self.ranking))):
            raise SpecError(f"SearchSpace.ranking must be a permutation of the block indices, but got {self.ranking}.")
        for b in self.batch_sizes:
            for r in self.ranks:
                if b % r:
                    raise SpecError(f"space.ranks entry {r} must divide every effective batch size, but got {b}.")
        bad = sorted(i for i in self.overrides if i >= self.num_blocks)
        if bad:
            raise SpecError(f"space.blocks index must be in [0, {self.num_blocks - 1}], but got {bad[0]}.")

    @property
    def num_blocks(self) -> int:
        return len(self.ranking)

    @property
    def samples_selective(self) -> bool:
        """Whether every trial, sampled ones included, has ``selective_blocks``."""
        return self.selective and self.selective_sampled

    @property
    def multi_batch(self) -> bool:
        return len(self.batch_sizes) > 1

    def micro_batch_choices(self, batch_size: int, ranks: int) -> tuple[int, ...]:
        """Micro-batches m with m x accumulation x ranks == batch_size that the data can feed, from
        the smallest that keeps the user's training up (:func:`autotune.knobs.smallest_micro_batch`;
        where the data cannot feed that one, the largest it can)."""
        fed = [m for m in divisors(batch_size // ranks) if m <= self.max_micro_batch]
        smallest = smallest_micro_batch(batch_size // ranks, self.min_micro_batch)
        return tuple(m for m in fed if m >= smallest) or tuple(fed[-1:])

    def micro_param(self, batch_size: int, ranks: int) -> str:
        # One parameter per (batch, ranks) pair: a categorical's choices must not change within a
        # study, and the divisors do. A single pair keeps the plain name.
        if len(self.batch_sizes) == 1 and len(self.ranks) == 1:
            return "micro_batch_size"
        return f"micro_batch_size[B={batch_size},R={ranks}]"

    def neighbours(self, knobs: Knobs) -> list[Knobs]:
        """The points one knob one step away from ``knobs`` in this space
        (:func:`autotune.knobs.neighbours` through its tables: its micro-batch choices, every count
        of blocks, its ZeRO stages on ranks, the outer precision where it has a low precision, the
        selective recompute level where it has it)."""
        return neighbours(
            knobs,
            micro_batches=self.micro_batch_choices(knobs.batch_size, knobs.ranks),
            block_counts=range(self.num_blocks + 1),
            zero_stages=self.zero_stages if knobs.ranks > 1 else (),
            low_precision=bool(self.low_precisions),
            selective=self.selective,
        )

    def variants(self, knobs: Knobs) -> list[Knobs]:
        """Every point at ``knobs``' effective batch, ranks, ZeRO stage, reduced precision and outer
        precision: each
        micro-batch, count of reduced-precision blocks and count of wholly recomputed blocks (the
        selective ones kept, so the counts reach the blocks left)."""
        lows = range(self.num_blocks + 1) if self.low_precisions else range(1)
        return [
            dataclasses.replace(knobs, micro_batch_size=m, low_precision_blocks=n, checkpoint_blocks=c)
            for m in self.micro_batch_choices(knobs.batch_size, knobs.ranks)
            for n in lows
            for c in range(self.num_blocks + 1 - knobs.selective_blocks)
        ]

    # ---- trial <-> knobs <-> config ------------------------------------------------------------

    def suggest(self, trial: optuna.trial.BaseTrial) -> Knobs:
        """Sample (or, for an enqueued trial, read back) one point."""
        return self._point(trial, selective=self.samples_selective or (self.selective and _enqueued_selective(trial)))

    def _point(self, trial: optuna.trial.BaseTrial, *, selective: bool) -> Knobs:
        """The point ``trial`` suggests, ``selective_blocks`` among its parameters where ``selective``."""
        b = trial.suggest_categorical("batch_size", self.batch_sizes) if self.multi_batch else self.batch_sizes[0]
        r = trial.suggest_categorical("ranks", self.ranks) if len(self.ranks) > 1 else self.ranks[0]
        micro = trial.suggest_categorical(self.micro_param(b, r), self.micro_batch_choices(b, r))
        zero = 0
        if r > 1:
            zero = (
                trial.suggest_categorical("zero_stage", self.zero_stages)
                if len(self.zero_stages) > 1
                else self.zero_stages[0]
            )
        low, n_low, outer = "fp32", 0, False
        if self.low_precisions:
            low = (
                trial.suggest_categorical("low_precision", self.low_precisions)
                if len(self.low_precisions) > 1
                else self.low_precisions[0]
            )
            n_low = trial.suggest_int("low_precision_blocks", 0, self.num_blocks)
            outer = trial.suggest_categorical(OUTER_PARAM, (False, True))
        n_ckpt = trial.suggest_int("checkpoint_blocks", 0, self.num_blocks)
        n_sel = 0
        if selective:
            # One range in every trial (the samplers need it); at most the blocks left.
            n_sel = min(trial.suggest_int(SELECTIVE_PARAM, 0, self.num_blocks), self.num_blocks - n_ckpt)
        return Knobs(
            batch_size=b,
            ranks=r,
            micro_batch_size=micro,
            zero_stage=zero,
            low_precision=_precision(low),
            low_precision_blocks=n_low,
            checkpoint_blocks=n_ckpt,
            selective_blocks=n_sel,
            outer_low_precision=bool(outer),
        )

    def knobs_of(self, params: Mapping[str, Any]) -> Knobs:
        """The point a trial's ``params`` stand for (what :meth:`suggest` read back), a parameter
        this space added since the trial ran taking its default (``outer_low_precision``: False;
        ``selective_blocks``: 0).

        Raises:
            ValueError: ``params`` lack a parameter of this space that has no default (another space's).
        """
        import optuna

        filled = dict(params)
        if self.low_precisions:
            filled.setdefault(OUTER_PARAM, False)
        selective = self.selective and (self.selective_sampled or SELECTIVE_PARAM in filled)
        if selective:
            filled.setdefault(SELECTIVE_PARAM, 0)
        return self._point(optuna.trial.FixedTrial(filled), selective=selective)

    def params(self, knobs: Knobs) -> dict[str, Any]:
        """The trial params that :meth:`suggest` reads back as ``knobs`` (for ``enqueue_trial``).

        Raises:
            SpecError: ``knobs`` recompute blocks selectively and this space does not.
        """
        if knobs.selective_blocks and not self.selective:
            raise SpecError(
                "this space recomputes no block selectively (space.selective = false), but got "
                f"{knobs.selective_blocks} selective blocks ({knobs.describe()})."
            )
        p: dict[str, Any] = {}
        if self.multi_batch:
            p["batch_size"] = knobs.batch_size
        if len(self.ranks) > 1:
            p["ranks"] = knobs.ranks
        p[self.micro_param(knobs.batch_size, knobs.ranks)] = knobs.micro_batch_size
        if knobs.ranks > 1 and len(self.zero_stages) > 1:
            p["zero_stage"] = knobs.zero_stage
        if self.low_precisions:
            if len(self.low_precisions) > 1:
                p["low_precision"] = knobs.low_precision
            p["low_precision_blocks"] = knobs.low_precision_blocks
            p[OUTER_PARAM] = knobs.outer_low_precision
        p["checkpoint_blocks"] = knobs.checkpoint_blocks
        if self.selective and (self.selective_sampled or knobs.selective_blocks):
            # Unsampled, the level stays off the trials with none: the baselines and every other
            # enqueued point are then the same trials as in the space without it.
            p[SELECTIVE_PARAM] = knobs.selective_blocks
        return p

    def config(self, knobs: Knobs) -> TrainConfig:
        """The TrainConfig a point stands for: the knobs' levels, then the spec's per-block pins."""
        low, ckpt = knobs.blocks(self.ranking)
        precisions: list[Precision] = list(low)
        checkpoints: list[Checkpoint] = list(ckpt)
        for i, o in self.overrides.items():
            if o.precision is not None:
                precisions[i] = _precision(o.precision)
            if o.checkpoint is not None:
                checkpoints[i] = o.checkpoint
        return dataclasses.replace(
            knobs.to_config(self.ranking, base=self.base),
            precision=precisions[0] if len(set(precisions)) == 1 else tuple(precisions),
            checkpoint=checkpoints[0] if len(set(checkpoints)) == 1 else tuple(checkpoints),
        )


def _enqueued_selective(trial: optuna.trial.BaseTrial) -> bool:
    """Whether ``trial`` was enqueued with ``selective_blocks`` among its fixed params.

    Optuna 5's ``Trial`` does not expose them (``Study.enqueue_trial`` stores them as the waiting
    trial's ``fixed_params`` system attribute); the study's running trials do, as frozen trials. A
    trial of another kind (a ``FixedTrial``) has no study: :meth:`SearchSpace.knobs_of` decides for it.
    """
    import optuna

    if not isinstance(trial, optuna.Trial):
        return False
    running = trial.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    frozen = next((t for t in running if t.number == trial.number), None)
    assert frozen is not None, trial.number  # the trial being suggested to is running
    return SELECTIVE_PARAM in frozen.system_attrs.get("fixed_params", {})
