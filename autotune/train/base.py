"""The training loop every backend shares: one optimizer step, the learning rate, reconfiguration.

Template method, as stable-baselines3's ``OnPolicyAlgorithm`` owns ``learn()`` and PPO adds
``train()``: :class:`BaseTrainer` owns the step (the learning rate schedule and its batch-size
scaling, the micro-batch loop of gradient accumulation, timing, the :class:`StepResult`) and the
checks a config must pass; a backend adds only what differs:

* how a micro-batch is drawn, moved and trained (``_draw``, ``_to_device``, ``_begin_step``,
  ``_micro_step``);
  a step may instead train the user's own batch (:meth:`BaseTrainer.feed`), split here;
* whether the step may update the weights (``_check_step``: the loss and every gradient finite,
  read before the optimizer runs; a step that fails it is skipped, ``_skip_step``);
* how the step ends (``_end_step``: the optimizer step, the loss over every rank);
* what changing the config means for it (``_apply``).

Backends: :class:`autotune.train.local.Trainer` (one process) and
:class:`autotune.train.zero.ZeroTrainer` (one DeepSpeed rank). The rank session
(:class:`autotune.procs.session.RankSession`) drives ZeroTrainers in other processes through the
same verbs (``reconfigure``, ``step``, ``close``).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from autotune.batches import batch_size, map_tensors, split_batch
from autotune.config import Precision, TrainConfig
from autotune.errors import BatchError, ConfigError, UnsupportedError, WorkloadError
from autotune.train.wrappers import outer_autocast
from autotune.workload import Workload

__all__ = ["BaseTrainer", "StepResult", "check_loss", "check_micro_batch", "finite_gradients"]


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One optimizer step."""

    loss: float  # mean of the micro-batch losses (of every rank's, on ranks)
    samples: int  # samples consumed by this rank
    seconds: float  # wall time of the whole step, data loading included
    lr: float
    overflow: bool  # fp16 loss scaling found inf/nan gradients and skipped the update
    # The loss or a gradient was NaN or infinite: the update was skipped before the optimizer ran
    # (parameters, optimizer state and learning rates as before the step; gradients cleared).
    skipped: bool = False


