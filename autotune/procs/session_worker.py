"""One rank of a :class:`~autotune.procs.session.RankSession`.

Started by the session through torchrun: ``python -m autotune.procs.session_worker RUN_DIR HOST
PORT``. The rank registers its pid (for reaping), connects to the parent at HOST:PORT, says hello
with the session's token (``AUTOTUNE_SESSION_TOKEN``: only the parent's own ranks are let in), and
then answers one command at a time. Commands and replies are JSON lines, never pickles:

    {"op": "step", "args": {}}               ->  {"ok": {...}}  or  {"error": {"type": ..., "message": ...}}

Every rank gets every command from the parent and answers it itself, so a rank that fails reports
its own exception even while the others wait for it inside a collective (the parent then ends them
all). A watchdog thread ends the rank when the parent process is gone, whatever the rank is doing.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import timedelta
from io import BufferedIOBase
from pathlib import Path
from typing import Any

from autotune.procs.channel import decode, encode, error_reply
from autotune.procs.watchdog import watch_parent

__all__ = ["PARENT_ENV", "TOKEN_ENV", "main"]

TOKEN_ENV = "AUTOTUNE_SESSION_TOKEN"
PARENT_ENV = "AUTOTUNE_SESSION_PARENT"
_WATCH_SECONDS = 1.0


def main(argv: Sequence[str] | None = None) -> int:
    from autotune.procs.launch import PIDS_DIR

    args = sys.argv[1:] if argv is None else argv
    run_dir, host, port = Path(args[0]), args[1], int(args[2])
    (run_dir / PIDS_DIR / str(os.getpid())).touch()  # lets the session reap this rank whatever happens
    watch_parent(int(os.environ[PARENT_ENV]), exit_code=1, interval=_WATCH_SECONDS)
    token = os.environ.pop(TOKEN_ENV)  # not inherited by anything this rank starts
    rank = int(os.environ["RANK"])
    with socket.create_connection((host, port), timeout=60) as sock:
        sock.settimeout(None)
        channel = sock.makefile("rwb")
        _send(channel, {"hello": token, "rank": rank, "pid": os.getpid()})
        _Rank(rank).serve(channel)
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


def _send(channel: BufferedIOBase, message: dict[str, Any]) -> None:
    channel.write(encode(message))
    channel.flush()


class _Rank:
    """This rank's side of the session: a ZeroTrainer driven by the parent's commands."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.trainer: Any = None  # a ZeroTrainer once started
        self._workloads: dict[str, Any] = {}
        self._channel: BufferedIOBase | None = None
        self._ops: dict[str, Callable[..., dict[str, Any]]] = {
            "start": self.start,
            "measure": self.measure,
            "reconfigure": self.reconfigure,
            "step": self.step,
            "tracked_step": self.tracked_step,
            "state": self.state,
            "close": self.close,
        }

    def serve(self, channel: BufferedIOBase) -> None:
        self._channel = channel
        for line in channel:  # ends at EOF: the parent closed the connection (or died)
            command = decode(line)
            op = command["op"]
            try:
                if op not in self._ops:
                    raise ValueError(f"unknown session command {op!r} (known: {', '.join(self._ops)}).")
                reply: dict[str, Any] = {"ok": self._ops[op](**command["args"])}
            except Exception as e:
                traceback.print_exc()  # into this rank's stderr log as well
                reply = error_reply(e)
            _send(channel, reply)
            if op == "close":
                return

    # ---- commands ---------------------------------------------------------------------------------

    def start(self, *, workload: str, config: dict[str, Any], device: str, timeout: float) -> dict[str, Any]:
        """A fresh trainer from the workload's initial model (the process group is made once)."""
        import torch

        from autotune.config import TrainConfig
        from autotune.resolve import load_workload
        from autotune.train.zero import ZeroTrainer, import_deepspeed

        if not torch.distributed.is_initialized():
            # DeepSpeed 0.19.8 calls the deprecated all_gather_into_tensor: noise, once per engine.
            warnings.filterwarnings("ignore", message=".*all_gather_into_tensor.*is deprecated", category=FutureWarning)
            if device == "cuda":
                torch.cuda.set_device(torch.device("cuda", int(os.environ["LOCAL_RANK"])))
            # A collective that waits longer than a command may take fails here, not only in the parent.
            import_deepspeed().init_distributed(
                dist_backend="nccl" if device == "cuda" else "gloo", timeout=timedelta(seconds=timeout)
            )
            # The first ZeRO 1-3 engine of a process imports DeepSpeed's Muon optimizer, which
            # imports torch.compile's inductor: ~3-5 s here, once. Paid now, so that the first
            # ZeRO stage change costs (and is timed) as what it is.
            importlib.import_module("deepspeed.runtime.zero.muon.muon_optimizer")
        if workload not in self._workloads:
            self._workloads[workload] = load_workload(workload)
        self.close()
        cfg = TrainConfig.from_dict(config)
        torch.manual_seed(cfg.seed)
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if device == "cuda" else torch.device("cpu")
        self.trainer = ZeroTrainer(self._workloads[workload], cfg, rank=self.rank, device=dev)
        return {}

    def _trainer(self) -> Any:
        if self.trainer is None:
            raise RuntimeError("no training has started on this rank; the session sends 'start' first.")
        return self.trainer

    def reconfigure(self, *, config: dict[str, Any]) -> dict[str, Any]:
        from autotune.config import TrainConfig

        start = time.perf_counter()
        rebuilt = self._trainer().reconfigure(TrainConfig.from_dict(config))
        return {"rebuilt": rebuilt, "seconds": time.perf_counter() - start}

    def step(self) -> dict[str, Any]:
        return asdict(self._trainer().step())

    def measure(
        self,
        *,
        workload: str,
        config: dict[str, Any],
        device: str,
        timeout: float,
        steps: int,
        warmup: int,
        memory_budget: int | None,
    ) -> dict[str, Any]:
        """Measure ``config`` from the workload's initial model: the one measurement schedule of
        :mod:`autotune.measurement.schedule`, run in this rank; the reply is this rank's RankReport.

        Rank 0 sends the schedule's progress as ``{"progress": ...}`` lines before its reply.
        """
        import torch

        from autotune.measurement.schedule import Schedule
        from autotune.measurement.zero_tracker import tracked_zero_step

        self.start(workload=workload, config=config, device=device, timeout=timeout)
        trainer = self._trainer()

        def worst_peak(peak: int) -> int:  # every rank takes the budget verdict on the same number
            worst = torch.tensor(peak, dtype=torch.int64, device=trainer.device)
            torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
            return int(worst.item())

        def slowest(seconds: float) -> float:  # every rank ends its warm-up at the same step
            worst = torch.tensor(seconds, dtype=torch.float64, device=trainer.device)
            torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MAX)
            return float(worst.item())

        schedule = Schedule(
            trainer,
            steps=steps,
            warmup=warmup,
            memory_budget=memory_budget,
            tracked_step=lambda: tracked_zero_step(trainer),
            progress=self._progress if self.rank == 0 else None,
            worst_peak=worst_peak,
            slowest=slowest,
        )
        try:
            status, reason = schedule.execute()
        finally:
            self.close()
        return asdict(schedule.report(status, reason, rank=self.rank))

    def _progress(self, phase: str, done: int, total: int) -> None:
        assert self._channel is not None
        _send(self._channel, {"progress": {"phase": phase, "done": done, "total": total}})

    def tracked_step(self) -> dict[str, Any]:
        from autotune.measurement.zero_tracker import tracked_zero_step

        return asdict(tracked_zero_step(self._trainer()))

    def state(self, *, path: str) -> dict[str, Any]:
        """Gather the full training state (a collective); rank 0 writes it to ``path``."""
        from autotune.train.zero_state import gather_state, save_state

        trainer = self._trainer()
        state = gather_state(trainer.engine, trainer.optimizer)
        if self.rank == 0:
            save_state(state, Path(path))
        return {"step_count": trainer.step_count}

    def close(self) -> dict[str, Any]:
        if self.trainer is not None:
            trainer, self.trainer = self.trainer, None
            trainer.close()
        return {}


if __name__ == "__main__":
    code = main()
    # Everything a rank owes is sent or written. The interpreter's own teardown (torch, DeepSpeed,
    # inductor modules) takes ~3 s on 2 cores and would delay every session's close by as much.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
