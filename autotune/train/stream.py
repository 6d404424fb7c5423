"""A rank's stream of micro-batches that keeps its place when the micro-batch size changes.

A ``DataLoader`` fixes its batch size: a new one starts the epoch again, so every micro-batch
change in a live run would replay the first samples of the epoch. :class:`ShardStream` draws the
same samples in the same order as ``DataLoader(dataset, batch_size=m, sampler=DistributedSampler(
dataset, num_replicas, rank, seed=seed, drop_last=True), drop_last=True)`` with ``set_epoch(e)``
before epoch ``e`` (the standard data-parallel split: each rank its own shard of every shuffled
epoch), but the micro-batch size is an argument of each draw, and the position (epoch, samples
drawn in it) is kept across draws of different sizes. :class:`IterableStream` does the same for an
``IterableDataset`` in one process: its own order, each pass over it an epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch.utils.data import Dataset, DistributedSampler, IterableDataset, default_collate

from autotune.errors import ConfigError, WorkloadError

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["IterableStream", "ShardStream", "workload_stream"]


def workload_stream(workload: Workload, *, num_replicas: int, rank: int, seed: int) -> ShardStream | IterableStream:
    """The stream of ``workload``'s micro-batches for ``rank`` of ``num_replicas``, with its collate
    (an ``IterableDataset`` only in one process: :func:`autotune.train.base.check_micro_batch`)."""
    if workload.iterable:
        assert num_replicas == 1, "an iterable dataset is refused on ranks before a trainer is built"
        return IterableStream(workload.dataset, collate_fn=workload.collate_fn, name=workload.name)  # type: ignore[arg-type]
    return ShardStream(
        workload.dataset, num_replicas=num_replicas, rank=rank, seed=seed, collate_fn=workload.collate_fn
    )


class ShardStream:
    """Micro-batches from one rank's shard of each shuffled epoch, collated as a DataLoader does."""

    def __init__(
        self,
        dataset: Dataset[Any],
        *,
        num_replicas: int,
        rank: int,
        seed: int,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.dataset = dataset
        self.collate = collate_fn or default_collate
        self._sampler: DistributedSampler[Any] = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, seed=seed, drop_last=True
        )
        self.epoch = 0
        self.offset = 0  # samples of this epoch's shard drawn so far
        self._indices = self._shard(0)

    @property
    def shard_size(self) -> int:
        """Samples per epoch in this rank's shard."""
        return len(self._indices)

    def state_dict(self) -> dict[str, int]:
        """The position: the epoch and the samples of its shard drawn so far."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from :meth:`state_dict`'s position: the samples an uninterrupted run draws next."""
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._indices = self._shard(self.epoch)

    def _shard(self, epoch: int) -> list[int]:
        self._sampler.set_epoch(epoch)
        return list(self._sampler)

    def next(self, micro_batch_size: int) -> Any:
        """The next ``micro_batch_size`` samples, collated; the rest of an epoch too short for a
        whole micro-batch is dropped (``drop_last``), as the DataLoader drops it."""
        if not 1 <= micro_batch_size <= self.shard_size:
            raise ConfigError(
                f"the micro-batch size must be in [1, {self.shard_size}] (this rank's shard of the dataset), "
                f"but got {micro_batch_size}."
            )
        if self.offset + micro_batch_size > self.shard_size:
            self.epoch += 1
            self.offset = 0
            self._indices = self._shard(self.epoch)
        chosen = self._indices[self.offset : self.offset + micro_batch_size]
        self.offset += micro_batch_size
        # What the DataLoader's map-style fetcher does: __getitems__ when the dataset has it.
        getitems = getattr(self.dataset, "__getitems__", None)
        samples = getitems(chosen) if getitems is not None else [self.dataset[i] for i in chosen]
        return self.collate(samples)


class IterableStream:
    """Micro-batches from an ``IterableDataset`` in its own order, collated as a DataLoader does
    (no workers); each pass over it is an epoch, whose rest too short for a micro-batch is dropped."""

    def __init__(
        self, dataset: IterableDataset[Any], *, collate_fn: Callable[[list[Any]], Any] | None = None, name: str = "?"
    ) -> None:
        self.dataset = dataset
        self.collate = collate_fn or default_collate
        self.name = name
        self.epoch = 0
        self.offset = 0  # samples of this pass drawn so far
        self._samples: Iterator[Any] = iter(dataset)

    def state_dict(self) -> dict[str, int]:
        """The position: the pass and the samples of it drawn so far."""
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from :meth:`state_dict`'s position (cost: the pass is read up to it again)."""
        self.epoch, self.offset = state["epoch"], state["offset"]
        self._samples = iter(self.dataset)
        for _ in range(self.offset):
            next(self._samples)

    def next(self, micro_batch_size: int) -> Any:
        """The next ``micro_batch_size`` samples, collated."""
        samples: list[Any] = []
        restarted = False
        while len(samples) < micro_batch_size:
            sample = next(self._samples, _END)
            if sample is not _END:
                samples.append(sample)
                self.offset += 1
                continue
            if restarted:  # a whole pass held fewer samples than one micro-batch: it would never end
                raise WorkloadError(
                    f"workload {self.name!r}: a micro-batch of {micro_batch_size} samples must fit in one pass over "
                    f"its IterableDataset, but a pass yielded {len(samples)}."
                )
            self.epoch += 1
            self._samples, samples, restarted, self.offset = iter(self.dataset), [], True, 0
        return self.collate(samples)


_END = object()
