"""The Measurement record: everything a configuration cost, as plain data with JSON round-trip."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from autotune.config import TrainConfig
from autotune.measurement.cuda_memory import AllocatorStats
from autotune.measurement.objective import GIB, per_gib
from autotune.train.gns import NoiseEstimate

__all__ = ["Measurement", "MemoryBreakdown", "RankResult", "Status", "GIB"]

#: The fields of :class:`MemoryBreakdown`, in display order (subclasses add non-byte fields).
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "buffers", "other")
Status = Literal["ok", "over_budget", "oom", "diverged"]


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Tensor bytes by category at the moment of peak total, on one device of one rank.

    Counted by storage (``MemTracker``), so identical from run to run.

    Attributes:
        parameters: Bytes of the model's parameters.
        gradients: Bytes of their gradients.
        optimizer_state: Bytes of the optimizer's state (Adam's moments, step counters).
        activations: The input batch and what autograd saves for backward.
        temporaries: Tensors created during backward.
        buffers: The model's buffers (batch-norm statistics and the like).
        other: Anything tracked that fits no category.

    Example:
        >>> from autotune import MemoryBreakdown
        >>> b = MemoryBreakdown(parameters=400, gradients=400, optimizer_state=800, activations=1000,
        ...                     temporaries=24, buffers=0, other=0)
        >>> b.total, b.model_states
        (2624, 1600)
    """

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    buffers: int
    other: int

    @property
    def total(self) -> int:
        """Every category's bytes: the peak total itself."""
        return sum(getattr(self, name) for name in MEMORY_CATEGORIES)

    @property
    def model_states(self) -> int:
        """Parameters + gradients + optimizer state: what ZeRO partitions."""
        return self.parameters + self.gradients + self.optimizer_state


@dataclass(frozen=True, kw_only=True)
class RankResult:
    """What one data-parallel rank of a multi-rank (DeepSpeed) measurement cost.

    Attributes:
        rank: The rank's index, 0-based.
        throughput: Samples/s of this rank, median over the timed steps (None if not timed).
        step_seconds: Median seconds of a timed step.
        memory: As in :class:`Measurement`, for this rank.
        category_peaks: As in :class:`Measurement`, for this rank.
        resident: What the rank holds *between* optimizer steps (counted just before the
            tracked step): parameters, optimizer state and DeepSpeed's buffers, i.e. what ZeRO
            partitions.
        device_peak_bytes: ``torch.cuda.max_memory_allocated`` on CUDA, else None.
        allocator: This rank's caching allocator peaks on CUDA, else None.

    Example:
        >>> from autotune import MemoryBreakdown, RankResult
        >>> memory = MemoryBreakdown(parameters=400, gradients=400, optimizer_state=800, activations=1000,
        ...                          temporaries=24, buffers=0, other=0)
        >>> rank = RankResult(rank=1, throughput=52.0, step_seconds=0.31, memory=memory, category_peaks=memory,
        ...                   resident=None, device_peak_bytes=None)
        >>> rank.peak_bytes
        2624
    """

    rank: int
    throughput: float | None  # samples/s of this rank, median over the timed steps
    step_seconds: float | None  # median
    memory: MemoryBreakdown | None
    category_peaks: MemoryBreakdown | None
    resident: MemoryBreakdown | None
    device_peak_bytes: int | None
    allocator: AllocatorStats | None = None  # this rank's caching allocator on CUDA, else None

    @property
    def peak_bytes(self) -> int | None:
        """The rank's peak tensor bytes (``memory.total``), None if not measured."""
        return None if self.memory is None else self.memory.total

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankResult:
        """The record as :meth:`Measurement.to_dict` writes it in ``per_rank``."""
        d = dict(data)
        for key in ("memory", "category_peaks", "resident"):
            d[key] = None if d[key] is None else MemoryBreakdown(**d[key])
        d["allocator"] = _allocator(d.get("allocator"))
        return cls(**d)


def _allocator(data: dict[str, Any] | None) -> AllocatorStats | None:
    """Records written before the allocator was read have no such key: None, as on the CPU."""
    return None if data is None else AllocatorStats(**data)


