"""The largest batch a workload's data can produce: what the memory model profiles at.

With variable-length data (a padding collate, sequences of different lengths) a configuration
chosen on the first batch can run out of memory on the longest one later: the batch-size finders
users know fail exactly this way (Lightning's BatchSizeFinder and Hugging Face's
``auto_find_batch_size`` never see the worst-case batch; lhotse #231 and OpenNMT-tf #806 ask for
a "pessimistic" longest batch). So the memory model's profile runs on the largest batch by bytes
per sample, found in one of three ways, and every prediction says which
(:attr:`WorstCase.describe`):

* **declared**: ``Workload.worst_case_batch``, a batch as the collate yields it at the longest
  shapes the data can produce;
* **scanned**: a map-style dataset's first ``Workload.scan_batches`` batches (default
  :data:`autotune.workload.SCAN_BATCHES`) at the reference batch size, in dataset order,
  collated but never run (shapes only, no forward);
* **first batch only**: an ``IterableDataset`` is not scanned (reading it may be a pass over a
  stream), nor is anything with ``scan_batches=0``; an adaptive run's per-step guard
  (:mod:`autotune.adapt.shape_guard`) then checks every batch longer than any seen before it runs.

A micro-batch of ``m`` samples at the worst case is ``m`` rows of the worst batch, cycled: each
row keeps the batch's padded length, so every sample of it is as long as the longest.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch.utils.data import Dataset

from autotune.batches import batch_size, sample_of, select_rows, tensors_of

if TYPE_CHECKING:  # for types only: Workload.worst_case imports this module, never the reverse
    from autotune.workload import Workload

__all__ = [
    "WorstCase",
    "at_worst_case",
    "find_worst_case",
    "profile_batch",
    "sample_bytes",
    "take_rows",
]


@dataclass(frozen=True, kw_only=True)
class WorstCase:
    """The batch the memory model profiles at, and how it was found.

    ``batch``: the largest batch by bytes per sample (the first batch at the reference batch size
    when it is not scanned). ``how``: ``"declared"``, ``"scanned"`` or ``"first batch"``. ``scanned``: batches
    scanned, of ``batches`` in an epoch (None: unknown). ``longest``: the 0-based index of the
    longest scanned batch (the first of equals). ``why``: why only the first batch counts.
    ``uniform``: every scanned batch had the worst case's bytes per sample (data of one shape, as
    far as the scan saw): any step, not only one at the worst case, runs at the profile's shapes.
    """

    batch: Any
    how: Literal["declared", "scanned", "first batch"]
    sample_bytes: int
    scanned: int = 0
    batches: int | None = None
    longest: int | None = None
    why: str = ""
    uniform: bool = False

    def describe(self) -> str:
        """E.g. ``"scanned 8 batches (the whole epoch), longest at batch 6"``."""
        if self.how == "declared":
            return "worst case: declared (Workload.worst_case_batch)"
        if self.how == "first batch":
            return f"worst case: first batch only ({self.why})"
        whole = " (the whole epoch)" if self.scanned == self.batches else f" of {self.batches}"
        return f"worst case: scanned {self.scanned} batches{whole}, longest at batch {self.longest}"


def sample_bytes(batch: Any) -> int:
    """Bytes per sample of ``batch``: its tensors' bytes over its leading size (a padded batch of
    longer sequences has more). Raises :class:`~autotune.errors.BatchError` for a malformed batch."""
    n = batch_size(batch)
    return sum(t.numel() * t.element_size() for t in tensors_of(batch)) // n


def take_rows(batch: Any, m: int) -> Any:
    """``m`` rows of ``batch``, cycling through its rows: a micro-batch at its shapes."""
    return select_rows(batch, torch.arange(m) % batch_size(batch))


def find_worst_case(workload: Workload) -> WorstCase:
    """The workload's worst case (see the module docstring); cost: collating up to
    ``workload.scan_batches`` batches once (:attr:`Workload.worst_case` caches it)."""
    declared = workload.worst_case_batch
    if declared is not None:
        return WorstCase(batch=declared, how="declared", sample_bytes=sample_bytes(declared))
    if workload.iterable or workload.scan_batches == 0:
        # The first batch at the reference size, not at each micro-batch size: a padding collate
        # pads 2 samples and 4 to different lengths, and the profile's two sizes must share shapes.
        first = workload.first_batch(workload.batch_size)
        why = (
            "an IterableDataset is not scanned: declare Workload.worst_case_batch"
            if workload.iterable
            else ("scan_batches=0")
        )
        return WorstCase(batch=first, how="first batch", sample_bytes=sample_bytes(first), why=why)
    batches = math.ceil(len(workload.dataset) / workload.batch_size)  # type: ignore[arg-type]
    best: tuple[int, int, Any] | None = None
    scanned = 0
    sizes = set()
    for k, batch in enumerate(itertools.islice(workload.loader(workload.batch_size), workload.scan_batches)):
        scanned += 1
        size = sample_bytes(batch)
        sizes.add(size)
        if best is None or size > best[0]:
            best = (size, k, batch)
    assert best is not None, "a map-style Workload has at least one sample"
    return WorstCase(
        batch=best[2],
        how="scanned",
        sample_bytes=best[0],
        scanned=scanned,
        batches=batches,
        longest=best[1],
        uniform=len(sizes) == 1,
    )


def profile_batch(workload: Workload, m: int) -> Any:
    """A micro-batch of ``m`` samples at the workload's worst case: what every fake-tensor profile,
    structure finder and real check step runs on.

    The first ``m`` samples when they are already as large per sample as the worst case (fixed
    shapes: the same batch as before there was a worst case), else ``m`` rows of the worst batch.
    """
    first = workload.first_batch(m)
    worst = workload.worst_case
    if sample_bytes(first) >= worst.sample_bytes:
        return first
    return take_rows(worst.batch, m)


def at_worst_case(workload: Workload, samples: int) -> Workload:
    """``workload`` drawing only worst-case samples for a step of ``samples`` samples: the real
    check steps (:func:`autotune.memory.check.verify_profile`) measure what the profile predicts.

    ``workload`` itself when its first ``samples`` are already as large per sample as the worst
    case and the step draws such samples too (an ``IterableDataset``, which the loop reads in
    order, or data of one shape: :attr:`WorstCase.uniform`); else a copy whose dataset is
    the worst batch's rows (cycled to at least ``samples``), collated by stacking them, so the
    training loop draws and collates them as it does any data. A map-style dataset is shuffled by
    the loop: its first samples are not the ones a step draws (a check of padded sequences measured
    a shorter batch than it predicted, 34% under).
    """
    worst = workload.worst_case
    if (workload.iterable or worst.uniform) and sample_bytes(workload.first_batch(samples)) >= worst.sample_bytes:
        return workload
    rows = _Rows(worst.batch, max(samples, batch_size(worst.batch)))
    at_rows = dataclasses.replace(workload, dataset=rows, collate_fn=None, worst_case_batch=worst.batch)
    # The same loss on the same model: its weighting (measured once, autotune.loss_items) carries over.
    vars(at_rows)["loss_weighting"] = workload.loss_weighting
    return at_rows


class _Rows(Dataset[Any]):
    """The rows of a collated batch as samples (item ``i`` is row ``i`` modulo its size), each at
    the batch's padded shapes: the default collate stacks them back into such a batch."""

    def __init__(self, batch: Any, length: int) -> None:
        self.batch, self.rows, self.length = batch, batch_size(batch), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Any:
        return sample_of(self.batch, index % self.rows)
