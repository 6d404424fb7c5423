"""Start N ranks of a Python module with torchrun, and always reap them.

The ranks are started by PyTorch's own launcher, ``torchrun`` (``python -m torch.distributed.run``),
exactly as a user starts them on a cluster node: it sets ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``, and ends the other ranks when one fails. autotune adds no
process-group protocol of its own; results come back as files the ranks write (see
:mod:`autotune.procs.ds_worker`).

Reaping. torchrun starts each rank in a session of its own, so killing torchrun's process group
does not reach them, and a torchrun killed with SIGKILL leaves them running. Each rank therefore
writes its pid to ``pids/`` in the run directory first thing; whatever happens here (error, timeout,
Ctrl-C), torchrun is asked to stop (SIGTERM, which it forwards to the ranks), then killed, and then
every rank session still alive is killed by pid. Only processes this launch started are signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from autotune.errors import LaunchError

__all__ = ["LaunchError", "RankProcesses", "free_port", "launch_module", "start_module", "PIDS_DIR"]

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
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={nprocs}", "--nnodes=1",
        "--master-addr=127.0.0.1", f"--master-port={free_port()}",
        f"--log-dir={run_dir / 'logs'}", "--redirects=3",
        "--max-restarts=0",
        "-m", module, *args,
    ]  # fmt: skip
    with (run_dir / "torchrun.log").open("wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=dict(env or os.environ),
            start_new_session=True,  # Ctrl-C in the terminal reaches us only; we stop the ranks in order
        )  # fmt: skip
    return RankProcesses(proc, run_dir, module)


def launch_module(
    module: str,
    args: Sequence[str],
    *,
    nprocs: int,
    run_dir: Path,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    poll: Callable[[], None] | None = None,
) -> None:
    """Run ``python -m module *args`` as ``nprocs`` ranks on this machine and wait for them.

    Output as in :func:`start_module`. ``poll`` is called every 0.2 s while waiting.

    Raises:
        LaunchError: torchrun exited non-zero, or ``timeout`` seconds passed. The ranks are gone.
    """
    ranks = start_module(module, args, nprocs=nprocs, run_dir=run_dir, env=env)
    try:
        _wait(ranks.proc, timeout=timeout, poll=poll)
    finally:
        ranks.reap()
    if ranks.proc.returncode != 0:
        raise LaunchError(f"torchrun exited with status {ranks.proc.returncode}; see {run_dir / 'torchrun.log'}")


def _wait(proc: subprocess.Popen[bytes], *, timeout: float | None, poll: Callable[[], None] | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    while proc.poll() is None:
        if deadline is not None and time.monotonic() > deadline:
            raise LaunchError(f"the ranks did not finish within {timeout:g} s")
        if poll is not None:
            poll()
        time.sleep(_POLL_SECONDS)


def _kill_session(pid: int, module: str) -> None:
    # Each rank leads its own session (torchrun starts it with start_new_session), so its pid is
    # also its process-group id. A pid no longer running our module was reaped (maybe reused).
    cmdline = Path(f"/proc/{pid}/cmdline")
    with contextlib.suppress(ProcessLookupError, PermissionError, FileNotFoundError):
        if cmdline.parent.parent.is_dir() and module.encode() not in cmdline.read_bytes():
            return
        if os.getpgid(pid) == pid:
            os.killpg(pid, signal.SIGKILL)
