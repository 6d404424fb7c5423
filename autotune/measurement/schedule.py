"""``measure``: run the real training loop under a config and report exactly what it costs."""

from __future__ import annotations

import math
import statistics

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, ConfigError, TrainingError
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement, MemoryBreakdown, Status
from autotune.measurement.tracker import device_peak, reset_device_peak, tracked_step
from autotune.measurement.trend import loss_slope
from autotune.train.base import StepResult
from autotune.train.local import Trainer
from autotune.workload import Workload

__all__ = ["measure", "ProgressFn"]


def measure(
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

    Order: ``warmup`` untimed steps (they create the optimizer state and, with
    ``grad_accum_steps == 1``, run as two half micro-batches to feed the noise estimate), one
    step under exact memory tracking, then ``steps`` timed steps (skipped when the peak exceeds
    ``memory_budget``). Each step is a real optimizer step on a private copy of the model.

    Infeasible configurations are results, not exceptions: ``status`` is ``over_budget``,
    ``oom`` or ``diverged``. Any other failure inside training raises :class:`TrainingError`
    (original chained), so a caller can mark the configuration failed and go on.

    ``zero_stage > 0`` or ``ranks > 1`` runs on ``config.ranks`` DeepSpeed ranks started with
    torchrun (see :func:`autotune.procs.multirank.measure_ranks`); the Measurement then has a
    ``per_rank`` entry per rank and ``memory`` of the rank with the highest peak.
    """
    _check_args(steps=steps, warmup=warmup, memory_budget=memory_budget)
    if config.zero_stage > 0 or config.ranks > 1:
        from autotune.procs.multirank import measure_ranks  # lazy: the launcher and job schema

        runs = measure_ranks(
            workload,
            [config],
            steps=steps,
            warmup=warmup,
            memory_budget=memory_budget,
            device=device,
            progress=progress,
        )
        return runs[0]
    trainer = Trainer(workload, config, device=device)
    run = _Run(trainer, steps=steps, warmup=warmup, progress=progress)
    try:
        status, reason = run.execute(memory_budget)
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
    return run.result(workload, config, status, reason, memory_budget)


def _check_args(*, steps: int, warmup: int, memory_budget: int | None) -> None:
    if not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"measure: steps must be an int >= 1, but got {steps!r}.")
    if not isinstance(warmup, int) or warmup < 1:
        # One warmup step at least: optimizer state is created lazily by the first step, and
        # the memory-tracked step must see it.
        raise ConfigError(f"measure: warmup must be an int >= 1, but got {warmup!r}.")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise ConfigError(f"measure: memory_budget must be a positive number of bytes, but got {memory_budget!r}.")


class _Run:
    """State of one measurement, so partial results survive an OOM or divergence."""

    def __init__(self, trainer: Trainer, *, steps: int, warmup: int, progress: ProgressFn | None) -> None:
        self.trainer = trainer
        self.steps = steps
        self.warmup = warmup
        self.progress = progress
        self.results: list[StepResult] = []
        self.timed: list[StepResult] = []
        self.memory: MemoryBreakdown | None = None
        self.category_peaks: MemoryBreakdown | None = None
        self.device_peak: int | None = None

    def _record(self, result: StepResult) -> bool:
        self.results.append(result)
        return math.isfinite(result.loss)

    def _tick(self, phase: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)

    def execute(self, memory_budget: int | None) -> tuple[Status, str | None]:
        t, c = self.trainer, self.trainer.config
        split = 2 if c.grad_accum_steps == 1 and c.micro_batch_size % 2 == 0 else 1
        for i in range(self.warmup):
            self._tick("warmup", i, self.warmup)
            if not self._record(t.step(split=split)):
                return "diverged", f"loss is {self.results[-1].loss} at step {len(self.results)}"
        self._tick("memory", 0, 1)
        reset_device_peak(t.device)
        result, self.memory, self.category_peaks = tracked_step(t)
        self.device_peak = device_peak(t.device)
        if not self._record(result):
            return "diverged", f"loss is {result.loss} at step {len(self.results)}"
        peak = max(self.memory.total, self.device_peak or 0)
        if memory_budget is not None and peak > memory_budget:
            return "over_budget", f"peak {peak} bytes exceeds the memory budget of {memory_budget} bytes"
        for i in range(self.steps):
            self._tick("timed", i, self.steps)
            result = t.step()
            self.timed.append(result)
            if not self._record(result):
                return "diverged", f"loss is {result.loss} at step {len(self.results)}"
        self._tick("timed", self.steps, self.steps)
        return "ok", None

    def result(
        self, workload: Workload, config: TrainConfig, status: Status, reason: str | None, budget: int | None
    ) -> Measurement:
        rates = [r.samples / r.seconds for r in self.timed] if status == "ok" else []
        quartiles = statistics.quantiles(rates, n=4, method="inclusive") if len(rates) >= 2 else rates * 3
        losses = tuple(r.loss for r in self.results)
        return Measurement(
            workload=workload.name,
            config=config,
            device=str(self.trainer.device),
            status=status,
            reason=reason,
            warmup=self.warmup,
            steps=self.steps,
            throughput=statistics.median(rates) if rates else None,
            throughput_p25=quartiles[0] if rates else None,
            throughput_p75=quartiles[2] if rates else None,
            step_seconds=statistics.median(r.seconds for r in self.timed) if rates else None,
            memory=self.memory,
            category_peaks=self.category_peaks,
            device_peak_bytes=self.device_peak,
            memory_budget=budget,
            noise=self.trainer.gns.estimate(),
            losses=losses,
            loss_slope=loss_slope(losses),
            overflow_steps=sum(r.overflow for r in self.results),
            lr=self.results[-1].lr if self.results else self.trainer.lr(),
        )
