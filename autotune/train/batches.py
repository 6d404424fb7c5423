"""The user's own batches: any pytree of tensors that share a leading batch dimension.

``Adaptive.step(batch)`` trains whatever the user's DataLoader yields (a padding collate, a custom
sampler, workers, an ``IterableDataset``) at the effective batch size, and splits it into the
configuration's micro-batches itself, as MosaicML Composer does for
``device_train_microbatch_size="auto"``. A batch is a tensor, or a ``Mapping`` (a dict, Hugging
Face's ``BatchEncoding``, which is a ``UserDict`` and no pytree node of torch's), tuple (named
too) or list of batches; any other leaf (a string, a number, None) is shared by every
micro-batch unchanged.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from autotune.errors import BatchError

__all__ = ["batch_size", "map_tensors", "split_batch", "tensors_of"]


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor, each container rebuilt as its own type."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        items = {k: map_tensors(fn, v) for k, v in batch.items()}
        if type(batch) is dict or not isinstance(batch, MutableMapping):
            return items
        out = copy.copy(batch)  # a dict subclass or UserDict keeps its class (and its attributes)
        out.update(items)
        return out
    if isinstance(batch, tuple):
        mapped = [map_tensors(fn, v) for v in batch]
        return type(batch)(*mapped) if hasattr(batch, "_fields") else type(batch)(mapped)
    if isinstance(batch, list):
        return [map_tensors(fn, v) for v in batch]
    return batch


def _tensors(batch: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, Mapping):
        for k, v in batch.items():
            yield from _tensors(v, f"{path}[{k!r}]")
    elif isinstance(batch, (tuple, list)):
        for i, v in enumerate(batch):
            yield from _tensors(v, f"{path}[{i}]")


def tensors_of(batch: Any) -> list[torch.Tensor]:
    """Every tensor of ``batch``, in its containers' order."""
    return [t for _, t in _tensors(batch, "batch")]


def batch_size(batch: Any) -> int:
    """The samples in ``batch``: the leading size its tensors share.

    Raises:
        BatchError: no tensor, a 0-dim tensor, an empty batch, or two leading sizes.
    """
    first: tuple[str, int] | None = None
    for path, tensor in _tensors(batch, "batch"):
        if tensor.dim() == 0:
            raise BatchError(f"every tensor of a batch must have a leading batch dimension, but {path} is 0-dim.")
        if first is None:
            first = (path, tensor.shape[0])
        elif tensor.shape[0] != first[1]:
            raise BatchError(
                f"every tensor of a batch must have the same leading (batch) size, but {first[0]} has "
                f"{first[1]} and {path} has {tensor.shape[0]}."
            )
    if first is None:
        raise BatchError(f"a batch must hold at least one tensor, but got {type(batch).__name__}.")
    if first[1] == 0:
        raise BatchError(f"a batch must hold at least one sample, but {first[0]} has leading size 0.")
    return first[1]


def split_batch(batch: Any, micro_batch_size: int) -> list[tuple[Any, int]]:
    """``batch`` as consecutive micro-batches of ``micro_batch_size`` samples (the last one
    shorter when it does not divide), each with its number of samples; views, no copy."""
    n = batch_size(batch)

    def part(start: int) -> Any:
        return map_tensors(lambda t: t[start : start + micro_batch_size], batch)

    return [(part(start), min(micro_batch_size, n - start)) for start in range(0, n, micro_batch_size)]
