"""``measure`` for ``zero_stage > 0`` or ``ranks > 1``: a rank session running the one schedule.

The parent validates what it can (so a user mistake is an error here, not in N logs), starts
``config.ranks`` DeepSpeed ranks once (:class:`~autotune.procs.session.RankSession`), and each
rank runs :class:`~autotune.measurement.schedule.Schedule` on its
:class:`~autotune.train.zero.ZeroTrainer` and answers with its
:class:`~autotune.measurement.schedule.RankReport`; :func:`~autotune.measurement.schedule.assemble`
makes the :class:`~autotune.measurement.record.Measurement`, with a
:class:`~autotune.measurement.record.RankResult` per rank.

Several configs with the same rank count share the ranks: process start, ``import deepspeed`` and
the process group cost ~10 s here, a small config's steps less. A config that runs out of memory
ends the session (the process group is in an unknown state); the next config gets new ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.config import TrainConfig
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement
from autotune.procs.session import RankSession, check_configs, device_type_of
from autotune.workload import Workload

__all__ = ["measure_ranks"]

#: Without a timeout a measurement may take as long as it takes; collectives still need a bound.
_NO_TIMEOUT = 7 * 24 * 3600.0


def measure_ranks(
    workload: Workload,
    configs: Sequence[TrainConfig],
    *,
    steps: int = 8,
    warmup: int = 2,
    memory_budget: int | None = None,
    device: str | None = None,
    progress: ProgressFn | None = None,
    timeout: float | None = None,
) -> list[Measurement]:
    """Measure each config on ``config.ranks`` DeepSpeed ranks (all configs: the same rank count).

    ``timeout``: seconds one config's measurement may take (None: no limit).

    Raises:
        ConfigError, UnsupportedError, WorkloadError: a user mistake, before or inside a rank.
        TrainingError: a rank failed otherwise; the message is that rank's exception.
    """
    device_type = device_type_of(device)
    check_configs(workload, configs, device_type)
    out: list[Measurement] = []
    session: RankSession | None = None
    try:
        for config in configs:
            if session is None or session.closed:  # the first config, or the last one ran out of memory
                session = RankSession(ranks=config.ranks, device=device_type, timeout=timeout or _NO_TIMEOUT)
            out.append(
                session.measure(
                    workload, config, steps=steps, warmup=warmup, memory_budget=memory_budget, progress=progress
                )
            )
    finally:
        if session is not None:
            session.close()
    return out
