"""Start N ranks of a Python module with torchrun, and always reap them.

The ranks are started by PyTorch's own launcher, ``torchrun`` (``python -m torch.distributed.run``),
exactly as a user starts them on a cluster node: it sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``, and ends the other ranks when one fails. autotune adds no
process-group protocol of its own; the ranks talk to the parent over the session's channel (see
:mod:`autotune.procs.session`).

Reaping. torchrun starts each rank in a session of its own, so killing torchrun's process group
does not reach them, and a torchrun killed with SIGKILL leaves them running. Each rank therefore
writes its pid to ``pids/`` in the run directory first thing; whatever happens (error, timeout,
Ctrl-C), ``reap()`` asks torchrun to stop (SIGTERM, which it forwards to the ranks), then killed, and then
every rank session still alive is killed by pid. Only processes this launch started are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["PIDS_DIR", "RankProcesses", "child_env", "free_port", "log_tail", "start_module"]

#: Sub-directory of the run directory where each rank writes a file named after its pid.
PIDS_DIR = "pids"
_GRACE_SECONDS = 10.0
_POLL_SECONDS = 0.2


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RankProcesses:
    """torchrun and the ranks it started, running (:func:`start_module`); ``reap()`` ends them all."""

    def __init__(self, proc: subprocess.Popen[bytes], run_dir: Path, module: str) -> None:
        self.proc, self.run_dir, self.module = proc, run_dir, module

    def poll(self) -> int | None:
        """torchrun's exit status, or None while it runs."""
        return self.proc.poll()

    def reap(self) -> None:
        """Stop torchrun (SIGTERM, then SIGKILL after a grace period), then any rank still alive."""
        proc = self.proc
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)  # torchrun forwards it to every rank and waits for them
            try:
                proc.wait(timeout=_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.kill_ranks()

    def kill_ranks(self) -> None:
        """SIGKILL every rank that registered its pid and still runs (torchrun then exits by itself)."""
        for pid_file in (self.run_dir / PIDS_DIR).glob("*"):
            if pid_file.name.isdigit():
                _kill_session(int(pid_file.name), self.module)


def start_module(
    module: str, args: Sequence[str], *, nprocs: int, run_dir: Path, env: Mapping[str, str] | None = None
) -> RankProcesses:
    """Start ``python -m module *args`` as ``nprocs`` ranks on this machine; do not wait.

    torchrun's own output goes to ``run_dir/torchrun.log``; each rank's stdout and stderr to
    ``run_dir/logs`` (torchrun ``--redirects 3``). The caller must ``reap()`` the result.
    """
    (run_dir / PIDS_DIR).mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc-per-node={nprocs}",
        "--nnodes=1",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        f"--log-dir={run_dir / 'logs'}",
        "--redirects=3",
        "--max-restarts=0",
        "-m",
        module,
        *args,
    ]
    with (run_dir / "torchrun.log").open("wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env or os.environ),
            start_new_session=True,  # Ctrl-C in the terminal reaches us only; we stop the ranks in order
        )
    return RankProcesses(proc, run_dir, module)


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


def _kill_session(pid: int, module: str) -> None:
    # Each rank leads its own session (torchrun starts it with start_new_session), so its pid is
    # also its process-group id. A pid no longer running our module was reaped (maybe reused).
    cmdline = Path(f"/proc/{pid}/cmdline")
    with contextlib.suppress(ProcessLookupError, PermissionError, FileNotFoundError):
        if cmdline.parent.parent.is_dir() and module.encode() not in cmdline.read_bytes():
            return
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
