"""The user's own batches: any pytree of tensors that share a leading batch dimension.

``Adaptive.step(batch)`` trains whatever the user's DataLoader yields (a padding collate, a custom
sampler, workers, an ``IterableDataset``) at the effective batch size, and splits it into the
configuration's micro-batches itself, as MosaicML Composer does for
``device_train_microbatch_size="auto"``. A batch is a tensor, or a ``Mapping`` (a dict, Hugging
Face's ``BatchEncoding``, which is a ``UserDict`` and no pytree node of torch's), tuple (named
too) or list of batches. A list or tuple that holds no tensor is a field of one entry per
sample (the names or ids a collate keeps beside the tensors): it must be as long as the batch,
and is split with the tensors, as Hugging Face's and Lightning's batch splitting do. A string,
a number or None is shared by every micro-batch unchanged. Anything else (a list of another
length, a NumPy array, any other object) cannot be split by sample: the batch is refused, with
the field named, rather than every micro-batch getting all of it.
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from autotune.errors import BatchError

__all__ = ["batch_size", "map_tensors", "sample_of", "select_rows", "split_batch", "tensors_of"]


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], batch: Any) -> Any:
    """``batch`` with ``fn`` applied to every tensor, each container rebuilt as its own type."""
    return _map(batch, fn, None)


def _map(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor], field: Callable[[Any], Any] | None) -> Any:
    """``batch`` with ``fn`` applied to every tensor and ``field`` (if given) to every per-sample
    field (a list or tuple holding no tensor), each container rebuilt as its own type."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if field is not None and _is_field(batch):
        return field(batch)
    if isinstance(batch, Mapping):
        items = {k: _map(v, fn, field) for k, v in batch.items()}
        if type(batch) is dict or not isinstance(batch, MutableMapping):
            return items
        out = copy.copy(batch)  # a dict subclass or UserDict keeps its class (and its attributes)
        out.update(items)
        return out
    if isinstance(batch, tuple):
        mapped = [_map(v, fn, field) for v in batch]
        return type(batch)(*mapped) if hasattr(batch, "_fields") else type(batch)(mapped)
    if isinstance(batch, list):
        return [_map(v, fn, field) for v in batch]
    return batch


def _is_field(value: Any) -> bool:
    """A list or tuple with no tensor in it: one entry per sample (a container holds tensors)."""
    return isinstance(value, (list, tuple)) and next(_tensors(value, ""), None) is None


def _shared(value: Any) -> bool:
    """A value every sample shares (the batch's mode, a flag): given whole to each micro-batch."""
    return value is None or isinstance(value, (str, bytes, numbers.Number))


def _fields(batch: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Every non-tensor leaf of ``batch`` (a per-sample field is one leaf) with its path."""
    if isinstance(batch, torch.Tensor):
        return
    if _is_field(batch) or not isinstance(batch, (Mapping, tuple, list)):
        yield path, batch
    elif isinstance(batch, Mapping):
        for k, v in batch.items():
            yield from _fields(v, f"{path}[{k!r}]")
    else:
        for i, v in enumerate(batch):
            yield from _fields(v, f"{path}[{i}]")


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
        BatchError: no tensor, a 0-dim tensor, an empty batch, two leading sizes, a field that
            cannot be split by sample (a list or tuple of another length, any object other than
            a number, a string or None), or a packed batch.
    """
    if isinstance(batch, Mapping) and _packed(batch):
        raise BatchError(
            "a packed batch (several sequences in one row, told apart by position_ids or cu_seq_lens_q: "
            "TRL's packing=True or padding_free=True, transformers' DataCollatorWithFlattening) has no sample "
            "to split or profile by: train on padded batches (packing=False, padding_free=False)."
        )
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
    for path, value in _fields(batch, "batch"):
        if _is_field(value) and len(value) != first[1]:
            raise BatchError(
                f"a list or tuple in a batch must hold one entry per sample ({first[1]}, as {first[0]}) to be "
                f"split with the tensors, but {path} has {len(value)}."
            )
        if not _is_field(value) and not _shared(value):
            raise BatchError(
                "a batch's fields must be tensors, lists or tuples of one entry per sample, or values every "
                f"sample shares (a number, a string, None), but {path} is a {type(value).__name__}."
            )
    return first[1]


def _packed(batch: Mapping[Any, Any]) -> bool:
    """Whether ``batch`` is packed: flash-attention's sequence boundaries, or one row whose
    ``position_ids`` restart (a padded batch's rows each start at 0 once)."""
    if "cu_seq_lens_q" in batch:
        return True
    from torch._subclasses.fake_tensor import FakeTensor

    positions = batch.get("position_ids")
    return (
        isinstance(positions, torch.Tensor)
        and not isinstance(positions, FakeTensor)  # no values: the real batch it stands for was checked
        and positions.device.type != "meta"
        and positions.dim() == 2
        and positions.shape[0] == 1
        and int((positions[0, 1:] == 0).sum()) > 0
    )


def split_batch(batch: Any, micro_batch_size: int) -> list[tuple[Any, int]]:
    """``batch`` as consecutive micro-batches of ``micro_batch_size`` samples (the last one
    shorter when it does not divide), each with its number of samples; views, no copy.

    The per-sample lists and tuples are split with the tensors (entries ``start:start + size``);
    numbers, strings and None go whole to every micro-batch.

    Raises:
        BatchError: as :func:`batch_size`.
    """
    n = batch_size(batch)

    def part(start: int) -> Any:
        stop = start + micro_batch_size
        return _map(batch, lambda t: t[start:stop], lambda f: f[start:stop])

    return [(part(start), min(micro_batch_size, n - start)) for start in range(0, n, micro_batch_size)]


def select_rows(batch: Any, index: torch.Tensor) -> Any:
    """The samples of ``batch`` at ``index`` (a 1-dim integer tensor, rows may repeat), the
    per-sample lists and tuples with the tensors.

    Raises:
        BatchError: as :func:`batch_size`.
    """
    batch_size(batch)  # a field that cannot follow the rows is refused, as by split_batch
    rows = index.tolist()

    def field(f: Any) -> Any:
        picked = [f[i] for i in rows]
        return tuple(picked) if isinstance(f, tuple) else picked

    return _map(batch, lambda t: t[index.to(t.device)], field)


def sample_of(batch: Any, i: int) -> Any:
    """Sample ``i`` of ``batch`` as a dataset item: each tensor's row ``i`` (without the batch
    dimension), each per-sample list's entry ``i``; what a collate stacks back into a batch."""
    return _map(batch, lambda t: t[i], lambda f: f[i])
