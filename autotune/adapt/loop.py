"""The local Trainer on the user's own model and optimizer, with a data stream that keeps its place."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from autotune.config import TrainConfig
from autotune.train.local import Trainer
from autotune.train.stream import ShardStream
from autotune.workload import Workload

__all__ = ["InPlaceTrainer"]


class InPlaceTrainer(Trainer):
    """:class:`Trainer` over the user's objects, trained in place.

    A ``DataLoader`` fixes its batch size, so the base trainer starts a new shuffled epoch at every
    micro-batch change; here every micro-batch is drawn from one :class:`ShardStream` (one rank),
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
        self.stream = ShardStream(workload.dataset, num_replicas=1, rank=0, seed=config.seed)
        super().__init__(workload, config, model=model, optimizer=optimizer, device=device, track_noise=track_noise)

    def _batch_stream(self, micro_batch_size: int, seed: int) -> Iterator[Any]:
        while True:  # lazy: draws only when a step asks, so a reconfiguration loses no samples
            yield self.stream.next(micro_batch_size)
