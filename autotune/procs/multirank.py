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
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, ConfigError, TrainingError, UnsupportedError, WorkloadError
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement
from autotune.measurement.schedule import RankReport, assemble
from autotune.procs.ds_worker import ERROR_GLOB, Job, RankError, result_path
from autotune.procs.launch import LaunchError, launch_module
from autotune.train.base import check_micro_batch
from autotune.train.deepspeed_config import engine_precision
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
    n = len(workload.block_names())
    for c in configs:
        engine_precision(c, num_blocks=n, device_type=device_type)
        check_micro_batch(workload, c, world=c.ranks)


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
    """One Measurement from every rank's report of config ``index``."""
    return assemble(
        workload,
        job.configs[index],
        device=job.device,
        warmup=job.warmup,
        steps=job.steps,
        memory_budget=job.memory_budget,
        reports=reports,
    )


def _failed(workload: str, job: Job, config: TrainConfig, reason: str) -> Measurement:
    return assemble(
        workload,
        config,
        device=job.device,
        warmup=job.warmup,
        steps=job.steps,
        memory_budget=job.memory_budget,
        reports=[],
        failure=("oom", reason),
    )
