"""``measure``: run the real training loop under a config and report exactly what it costs.

One schedule for every backend (:class:`Schedule`): ``warmup`` untimed steps, one step under
exact memory tracking, then ``steps`` timed steps. It runs in this process over the local
:class:`~autotune.train.local.Trainer`, and in each DeepSpeed rank over a
:class:`~autotune.train.zero.ZeroTrainer` (:mod:`autotune.procs.session_worker`); either way it ends
in a :class:`RankReport`, and :func:`assemble` turns the reports of one config (one, or one per
rank) into the :class:`~autotune.measurement.record.Measurement`: the one place it is built.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, ConfigError, TrainingError, UnsupportedError
from autotune.measurement.admission import admission
from autotune.measurement.cuda_memory import (
    RESERVED_HEADROOM,
    AllocatorStats,
    StatsSource,
    allocator_source,
)
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement, MemoryBreakdown, RankResult, Status
from autotune.measurement.sidebyside import settled
from autotune.measurement.tracker import TrackedStep, tracked_step
from autotune.measurement.trend import loss_slope
from autotune.train.base import BaseTrainer, StepResult
from autotune.train.gns import NoiseEstimate
from autotune.train.local import Trainer

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["ProgressFn", "RankReport", "Schedule", "assemble", "check_measure_args", "measure_local"]


def measure_local(
    workload: Workload,
    config: TrainConfig,
    *,
    steps: int = 8,
    warmup: int = 2,
    memory_budget: int | None = None,
    device: str | None = None,
    progress: ProgressFn | None = None,
) -> Measurement:
    """Train ``workload`` under ``config`` and measure throughput, memory, noise and loss.

    Order: ``warmup`` untimed steps, more (up to 4) until two successive ones agree within 10%
    (:data:`autotune.measurement.sidebyside.SETTLED`; they create the optimizer state and, with
    ``grad_accum_steps == 1``, run as two half micro-batches to feed the noise estimate), one
    step under exact memory tracking, then ``steps`` timed steps (skipped when the peak exceeds
    ``memory_budget``). Each step is a real optimizer step on a private copy of the model.

    Infeasible configurations are results, not exceptions: ``status`` is ``over_budget``,
    ``oom`` or ``diverged``. Any other failure inside training raises :class:`TrainingError`
    (original chained), so a caller can mark the configuration failed and go on.

    One process: ``zero_stage > 0`` or ``ranks > 1`` is refused (:class:`UnsupportedError`).
    :func:`autotune.measure` (:func:`autotune.procs.measure.measure`) runs those on their
    DeepSpeed ranks and the rest here: the measurement home does not reach up to the processes.
    """
    check_measure_args(steps=steps, warmup=warmup, memory_budget=memory_budget)
    if config.on_deepspeed:
        raise UnsupportedError(
            "measure_local runs one process: a DeepSpeed configuration is measured on its ranks by "
            f"autotune.measure, but got {config.describe()}."
        )
    # A copy measured, not trained for its weights: every step updates, as the cost it measures does.
    trainer = Trainer(workload, config, device=device, skip_nonfinite=False)
    schedule = Schedule(
        trainer,
        steps=steps,
        warmup=warmup,
        memory_budget=memory_budget,
        progress=progress,
        tracked_step=lambda: tracked_step(trainer),
    )
    try:
        status, reason = schedule.execute()
    except AutotuneError:
        raise
    except Exception as e:
        if not is_out_of_memory(e):
            raise TrainingError(
                f"training {workload.name!r} failed under {config.describe()}: {type(e).__name__}: {e}"
            ) from e
        status, reason = "oom", f"out of memory: {str(e).splitlines()[0]}"
    finally:
        trainer.close()
    return assemble(
        workload.name,
        config,
        device=str(trainer.device),
        warmup=warmup,
        steps=steps,
        memory_budget=memory_budget,
        reports=[schedule.report(status, reason)],
        noise=trainer.gns.estimate(),
    )


def check_measure_args(*, steps: int, warmup: int, memory_budget: int | None) -> None:
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"measure: steps must be an int >= 1, but got {steps!r}.")
    if not isinstance(warmup, int) or warmup < 1:
        # One warmup step at least: optimizer state is created lazily by the first step, and
        # the memory-tracked step must see it.
        raise ConfigError(f"measure: warmup must be an int >= 1, but got {warmup!r}.")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise ConfigError(f"measure: memory_budget must be a positive number of bytes, but got {memory_budget!r}.")


@dataclass(frozen=True, kw_only=True)
class RankReport:
    """What one process measured of one config: the local process, or one DeepSpeed rank.

    Plain data with a JSON round-trip: ranks send it to the parent as a file, never a pickle.
    """

    rank: int
    status: Status
    reason: str | None
    losses: tuple[float, ...]  # every step's loss (over all ranks), warmup included
    timed_samples: tuple[int, ...]  # this rank's samples in each timed step
    timed_seconds: tuple[float, ...]
    lr: float
    overflow_steps: int
    resident: MemoryBreakdown | None  # held between steps (ranks only)
    at_peak: MemoryBreakdown | None  # at the moment of the peak total of the tracked step
    category_peaks: MemoryBreakdown | None
    device_peak_bytes: int | None
    deepspeed_config: dict[str, Any] | None = None  # what the engine ran with (ranks only)
    warmup_steps: int = 0  # untimed steps run (``warmup``, more while step times had not settled)
    allocator: AllocatorStats | None = None  # the CUDA caching allocator over the tracked step

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> RankReport:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankReport:
        d = dict(data)
        for key in ("resident", "at_peak", "category_peaks"):
            d[key] = None if d[key] is None else MemoryBreakdown(**d[key])
        for key in ("losses", "timed_samples", "timed_seconds"):
            d[key] = tuple(d[key])
        d["allocator"] = None if d.get("allocator") is None else AllocatorStats(**d["allocator"])
        return cls(**d)


class Schedule:
    """warmup steps, one memory-tracked step, timed steps, over any trainer.

    State survives a failure: after an OOM or a divergence, :meth:`report` still says what was
    measured before it. On ranks every step's loss and ``worst_peak`` are the same on every rank
    (all-reduced), so every rank takes the same verdict: no rank leaves the schedule while the
    others wait in a collective.

    On CUDA (``allocator``: the trainer's device's caching allocator unless given; the tests give a
    fake one) the tracked step is also read from the allocator, and the budget must hold its
    reserved peak plus :data:`~autotune.measurement.cuda_memory.RESERVED_HEADROOM`: the reserved
    segments are what runs out on a GPU, not the live tensors.
    """

    def __init__(
        self,
        trainer: BaseTrainer,
        *,
        steps: int,
        warmup: int,
        memory_budget: int | None,
        tracked_step: Callable[[], TrackedStep],
        progress: ProgressFn | None = None,
        worst_peak: Callable[[int], int] = lambda peak: peak,
        slowest: Callable[[float], float] = lambda seconds: seconds,
        allocator: StatsSource | None = None,
    ) -> None:
        self.trainer, self.steps, self.warmup, self.memory_budget = trainer, steps, warmup, memory_budget
        self.tracked_step, self.progress, self.worst_peak = tracked_step, progress, worst_peak
        self.slowest = slowest
        self.results: list[StepResult] = []
        self.timed: list[StepResult] = []
        self.tracked: TrackedStep | None = None
        self.warmed = 0  # untimed steps run before the tracked one
        self.allocator = allocator_source(trainer.device) if allocator is None else allocator
        self.allocator_stats: AllocatorStats | None = None

    def _record(self, result: StepResult) -> bool:
        self.results.append(result)
        return math.isfinite(result.loss)

    def _diverged(self) -> tuple[Status, str | None]:
        return "diverged", f"loss is {self.results[-1].loss} at step {len(self.results)}"

    def _tick(self, phase: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)

    def execute(self) -> tuple[Status, str | None]:
        t = self.trainer
        split = t.noise_split
        if self.allocator is not None:  # this configuration's peaks alone (StatsSource.release)
            self.allocator.release(t.device)
        # At least ``warmup`` untimed steps and, from two on, more (up to EXTRA_WARMUP) until the
        # last two agree within SETTLED: the first steps of a configuration in a process pay one-time
        # costs (oneDNN kernels compiled per shape and dtype, cuDNN autotuning, allocator
        # growth). On ranks every rank decides on the slowest rank's seconds: the same verdict.
        seconds: list[float] = []
        while len(seconds) < self.warmup + EXTRA_WARMUP:
            if len(seconds) >= self.warmup and (len(seconds) < 2 or settled(seconds[-2], seconds[-1])):
                break
            self._tick("warmup", len(seconds), self.warmup)
            result = t.step(split=split)
            if not self._record(result):
                return self._diverged()
            seconds.append(self.slowest(result.seconds))
        self.warmed = len(seconds)
        self._tick("memory", 0, 1)
        if self.allocator is not None:
            self.allocator.reset_peak_memory_stats(t.device)
        self.tracked = self.tracked_step()
        if self.allocator is not None:
            self.allocator_stats = AllocatorStats.read(self.allocator, t.device)
        if not self._record(self.tracked.result):
            return self._diverged()
        if self.allocator is not None and t.config.compile != "none":
            # The tracked step ran eagerly (Dynamo steps aside under the tracker's dispatch mode):
            # the allocator's peaks are read again over one untracked, compiled step.
            self.allocator.reset_peak_memory_stats(t.device)
            if not self._record(t.step()):
                return self._diverged()
            self.allocator_stats = AllocatorStats.read(self.allocator, t.device)
        verdict = self._over_budget(self.tracked.at_peak.total)
        if verdict is not None:
            return "over_budget", verdict
        for i in range(self.steps):
            self._tick("timed", i, self.steps)
            result = t.step()
            self.timed.append(result)
            if not self._record(result):
                return self._diverged()
        self._tick("timed", self.steps, self.steps)
        return "ok", None

    def _over_budget(self, tracked: int) -> str | None:
        """Why the tracked step does not fit the budget, or None. Every rank calls ``worst_peak``
        the same number of times (it may be a collective)."""
        stats = self.allocator_stats
        peak = self.worst_peak(max(tracked, 0 if stats is None else stats.allocated_peak))
        reserved = None if stats is None else self.worst_peak(stats.reserved_peak)
        budget = self.memory_budget
        if budget is None:
            return None
        # The admission rule on a measured peak (exact: no headroom), allocated bytes first, then
        # on CUDA the reserved ones with the allocator's headroom; the reasons are the schedule's.
        if not admission(budget=budget, headroom=0.0, measured=peak).admitted:
            return f"peak {peak} bytes exceeds the memory budget of {budget} bytes"
        if reserved is None:
            return None
        verdict = admission(budget=budget, headroom=0.0, measured=peak, reserved=reserved)
        if not verdict.admitted:
            return (
                f"reserved peak {reserved} bytes (+{RESERVED_HEADROOM:.0%} headroom: {verdict.needed}) exceeds the "
                f"memory budget of {budget} bytes"
            )
        return None

    def report(self, status: Status, reason: str | None, *, rank: int = 0) -> RankReport:
        tracked = self.tracked
        return RankReport(
            rank=rank,
            status=status,
            reason=reason,
            losses=tuple(r.loss for r in self.results),
            timed_samples=tuple(r.samples for r in self.timed),
            timed_seconds=tuple(r.seconds for r in self.timed),
            lr=self.results[-1].lr if self.results else self.trainer.lr(),
            overflow_steps=sum(r.overflow for r in self.results),
            resident=None if tracked is None else tracked.resident,
            at_peak=None if tracked is None else tracked.at_peak,
            category_peaks=None if tracked is None else tracked.category_peaks,
            device_peak_bytes=None if self.allocator_stats is None else self.allocator_stats.allocated_peak,
            deepspeed_config=self.trainer.deepspeed_config,
            warmup_steps=self.warmed,
            allocator=self.allocator_stats,
        )


#: Untimed steps a measurement may add to its ``warmup`` while successive steps disagree.
EXTRA_WARMUP = 4


#: The noise scale needs each micro-batch gradient, which ZeRO reduces and partitions away.
NO_NOISE = NoiseEstimate(b_simple=None, trace_sigma=None, grad_sq_norm=None, sigma2=None, steps=0)


def assemble(
    workload: str,
    config: TrainConfig,
    *,
    device: str,
    warmup: int,
    steps: int,
    memory_budget: int | None,
    reports: Sequence[RankReport],
    noise: NoiseEstimate = NO_NOISE,
    failure: tuple[Status, str] | None = None,
) -> Measurement:
    """The Measurement of one config from what each process measured (one report, or one per rank).

    A data-parallel step ends on all ranks together (the gradient reduction is a barrier): its
    throughput is the samples of all ranks over the slowest rank's time (with one process: the
    step's samples over its time). Memory is the rank with the highest peak's: what a per-device
    budget must hold. ``failure`` (status, reason) with no reports: a config that never reported
    (its ranks ran out of memory).
    """
    reason: str | None
    if failure is not None:
        assert not reports, "a failure replaces the reports"
        status, reason = failure
    else:
        status, reason = reports[0].status, reports[0].reason
    timed = len(reports[0].timed_seconds) if reports and status == "ok" else 0
    seconds = [max(r.timed_seconds[i] for r in reports) for i in range(timed)]
    rates = [sum(r.timed_samples[i] for r in reports) / seconds[i] for i in range(timed)]
    quartiles = statistics.quantiles(rates, n=4, method="inclusive") if len(rates) >= 2 else rates * 3
    worst = max(reports, key=lambda r: -1 if r.at_peak is None else r.at_peak.total) if reports else None
    first = reports[0] if reports else None
    losses = first.losses if first is not None else ()
    allocators = [r.allocator for r in reports if r.allocator is not None]
    return Measurement(
        workload=workload,
        config=config,
        device=device,
        status=status,
        reason=reason,
        warmup=max([warmup, *(r.warmup_steps for r in reports)]),
        steps=steps,
        throughput=statistics.median(rates) if rates else None,
        throughput_p25=quartiles[0] if rates else None,
        throughput_p75=quartiles[2] if rates else None,
        step_seconds=statistics.median(seconds) if rates else None,
        memory=None if worst is None else worst.at_peak,
        category_peaks=None if worst is None else worst.category_peaks,
        device_peak_bytes=max((r.device_peak_bytes for r in reports if r.device_peak_bytes is not None), default=None),
        memory_budget=memory_budget,
        noise=noise,
        losses=losses,
        loss_slope=loss_slope(losses) if first is not None else None,
        overflow_steps=0 if first is None else first.overflow_steps,
        lr=0.0 if first is None else first.lr,
        per_rank=tuple(_rank_result(r) for r in reports) if config.on_deepspeed else (),
        deepspeed_config=None if first is None else first.deepspeed_config,
        allocator=max(allocators, key=lambda a: a.reserved_peak) if allocators else None,
    )


def _rank_result(r: RankReport) -> RankResult:
    rates = [n / s for n, s in zip(r.timed_samples, r.timed_seconds, strict=True)]
    return RankResult(
        rank=r.rank,
        throughput=statistics.median(rates) if rates else None,
        step_seconds=statistics.median(r.timed_seconds) if rates else None,
        memory=r.at_peak,
        category_peaks=r.category_peaks,
        resident=r.resident,
        device_peak_bytes=r.device_peak_bytes,
        allocator=r.allocator,
    )