class BaseTrainer(ABC):
    """One reconfigurable training loop over a workload; backends fill in the hooks below.

    A subclass's ``__init__`` calls ``super().__init__`` first, then builds its model and
    optimizer and calls :meth:`_track_lrs` once the optimizer exists.
    """

    #: Whether one micro-batch may be trained as equal chunks (``step(split=...)``): the chunks'
    #: gradients must be averaged by the trainer itself, not by an engine that knows the batch size.
    supports_split = False
    #: The config the backend hands ``deepspeed.initialize`` (None: no DeepSpeed engine).
    deepspeed_config: dict[str, Any] | None = None

    def __init__(
        self,
        workload: Workload,
        config: TrainConfig,
        *,
        device: torch.device,
        world: int = 1,
        skip_nonfinite: bool = True,
    ) -> None:
        self.workload = workload
        # Decided (measured, for "auto" with labels) before any step is timed or memory-tracked.
        workload.loss_weighting  # noqa: B018 - a cached property: evaluated for its one-time cost
        #: Skip a step whose loss or a gradient is not finite (see :meth:`step`); off where the
        #: trainer measures what a step costs on a copy of the model (the optimizer's state is
        #: created by its first step, and a skipped step would measure less than a real one).
        self.skip_nonfinite = skip_nonfinite
        self.device = device
        self.world = world
        self.block_names = workload.block_names()
        self.step_count = 0
        self.optimizer: torch.optim.Optimizer
        self._base_lrs: list[float] = []
        # The learning rates the last step left in the optimizer, and the scale they carry: a
        # group found at another rate was set by someone else since (the user's LR scheduler).
        self._written_lrs: tuple[list[float], float] | None = None
        self._fed: Any = None
        self._check(config)
        self.config = config

    def _track_lrs(self) -> None:
        """Remember the optimizer's learning rates as the base the schedule scales."""
        self._base_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        self._written_lrs = (list(self._base_lrs), 1.0)

    def _adopt_external_lrs(self) -> None:
        """A learning rate set by someone else since the last step (the user's LR scheduler,
        stepped between two steps, or their own ``group["lr"] = ...``) becomes that group's base:
        autotune's schedule and batch scaling multiply it, never overwrite it. A chainable
        scheduler (``StepLR``, ``ExponentialLR``, ...) multiplies the rate the step left, which
        carries autotune's scale: dividing it out keeps the two composed. At the user's own batch
        and the constant schedule (``Adaptive``'s default) the scale is 1 and the user's rate runs
        as set."""
        if self._written_lrs is None:
            return
        written, scale = self._written_lrs
        for i, (group, lr) in enumerate(zip(self.optimizer.param_groups, written, strict=True)):
            if float(group["lr"]) != lr:
                self._base_lrs[i] = float(group["lr"]) / scale

    # ---- configuration --------------------------------------------------------------------------

    def reconfigure(self, config: TrainConfig) -> str | None:
        """Switch to ``config`` between optimizer steps, keeping weights and optimizer state.

        Returns why the backend had to rebuild what it trains with (a new DeepSpeed engine), or None.
        """
        self._check(config)
        reason = self._apply(config)
        self.config = config
        return reason

    def _check(self, config: TrainConfig) -> None:
        check_micro_batch(self.workload, config, world=self.world)

    @abstractmethod
    def _apply(self, config: TrainConfig) -> str | None:
        """Make the live loop train under ``config`` (``self.config`` is still the old one)."""

    # ---- learning rate ----------------------------------------------------------------------------

    def _lr_scale(self) -> float:
        c = self.config
        return c.lr_multiplier(self.workload.batch_size) * c.lr_factor(self.step_count)

    def lr(self) -> float:
        """Learning rate of the first param group at the current step."""
        return self._base_lrs[0] * self._lr_scale()

    # ---- the step ---------------------------------------------------------------------------------

    @property
    def noise_split(self) -> int:
        """2 when the step's one micro-batch can be trained as two halves (the same gradient), which
        gives the gradient noise estimate the second batch size it needs when there is no
        accumulation to provide it (McCandlish et al. 2018, App. A); else 1."""
        c = self.config
        return 2 if self.supports_split and c.grad_accum_steps == 1 and c.micro_batch_size % 2 == 0 else 1

    def next_batches(self) -> list[Any]:
        """The next step's micro-batches, on the device (to fetch them before a step, e.g. untracked)."""
        return [self._next_batch() for _ in range(self.config.grad_accum_steps)]

    def feed(self, batch: Any) -> None:
        """Make the next :meth:`step` train ``batch``, the user's own batch for the whole step, in
        place of micro-batches drawn from the workload's data.

        The step splits it into micro-batches of ``micro_batch_size`` (the last one shorter when
        it does not divide: the last batch of an epoch) and weights each micro-batch's loss by its
        share of what the loss averages over (samples, or label tokens: :mod:`autotune.loss_items`),
        so the gradient is the one full batch's (MosaicML Composer's micro-batching).

        Raises:
            BatchError: ``batch`` is no pytree of tensors sharing a leading batch dimension (see
                :mod:`autotune.batches`), or holds more than the effective batch.
            UnsupportedError: the backend's engine averages micro-batch gradients itself (DeepSpeed).
        """
        if not self.supports_split:  # the same condition: the trainer weighs its micro-batches itself
            raise UnsupportedError(
                f"{type(self).__name__} cannot train a user's batch: its engine averages micro-batches itself."
            )
        n, c = batch_size(batch), self.config
        if n > c.micro_batch_size * c.grad_accum_steps:
            raise BatchError(
                f"a batch must hold at most the effective batch ({c.micro_batch_size * c.grad_accum_steps} "
                f"samples), but got {n}."
            )
        self._fed = batch

    def step(
        self,
        *,
        split: int = 1,
        batches: list[Any] | None = None,
        before_micro_batch: Callable[[], None] | None = None,
    ) -> StepResult:
        """One optimizer step of ``grad_accum_steps`` micro-batches (``batches``, else fetched), or
        of the user's batch given to :meth:`feed` split into micro-batches.

        ``split`` > 1 (only with ``grad_accum_steps == 1``, on backends that support it) trains
        the micro-batch as ``split`` equal chunks: the same effective batch and gradient, but the
        gradient noise monitor sees two batch sizes (McCandlish et al. 2018, App. A).
        ``before_micro_batch`` runs before each micro-batch (a memory tracker's reset).

        With :attr:`skip_nonfinite`, a step whose mean loss or any gradient is NaN or infinite is
        skipped before the optimizer runs (on backends that can tell before their update: not
        DeepSpeed's, which steps inside its last micro-step): the parameters, the optimizer's state
        and learning rates stay exactly as they were, the gradients are cleared, and the result
        says ``skipped``. Under fp16 loss scaling the scaler's own check skips an infinite
        gradient (``overflow``): only the loss is checked here.
        """
        c = self.config
        self._adopt_external_lrs()
        scale = self._lr_scale()
        lrs = [group["lr"] for group in self.optimizer.param_groups]  # put back if the step is skipped
        before = self._written_lrs
        for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
            group["lr"] = base * scale
        self._written_lrs = ([float(group["lr"]) for group in self.optimizer.param_groups], scale)
        start = time.perf_counter()
        fed, self._fed = self._fed, None
        sizes: list[int] | None = None
        if fed is not None:
            assert split == 1 or (c.grad_accum_steps == 1 and c.micro_batch_size % split == 0), (split, c)
            parts = split_batch(fed, c.micro_batch_size // split)
            batches, sizes = [part for part, _ in parts], [k for _, k in parts]
        elif split > 1:
            batches = self._split(split)
        n = len(batches) if batches is not None else c.grad_accum_steps
        sizes = sizes or [c.micro_batch_size * c.grad_accum_steps // n] * n
        total = sum(sizes)
        shares: list[float | torch.Tensor] | None = None
        items: list[int | torch.Tensor] | None = None
        on_host = fed is not None
        weighting = self.workload.loss_weighting
        if weighting.count is not None:
            if batches is None:
                # Every micro-batch's count weighs each one's loss: the step's batches are drawn
                # first, as transformers' Trainer gathers them for num_items_in_batch, and stay on
                # the host until their turn (the device holds one micro-batch, as when drawn).
                batches, on_host = [self._draw() for _ in range(n)], True
            # Counted on the host: plain numbers; on the device: 0-dim tensors, no sync point.
            items = [_count(weighting.count(b)) for b in batches]
            total_items = self._items_total(sum(items))
            shares = [k / total_items for k in items]
        self._begin_step(sizes, items)
        for i in range(n):
            # Popped, so a micro-batch is freed after its backward.
            batch = batches.pop(0) if batches is not None else self._next_batch()
            if on_host:  # moved one micro-batch at a time: the device holds one, as when drawn
                batch = self._to_device(batch)
            if before_micro_batch is not None:
                before_micro_batch()
            # A micro-batch's loss is a mean over its samples or its label tokens (autotune.loss_items):
            # weighted by its share of the step's, the sum of the terms is the full batch's mean loss.
            share = shares[i] if shares is not None else (None if sizes[i] * n == total else sizes[i] / total)
            self._micro_step(batch, index=i, count=n, share=share)
        checked, skipped = self._check_step() if self.skip_nonfinite else None, False
        if checked is not None and not checked[1]:
            # A NaN or infinite loss or gradient never reaches the weights: a user who catches the
            # NonFiniteLossError and saves a checkpoint saves the weights of the step before.
            self._skip_step()
            for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
                group["lr"] = lr
            self._written_lrs = before
            loss, overflow, skipped = checked[0], False, True
        else:
            loss, overflow = self._end_step()  # a sync point: also ends the step's work on the device
        seconds = time.perf_counter() - start
        self.step_count += 1  # a skipped step counts, as an fp16 overflow step does: the run goes on after it
        return StepResult(
            loss=loss,
            samples=total,
            seconds=seconds,
            lr=self._base_lrs[0] * scale,
            overflow=overflow,
            skipped=skipped,
        )

    def _split(self, split: int) -> list[Any]:
        c = self.config
        if not self.supports_split:
            raise UnsupportedError(f"{type(self).__name__} cannot split a micro-batch (split={split}).")
        assert c.grad_accum_steps == 1 and c.micro_batch_size % split == 0, (split, c)
        # The one split of a batch into micro-batches (per-sample lists split with the tensors).
        return [part for part, _ in split_batch(self._next_batch(), c.micro_batch_size // split)]

    @property
    def outer_precision(self) -> Precision:
        """The autocast precision the forward and the loss run in (``TrainConfig.outer_precision``)."""
        return self.config.outer_precision

    def _loss(self, model: Any, batch: Any) -> torch.Tensor:
        """The workload's loss on ``batch``, in the one outer autocast region of a step: the
        model's forward and the loss run in :attr:`outer_precision` (the blocks' wrappers make
        their own precision the exception)."""
        with outer_autocast(self.outer_precision, self.device.type):
            loss = self.workload.loss_fn(model, batch)
        check_loss(loss, self.workload.name)
        assert isinstance(loss, torch.Tensor)
        return loss

    @abstractmethod
    def _draw(self) -> Any:
        """The next micro-batch of this trainer's data stream, as collated (on the host)."""

    def _to_device(self, batch: Any) -> Any:
        """``batch`` where the step computes."""
        return map_tensors(lambda t: t.to(self.device, non_blocking=True), batch)

    def _next_batch(self) -> Any:
        """The next micro-batch of this trainer's data stream, on the device."""
        return self._to_device(self._draw())

    def _items_total(self, total: int | torch.Tensor) -> int | torch.Tensor:
        """What the step's micro-batch counts (:mod:`autotune.loss_items`) are shares of: this
        process's ``total`` (on ranks, the mean over ranks: the engine averages their gradients)."""
        return total

    def _begin_step(self, sizes: list[int], items: Sequence[int | torch.Tensor] | None) -> None:  # noqa: B027 - an optional hook
        """Before the first of ``len(sizes)`` micro-batches of ``sizes`` samples each, counting
        ``items`` where the loss is a mean over counted items (:mod:`autotune.loss_items`)."""

    @abstractmethod
    def _micro_step(self, batch: Any, *, index: int, count: int, share: float | torch.Tensor | None) -> None:
        """Forward and backward of micro-batch ``index`` of ``count``: its loss weighs ``share`` of
        the step's gradient (a 0-dim tensor where counted on the device: no sync point), or
        ``1 / count`` when None (micro-batches of equal size)."""

    def _check_step(self) -> tuple[float, bool] | None:
        """After the last backward, before the optimizer: (the step's mean loss, whether it and every
        gradient are finite); None where the backend cannot tell before its update (DeepSpeed's
        engine steps inside its last micro-step), then the step is never skipped here."""
        return None

    def _skip_step(self) -> None:
        """Drop the step's gradients without touching the parameters or the optimizer's state
        (only called after :meth:`_check_step` found a non-finite value)."""
        # set_to_none: torch's optimizers skip a parameter without a gradient entirely (no update,
        # no weight decay, no state change), should one step after this before the next backward.
        self.optimizer.zero_grad(set_to_none=True)

    @abstractmethod
    def _end_step(self) -> tuple[float, bool]:
        """Finish the step (optimizer, gradients cleared); return (mean loss, overflow)."""

    @abstractmethod
    def close(self) -> None:
        """Undo what the trainer did to its model (wrappers, hooks); idempotent."""


def _count(items: int | torch.Tensor) -> int | torch.Tensor:
    """A micro-batch's count as a number where it was counted on the host (a device tensor stays)."""
    if isinstance(items, torch.Tensor) and items.device.type == "cpu":
        return int(items)
    return items


def check_micro_batch(workload: Workload, config: TrainConfig, *, world: int) -> None:
    """A micro-batch must fit in each rank's share of the dataset (its data stream drops the rest);
    an iterable dataset, whose size is unknown, only in one process."""
    size = workload.dataset_size
    if size is None:
        if world > 1:
            raise UnsupportedError(
                f"DeepSpeed ranks shard a map-style dataset with a DistributedSampler, but workload {workload.name!r} "
                f"has an IterableDataset ({type(workload.dataset).__name__}), which every rank would read whole: "
                "give it as a map-style Dataset, or run one process (ranks=1)."
            )
        return
    if world == 1 and config.micro_batch_size > size:
        raise ConfigError(
            f"TrainConfig.micro_batch_size must be <= the dataset size of workload "
            f"{workload.name!r} ({size}), but got {config.micro_batch_size}."
        )
    if world > 1 and config.micro_batch_size > size // world:
        raise ConfigError(
            f"TrainConfig.micro_batch_size must be <= the dataset size of workload {workload.name!r} "
            f"per rank ({size} // {world} ranks), but got {config.micro_batch_size}."
        )


def check_loss(loss: object, workload: str) -> None:
    """Raise :class:`WorkloadError` unless ``loss`` (what ``loss_fn`` returned) is a 0-dim tensor."""
    # Python-side metadata only (type, ndim, shape): no device sync. Without it a non-scalar loss
    # fails inside backward() with PyTorch's "grad can be implicitly created only for scalar outputs".
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(
            f"workload {workload!r}: loss_fn must return a scalar tensor, but returned {type(loss).__name__}"
        )
    if loss.dim() != 0:
        raise WorkloadError(
            f"workload {workload!r}: loss_fn must return a scalar tensor, but returned shape {tuple(loss.shape)}"
        )


def finite_gradients(grads: list[torch.Tensor]) -> torch.Tensor:
    """Whether every value of ``grads`` is finite, as a 0-dim bool tensor on the first one's device
    (no device sync: the caller reads it with what else it reads).

    The largest absolute value (the infinity norm) is NaN or infinite exactly when one value is:
    unlike the 2-norm it cannot overflow on large finite gradients.
    """
    if not grads:
        return torch.ones((), dtype=torch.bool)
    return torch.isfinite(torch.nn.utils.get_total_norm(grads, norm_type=math.inf))
