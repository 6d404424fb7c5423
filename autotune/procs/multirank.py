"""``measure`` for ``zero_stage > 0`` or ``ranks > 1``: launch DeepSpeed ranks, gather their reports.

The parent process validates what it can (so a user mistake is an error here, not in N logs),
writes a job file, starts the ranks with torchrun (:mod:`autotune.procs.launch`), and turns the
per-rank JSON reports into one :class:`~autotune.measurement.record.Measurement` with a
:class:`~autotune.measurement.record.RankResult` per rank.

Several configs with the same rank count can share one launch (:func:`measure_ranks`): process
start, ``import deepspeed`` and the process group cost ~10 s here, a small config's steps less.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, ConfigError, TrainingError, UnsupportedError, WorkloadError
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement, RankResult
from autotune.measurement.trend import loss_slope
from autotune.procs.ds_worker import ERROR_GLOB, Job, RankError, RankReport, result_path
from autotune.procs.launch import LaunchError, launch_module
from autotune.train.deepspeed_config import engine_precision
from autotune.train.gns import NoiseEstimate
from autotune.workload import Workload

__all__ = ["USER_ERRORS", "check_configs", "child_env", "device_type_of", "log_tail", "measure_ranks"]

_WORKER = "autotune.procs.ds_worker"
# User mistakes found inside a rank keep their type, so the CLI still exits with 2 for them.
USER_ERRORS: dict[str, type[AutotuneError]] = {
    "ConfigError": ConfigError,
    "UnsupportedError": UnsupportedError,
    "WorkloadError": WorkloadError,
}


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

    A config that runs out of memory ends its launch; the configs after it get a new one.

    Raises:
        ConfigError, UnsupportedError, WorkloadError: a user mistake, before or inside a rank.
        TrainingError: a rank failed otherwise; the message is that rank's exception.
    """
    device_type = device_type_of(device)
    check_configs(workload, configs, device_type)
    out: list[Measurement] = []
    while len(out) < len(configs):
        out += _launch(
            workload, list(configs[len(out) :]), steps, warmup, memory_budget, device_type, progress, timeout
        )
    return out


def device_type_of(device: str | None) -> str:
    """``cpu`` or ``cuda`` for a device argument (None or ``auto``: CUDA when available)."""
    import torch

    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind = torch.device(device).type
    if kind not in ("cpu", "cuda"):
        raise UnsupportedError(f"the DeepSpeed runner runs on cpu or cuda, but got device {device!r}.")
    return kind


def check_configs(workload: Workload, configs: Sequence[TrainConfig], device_type: str) -> None:
    """What the parent can check before any rank starts: a user mistake is one error here, not N in logs."""
    if workload.source is None:
        raise UnsupportedError(
            f"workload {workload.name!r} has no source reference, but every DeepSpeed rank rebuilds it "
            "from one; load it with autotune.load_workload(...) (or set Workload.source)."
        )
    if not configs or len({c.ranks for c in configs}) != 1:
        raise ConfigError(f"measure_ranks needs configs with one rank count, but got {[c.ranks for c in configs]}.")
    n, size = len(workload.block_names()), len(workload.dataset)  # type: ignore[arg-type]
    for c in configs:
        engine_precision(c, num_blocks=n, device_type=device_type)
        if c.micro_batch_size > size // c.ranks:
            raise ConfigError(
                f"TrainConfig.micro_batch_size must be <= the dataset size of workload {workload.name!r} "
                f"per rank ({size} // {c.ranks} ranks), but got {c.micro_batch_size}."
            )


def _launch(
    workload: Workload,
    configs: list[TrainConfig],
    steps: int,
    warmup: int,
    memory_budget: int | None,
    device_type: str,
    progress: ProgressFn | None,
    timeout: float | None,
) -> list[Measurement]:
    assert workload.source is not None  # _check
    ranks = configs[0].ranks
    job = Job(
        workload=workload.source,
        configs=tuple(configs),
        steps=steps,
        warmup=warmup,
        memory_budget=memory_budget,
        device=device_type,
    )
    with tempfile.TemporaryDirectory(prefix="autotune-ranks-") as tmp:
        run_dir = Path(tmp)
        job_file = run_dir / "job.json"
        job_file.write_text(job.to_json())
        try:
            launch_module(
                _WORKER,
                [str(job_file)],
                nprocs=ranks,
                run_dir=run_dir,
                env=child_env(device_type, ranks),
                timeout=timeout,
                poll=None if progress is None else lambda: _report_progress(run_dir, progress),
            )
        except LaunchError as e:
            return _after_failure(workload, job, run_dir, e)
        return [_aggregate(workload.name, job, i, _reports(run_dir, i, ranks)) for i in range(len(configs))]


def child_env(device_type: str, ranks: int) -> dict[str, str]:
    """The environment of ``ranks`` DeepSpeed ranks started from this process."""
    env = dict(os.environ)
    if device_type == "cpu":
        env["DS_ACCELERATOR"] = "cpu"  # never probe for a GPU stack
        # Ranks share the cores: one share each (2 ranks on 2 cores: 1 thread), else OpenMP
        # threads of different ranks spin against each other.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // ranks))
    # A rank imports the workload as this process did: from the same script directory too.
    script_dir = sys.path[0] if sys.path and sys.path[0] and Path(sys.path[0]).is_dir() else None
    if script_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (script_dir, env.get("PYTHONPATH")) if p)
    return env


