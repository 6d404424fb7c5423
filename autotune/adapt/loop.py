"""The loop :class:`~autotune.adapt.Adaptive` drives, and its local backend.

:class:`AdaptLoop` is what the adaptive run needs of a training loop: a step, a step under exact
memory tracking, a reconfiguration, and the gradient-noise hooks where the backend has them. Two
backends implement it: :class:`InPlaceTrainer` (the local Trainer on the user's own model and
optimizer, with a data stream that keeps its place) and :class:`autotune.adapt.ranks.RankLoop`
(the rank session's DeepSpeed ranks). :class:`LoopHooks` is the adaptive run's front-end for the
controller over either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from autotune.adapt.records import Change
from autotune.config import TrainConfig
from autotune.measurement.cuda_memory import AllocatorStats, StatsSource, allocator_source
from autotune.measurement.tracker import tracked_step
from autotune.train.base import StepResult
from autotune.train.gns import GradientNoiseMonitor, NoiseEstimate
from autotune.train.local import Trainer
from autotune.train.stream import workload_stream
from autotune.workload import Workload

__all__ = ["AdaptLoop", "InPlaceTrainer", "LoopHooks", "SampledNoise", "in_place"]


class SampledNoise:
    """The trainer's gradient-noise monitor, folding in only the steps it is ``enabled`` for.

    An enabled step costs a norm per parameter and a device->host sync (~3-5% of a step measured
    on every step); a run that decides every K steps needs only the few steps before each
    decision. Disabled, the hooks return at once and nothing is folded in.
    """

    def __init__(self, monitor: GradientNoiseMonitor) -> None:
        self.monitor = monitor
        self.enabled = False

    def begin_step(
        self, micro_batch_size: int, grad_multiplier: float, items: Sequence[float | torch.Tensor] | None = None
    ) -> None:
        if self.enabled:
            self.monitor.begin_step(micro_batch_size, grad_multiplier, items)

    def end_micro_batch(self) -> None:
        if self.enabled:
            self.monitor.end_micro_batch()

    def end_step(self, grads: list[torch.Tensor]) -> None:
        if self.enabled:
            self.monitor.end_step(grads)

    def estimate(self) -> NoiseEstimate:
        return self.monitor.estimate()

    def remove(self) -> None:
        self.monitor.remove()


class AdaptLoop(Protocol):
    """A training loop an adaptive run can drive: the verbs of :class:`~autotune.train.base.BaseTrainer`.

    ``noise`` is None where the backend cannot see micro-batch gradients (ZeRO reduces them inside
    the engine); then ``noise_split`` is 1. ``allocator_stats``: the CUDA caching allocator's
    peaks over the last :meth:`measured_step` (None off CUDA, or where the backend cannot read them).
    """

    @property
    def allocator_stats(self) -> AllocatorStats | None: ...

    @property
    def config(self) -> TrainConfig: ...

    @property
    def step_count(self) -> int: ...

    @property
    def noise(self) -> SampledNoise | None: ...

    @property
    def noise_split(self) -> int: ...

    def feed(self, batch: Any) -> None:
        """Make the next step train the user's ``batch`` (see :meth:`BaseTrainer.feed`)."""
        ...

    def step(self, *, split: int = 1) -> StepResult:
        """One optimizer step (``split`` > 1: see :meth:`BaseTrainer.step`)."""
        ...

    def measured_step(self) -> tuple[StepResult, int]:
        """One optimizer step under exact memory tracking: (its result, its peak tensor bytes;
        with several ranks, the highest rank's)."""
        ...

    def reconfigure(self, config: TrainConfig) -> str | None:
        """Switch to ``config`` between steps, keeping the training state; why it rebuilt, or None."""
        ...

    def close(self) -> None: ...


class InPlaceTrainer(Trainer):
    """:class:`Trainer` over the user's objects, trained in place.

        A ``DataLoader`` fixes its batch size, so the base trainer starts a new shuffled epoch at every
        micro-batch change; here every micro-batch is drawn from one
    :class:`~autotune.train.stream.ShardStream` (one rank; an ``IterableStream`` for an iterable dataset),
        which keeps its position: a run that switches from 32 x 1 to 16 x 2 sees the very samples, in
        the very order, that a fixed 32 x 1 run sees.
    """

    def __init__(
        self,
        workload: Workload,
        config: TrainConfig,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        device: str | torch.device | None,
        track_noise: bool,
    ) -> None:
        stream = workload_stream(workload, num_replicas=1, rank=0, seed=config.seed)
        super().__init__(
            workload, config, model=model, optimizer=optimizer, device=device, track_noise=track_noise, stream=stream
        )
        self.noise = SampledNoise(self.gns)
        self.gns = self.noise  # type: ignore[assignment]  # the same protocol, sampled
        self.allocator: StatsSource | None = allocator_source(self.device)
        self.allocator_stats: AllocatorStats | None = None

    def measured_step(self) -> tuple[StepResult, int]:
        if self.allocator is not None:
            # The cache still holds the segments of the configurations before this one: after a
            # move to a smaller one its reserved peak would be theirs, and so would the
            # reserved/allocated ratio that scales every later prediction (too high: configurations
            # that fit refused). Released first, the segments are this step's own.
            # Cost: one garbage collection and the step's allocations from the driver again, once
            # per configuration tracked.
            self.allocator.release(self.device)
            self.allocator.reset_peak_memory_stats(self.device)
        tracked = tracked_step(self)
        if self.allocator is not None:
            self.allocator_stats = AllocatorStats.read(self.allocator, self.device)
        return tracked.result, tracked.at_peak.total


def in_place(
    workload: Workload, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, device: str | torch.device | None
) -> Callable[[TrainConfig, bool], AdaptLoop]:
    """The local loop over the user's objects, built at the start the controller picks: ``loop(start, noise)``."""

    def loop(start: TrainConfig, noise: bool) -> AdaptLoop:
        return InPlaceTrainer(workload, start, model=model, optimizer=optimizer, device=device, track_noise=noise)

    return loop


class LoopHooks:
    """Adaptive's front-end for the controller: its own loop (local, or DeepSpeed ranks) takes
    every configuration, at any step (a reconfiguration: new block wrappers and micro-batch, on
    ranks new engines where the ZeRO stage or engine precision changes)."""

    splits_now = True

    def __init__(self, *, paired: bool) -> None:
        self.paired = paired
        self.trainer: AdaptLoop | None = None  # built at the configuration the controller starts in
        self.noise = False

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return proposed

    def apply(self, change: Change) -> Change | None:
        if self.trainer is None:  # before the loop is built: it is built at change.after
            return change
        rebuilt = self.trainer.reconfigure(change.after)
        if rebuilt is not None:  # new DeepSpeed engines, the state carried over: what the seconds paid for
            change = dataclasses.replace(change, reason=f"{change.reason}; new engines: {rebuilt.partition(':')[0]}")
        return change

    def b_noise(self) -> float | None:
        noise = self.trainer.noise if self.trainer is not None else None
        return noise.estimate().b_simple if self.noise and noise is not None else None

    def run_stats(self) -> AllocatorStats | None:
        return None  # tracked steps measure each configuration's peak
