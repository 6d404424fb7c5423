"""One rank of a multi-rank measurement: ``torchrun ... -m autotune.procs.ds_worker RUN_DIR/job.json``.

The job file names the workload (its ``source`` reference: every rank rebuilds it), the configs
to measure one after the other on the same process group, and the measurement schedule. For each
config every rank writes ``result-{config}-rank{rank}.json`` (a :class:`RankReport`); a rank that
fails writes ``error-rank{rank}.json`` (a :class:`RankError`) and exits with status 1, and torchrun
then ends the others. Results travel as JSON files, never pickles.

The same job file runs on a GPU node: ``torchrun --nproc-per-node 8 -m autotune.procs.ds_worker
job.json`` (NCCL, one GPU per rank).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from autotune.config import TrainConfig
from autotune.measurement.schedule import RankReport

__all__ = ["ERROR_GLOB", "Job", "RankError", "main", "result_path"]

ERROR_GLOB = "error-rank*.json"


@dataclass(frozen=True, kw_only=True)
class Job:
    """What the ranks of one launch measure."""

    workload: str  # a load_workload reference (Workload.source)
    configs: tuple[TrainConfig, ...]
    steps: int
    warmup: int
    memory_budget: int | None
    device: str  # "cpu" or "cuda"

    def to_json(self) -> str:
        d = asdict(self) | {"configs": [c.to_dict() for c in self.configs]}
        return json.dumps(d, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Job:
        d = json.loads(text)
        d["configs"] = tuple(TrainConfig.from_dict(c) for c in d["configs"])
        return cls(**d)


@dataclass(frozen=True, kw_only=True)
class RankError:
    """Why a rank stopped: the exception, and whether it was the allocator running out of memory."""

    rank: int
    config_index: int | None
    type: str
    message: str
    out_of_memory: bool
    traceback: str
    time: float  # time.time() when caught: the first failure is the cause, the others its echo

    @classmethod
    def from_json(cls, text: str) -> RankError:
        return cls(**json.loads(text))


def result_path(run_dir: Path, config_index: int, rank: int) -> Path:
    return run_dir / f"result-{config_index}-rank{rank}.json"


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomic: the parent never reads half a file


def main(argv: Sequence[str] | None = None) -> int:
    from autotune.procs.launch import PIDS_DIR

    args = sys.argv[1:] if argv is None else argv
    job_file = Path(args[0])
    run_dir = job_file.parent
    rank = int(os.environ["RANK"])
    (run_dir / PIDS_DIR / str(os.getpid())).touch()  # lets the launcher reap this rank whatever happens
    current: list[int] = []
    try:
        _run(Job.from_json(job_file.read_text()), run_dir, rank, current)
    except Exception as e:
        from autotune.measurement.oom import is_out_of_memory

        error = RankError(
            rank=rank,
            config_index=current[-1] if current else None,
            type=type(e).__name__,
            message=str(e),
            out_of_memory=is_out_of_memory(e),
            traceback=traceback.format_exc(),
            time=time.time(),
        )
        _write(run_dir / f"error-rank{rank}.json", json.dumps(asdict(error), indent=2))
        traceback.print_exc()
        return 1
    return 0


def _run(job: Job, run_dir: Path, rank: int, current: list[int]) -> None:
    import torch

    from autotune.resolve import load_workload
    from autotune.train.zero import import_deepspeed

    # DeepSpeed 0.19.8 calls the deprecated all_gather_into_tensor; the warning says nothing about
    # the measured config, and would be printed once per engine.
    warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated", category=FutureWarning)
    deepspeed = import_deepspeed()
    if job.device == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
    workload = load_workload(job.workload)
    for index, config in enumerate(job.configs):
        current.append(index)
        report = _measure(workload, config, job, rank, device, progress=_Progress(run_dir, index, rank))
        _write(result_path(run_dir, index, rank), report.to_json())


class _Progress:
    """Rank 0 writes ``progress.json`` for the launcher's progress callback."""

    def __init__(self, run_dir: Path, index: int, rank: int) -> None:
        self.path, self.index, self.enabled = run_dir / "progress.json", index, rank == 0

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.enabled:
            _write(self.path, json.dumps({"config": self.index, "phase": phase, "done": done, "total": total}))


def _measure(workload: Any, config: TrainConfig, job: Job, rank: int, device: Any, progress: _Progress) -> RankReport:
    import torch

    from autotune.measurement.schedule import Schedule
    from autotune.measurement.zero_tracker import tracked_zero_step
    from autotune.train.zero import ZeroTrainer

    def worst_peak(peak: int) -> int:
        worst = torch.tensor(peak, dtype=torch.int64, device=device)
        torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
        return int(worst.item())

    torch.manual_seed(config.seed)
    trainer = ZeroTrainer(workload, config, rank=rank, device=device)
    schedule = Schedule(
        trainer,
        steps=job.steps,
        warmup=job.warmup,
        memory_budget=job.memory_budget,
        tracked_step=lambda: tracked_zero_step(trainer),
        progress=progress,
        worst_peak=worst_peak,
    )
    try:
        status, reason = schedule.execute()
    finally:
        trainer.close()
    return schedule.report(status, reason, rank=rank)


if __name__ == "__main__":
    sys.exit(main())