@dataclass(frozen=True, kw_only=True)
class Measurement:
    """What one configuration of one workload cost, measured on the real training loop.

    Returned by :func:`autotune.measure`; plain data with a JSON round-trip (:meth:`to_json`,
    :meth:`from_dict`). The per-category figures (``memory``, ``category_peaks``) are tracked
    tensor bytes on every device: the CUDA allocator keeps no categories, only totals.

    Attributes:
        workload: The workload's name.
        config: The configuration measured.
        device: Where it ran (``"cpu"``, ``"cuda:0"``).
        status: ``"ok"``, or why the configuration is infeasible: ``"over_budget"`` (peak above
            ``memory_budget``; throughput is then not measured), ``"oom"`` (the allocator
            failed), ``"diverged"`` (non-finite loss).
        reason: One line saying more when ``status`` is not ``"ok"``, else None.
        warmup: Untimed steps asked for.
        steps: Timed steps asked for.
        throughput: Samples/s, median over the timed steps (None when not timed).
        throughput_p25: 25th percentile of the timed steps' samples/s.
        throughput_p75: 75th percentile of the timed steps' samples/s.
        step_seconds: Median seconds of a timed optimizer step.
        memory: Bytes by category at the moment of peak total (sums to the peak).
        category_peaks: Each category's own maximum over the tracked step.
        device_peak_bytes: ``torch.cuda.max_memory_allocated`` on CUDA
            (``allocator.allocated_peak``), else None.
        memory_budget: The budget in bytes it was measured against, or None.
        noise: The gradient noise statistics of the untimed steps.
        losses: Every optimizer step's mean loss, warmup included.
        loss_slope: Per optimizer step, of the EMA-smoothed loss.
        overflow_steps: fp16 steps skipped by the loss scaler.
        lr: Learning rate at the last step.
        per_rank: One entry per data-parallel rank when the DeepSpeed runner measured it
            (``zero_stage > 0`` or ``ranks > 1``), else empty; ``memory`` is then the rank with
            the highest peak.
        deepspeed_config: The config DeepSpeed ran with (``deepspeed.initialize(config=...)``),
            None on the local runner: what ``autotune best --format deepspeed`` exports for this
            configuration, byte for byte.
        allocator: On CUDA, the caching allocator's peaks over the tracked step (of the rank with
            the highest reserved peak): ``reserved_peak`` is what a device budget is checked
            against (with :data:`~autotune.measurement.cuda_memory.RESERVED_HEADROOM`),
            ``alloc_retries`` how often the allocator had to free its cache to go on. None off CUDA.

    Example:
        >>> import json
        >>> from autotune import Measurement, TrainConfig, load_workload, measure
        >>> m = measure(load_workload("mlp-digits"), TrainConfig(micro_batch_size=8), steps=1, warmup=1)
        >>> m.ok, m.peak_bytes == m.memory.total, m.throughput_per_gib > 0
        (True, True, True)
        >>> Measurement.from_dict(json.loads(m.to_json())) == m
        True
    """

    workload: str
    config: TrainConfig
    device: str
    status: Status
    reason: str | None
    warmup: int
    steps: int
    throughput: float | None  # samples/s, median over the timed steps
    throughput_p25: float | None
    throughput_p75: float | None
    step_seconds: float | None  # median
    memory: MemoryBreakdown | None  # at the moment of peak total (sums to the peak)
    category_peaks: MemoryBreakdown | None  # each category's own maximum over the tracked step
    device_peak_bytes: int | None  # torch.cuda.max_memory_allocated on CUDA (allocator.allocated_peak), else None
    memory_budget: int | None
    noise: NoiseEstimate
    losses: tuple[float, ...]  # every optimizer step's mean loss, warmup included
    loss_slope: float | None  # per optimizer step, of the EMA-smoothed loss
    overflow_steps: int  # fp16 steps skipped by the loss scaler
    lr: float  # learning rate at the last step
    # One entry per data-parallel rank when the DeepSpeed runner measured it (zero_stage > 0 or
    # ranks > 1), else empty. ``memory`` above is then the rank with the highest peak.
    per_rank: tuple[RankResult, ...] = ()
    # The config DeepSpeed ran with (``deepspeed.initialize(config=...)``), None on the local runner:
    # what ``autotune best --format deepspeed`` exports for this TrainConfig, byte for byte.
    deepspeed_config: dict[str, Any] | None = None
    allocator: AllocatorStats | None = None

    @property
    def ok(self) -> bool:
        """Whether the configuration ran (``status == "ok"``)."""
        return self.status == "ok"

    @property
    def peak_bytes(self) -> int | None:
        """Peak tracked tensor bytes (``memory.total``), None when nothing was measured."""
        return None if self.memory is None else self.memory.total

    @property
    def reserved_bytes(self) -> int | None:
        """The CUDA caching allocator's reserved peak (None off CUDA): what runs out on a GPU."""
        return None if self.allocator is None else self.allocator.reserved_peak

    @property
    def throughput_per_gib(self) -> float | None:
        """Samples/s per GiB of peak tensor memory: the quantity autotune maximizes."""
        if self.throughput is None or not self.peak_bytes:
            return None
        return per_gib(self.throughput, self.peak_bytes)

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values, plus ``peak_bytes``, ``reserved_bytes`` and ``throughput_per_gib``."""
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["losses"] = list(self.losses)
        d["per_rank"] = [asdict(r) for r in self.per_rank]
        d["peak_bytes"] = self.peak_bytes
        d["reserved_bytes"] = self.reserved_bytes
        d["throughput_per_gib"] = self.throughput_per_gib
        return d

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """The record :meth:`to_dict` wrote (its derived keys are skipped; older records lack ``allocator``)."""
        d = {k: v for k, v in data.items() if k in {f.name for f in fields(cls)}}
        d["config"] = TrainConfig.from_dict(d["config"])
        for key in ("memory", "category_peaks"):
            d[key] = None if d[key] is None else MemoryBreakdown(**d[key])
        d["noise"] = NoiseEstimate(**d["noise"])
        d["losses"] = tuple(d["losses"])
        d["per_rank"] = tuple(RankResult.from_dict(r) for r in d.get("per_rank", ()))
        d["allocator"] = _allocator(d.get("allocator"))
        return cls(**d)