def _report_progress(run_dir: Path, progress: ProgressFn) -> None:
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        state = json.loads((run_dir / "progress.json").read_text())
        progress(state["phase"], state["done"], state["total"])


def _reports(run_dir: Path, index: int, ranks: int) -> list[RankReport]:
    return [RankReport.from_json(result_path(run_dir, index, r).read_text()) for r in range(ranks)]


def _after_failure(workload: Workload, job: Job, run_dir: Path, error: LaunchError) -> list[Measurement]:
    """Measurements of the configs finished before a rank failed, plus an ``oom`` one if it ran out."""
    ranks = job.configs[0].ranks
    done = [
        _aggregate(workload.name, job, i, _reports(run_dir, i, ranks))
        for i in range(len(job.configs))
        if all(result_path(run_dir, i, r).exists() for r in range(ranks))
    ]
    # The first failure is the cause; the other ranks then fail in their collectives ("Connection
    # closed by peer"), later.
    failures = sorted((RankError.from_json(p.read_text()) for p in run_dir.glob(ERROR_GLOB)), key=lambda f: f.time)
    if not failures:
        raise TrainingError(f"the DeepSpeed ranks of {workload.name!r} failed: {error}\n{log_tail(run_dir)}") from error
    first = failures[0]
    index = len(done) if first.config_index is None else first.config_index
    config = job.configs[index]
    if first.out_of_memory:
        reason = f"out of memory on rank {first.rank}: {first.message.splitlines()[0]}"
        return [*done, _failed(workload.name, job, config, reason)]
    if first.type in USER_ERRORS:
        raise USER_ERRORS[first.type](first.message)
    where = f"training {workload.name!r} failed under {config.describe()} on rank {first.rank}"
    raise TrainingError(f"{where}: {first.type}: {first.message}")


def log_tail(run_dir: Path, lines: int = 20) -> str:
    """The last lines of every rank's stderr and of torchrun's log in a run directory."""
    logs = [*sorted((run_dir / "logs").rglob("stderr.log")), run_dir / "torchrun.log"]
    tails = []
    for log in logs:
        with contextlib.suppress(OSError):
            text = log.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                tails.append(f"--- {log.relative_to(run_dir)}\n" + "\n".join(text))
    return "\n".join(tails)


def _aggregate(workload: str, job: Job, index: int, reports: list[RankReport]) -> Measurement:
    """One Measurement from every rank's report of config ``index``.

    A data-parallel step ends on all ranks together (the gradient reduction is a barrier): its
    throughput is the samples of all ranks over the slowest rank's time.
    """
    first, config = reports[0], job.configs[index]
    rates = [
        sum(r.timed_samples[i] for r in reports) / max(r.timed_seconds[i] for r in reports)
        for i in range(len(first.timed_seconds))
    ]
    steps_seconds = [max(r.timed_seconds[i] for r in reports) for i in range(len(first.timed_seconds))]
    quartiles = statistics.quantiles(rates, n=4, method="inclusive") if len(rates) >= 2 else rates * 3
    worst = max(reports, key=lambda r: -1 if r.memory is None else r.memory.total)
    return Measurement(
        workload=workload,
        config=config,
        device=job.device,
        status=first.status,
        reason=first.reason,
        warmup=job.warmup,
        steps=job.steps,
        throughput=statistics.median(rates) if rates else None,
        throughput_p25=quartiles[0] if rates else None,
        throughput_p75=quartiles[2] if rates else None,
        step_seconds=statistics.median(steps_seconds) if rates else None,
        memory=worst.memory,
        category_peaks=worst.category_peaks,
        device_peak_bytes=max((r.device_peak_bytes for r in reports if r.device_peak_bytes is not None), default=None),
        memory_budget=job.memory_budget,
        # The noise scale needs each micro-batch gradient, which ZeRO reduces and partitions away.
        noise=NoiseEstimate(b_simple=None, trace_sigma=None, grad_sq_norm=None, sigma2=None, steps=0),
        losses=first.losses,
        loss_slope=loss_slope(first.losses),
        overflow_steps=first.overflow_steps,
        lr=first.lr,
        per_rank=tuple(_rank_result(r) for r in reports),
    )


def _rank_result(r: RankReport) -> RankResult:
    rates = [n / s for n, s in zip(r.timed_samples, r.timed_seconds, strict=True)]
    return RankResult(
        rank=r.rank,
        throughput=statistics.median(rates) if rates else None,
        step_seconds=statistics.median(r.timed_seconds) if rates else None,
        memory=r.memory,
        category_peaks=r.category_peaks,
        resident=r.resident,
        device_peak_bytes=r.device_peak_bytes,
    )


def _failed(workload: str, job: Job, config: TrainConfig, reason: str) -> Measurement:
    return Measurement(
        workload=workload,
        config=config,
        device=job.device,
        status="oom",
        reason=reason,
        warmup=job.warmup,
        steps=job.steps,
        throughput=None,
        throughput_p25=None,
        throughput_p75=None,
        step_seconds=None,
        memory=None,
        category_peaks=None,
        device_peak_bytes=None,
        memory_budget=job.memory_budget,
        noise=NoiseEstimate(b_simple=None, trace_sigma=None, grad_sq_norm=None, sigma2=None, steps=0),
        losses=(),
        loss_slope=None,
        overflow_steps=0,
        lr=0.0,
    )
