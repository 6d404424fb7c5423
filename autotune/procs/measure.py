"""``autotune.measure``: measure one configuration wherever it runs.

One process runs the measurement schedule here (:func:`autotune.measurement.schedule.measure_local`);
``zero_stage > 0`` or ``ranks > 1`` runs it on ``config.ranks`` DeepSpeed ranks started with
torchrun (:func:`autotune.procs.multirank.measure_ranks`), and the Measurement then has a
``per_rank`` entry per rank and ``memory`` of the rank with the highest peak. The choice lives in
the processes' home, above the measurement: a rank runs the schedule, never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.measurement.schedule import check_measure_args, measure_local

if TYPE_CHECKING:
    from autotune.config import TrainConfig
    from autotune.measurement.progress import ProgressFn
    from autotune.measurement.record import Measurement
    from autotune.workload import Workload

__all__ = ["measure"]


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
    """Train ``workload`` under ``config`` and measure throughput, memory, gradient noise and loss.

    Every step is a real optimizer step on a private copy of the model (the workload's own model
    is not trained). The schedule: ``warmup`` untimed steps, more (up to 4) until two successive
    ones agree within 10%, one step under exact memory tracking, then ``steps`` timed steps
    (skipped when the tracked peak exceeds ``memory_budget``). A configuration with
    ``zero_stage > 0`` or ``ranks > 1`` runs on ``config.ranks`` DeepSpeed ranks started with
    torchrun; the result then has one ``per_rank`` entry per rank, and ``memory`` is the rank with
    the highest peak.

    Args:
        workload: What to train (:func:`~autotune.load_workload` or your own
            :class:`~autotune.Workload`).
        config: How to train it.
        steps: Timed optimizer steps (>= 1): the throughput is their median.
        warmup: Untimed optimizer steps before the tracked one (>= 1: the first step creates the
            optimizer state, which the tracked step must see).
        memory_budget: Peak tensor bytes allowed, or None for no limit. A configuration whose
            tracked step exceeds it is returned with ``status="over_budget"`` and no throughput.
        device: ``"cpu"``, ``"cuda"`` or None (CUDA when available).
        progress: ``progress(phase, done, total)`` after each step, phase ``"warmup"``,
            ``"memory"`` or ``"timed"`` (for a display); None for nothing.

    Returns:
        The :class:`~autotune.Measurement`. An infeasible configuration is a result, not an
        exception: ``status`` is ``"over_budget"``, ``"oom"`` or ``"diverged"`` and ``reason``
        says why in one line.

    Raises:
        ConfigError: ``steps``, ``warmup`` or ``memory_budget`` out of range.
        TrainingError: training failed for a reason other than running out of memory (the
            original exception chained), so a caller can mark the configuration failed and go on.
        UnsupportedError: the configuration cannot run here (a device DeepSpeed does not run on).

    Example:
        >>> from autotune import TrainConfig, load_workload, measure
        >>> m = measure(load_workload("mlp-digits"), TrainConfig(micro_batch_size=8), steps=1, warmup=1)
        >>> m.status, m.throughput > 0
        ('ok', True)
        >>> m.memory.parameters, m.memory.optimizer_state  # exact bytes, the same on every run
        (2192424, 4910280)
    """
    if not config.on_deepspeed:
        return measure_local(
            workload, config, steps=steps, warmup=warmup, memory_budget=memory_budget, device=device, progress=progress
        )
    check_measure_args(steps=steps, warmup=warmup, memory_budget=memory_budget)
    from autotune.procs.multirank import measure_ranks  # lazy: the rank session and its launcher

    runs = measure_ranks(
        workload, [config], steps=steps, warmup=warmup, memory_budget=memory_budget, device=device, progress=progress
    )
    return runs[0]
