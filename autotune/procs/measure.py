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
    """Train ``workload`` under ``config`` and measure throughput, memory, noise and loss: in this
    process, or on DeepSpeed ranks (module docstring). The schedule and the results are
    :func:`~autotune.measurement.schedule.measure_local`'s."""
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
