"""A multi-rank training session: N DeepSpeed ranks started once, driven by commands.

The one way autotune runs ranks: measuring a config (:func:`~autotune.procs.multirank.measure_ranks`,
the ``measure`` command: the measurement schedule in every rank) and training that changes its
config as it goes (the environment: start, reconfigure, step, tracked step, state). The ranks are
started once with torchrun (the launcher, environment and reaping of :mod:`autotune.procs.launch`);
commands and replies are JSON lines over one localhost TCP connection per rank
(:mod:`autotune.procs.session_worker` is the other end, with the parent watchdog of
:mod:`autotune.procs.watchdog`).

Every rank answers every command itself, so the parent aggregates (loss: the all-reduced mean,
samples: summed, seconds: the slowest rank, memory: the rank with the highest peak, every rank
kept) and sees a failing rank's own exception even while the other ranks wait for it in a
collective. Any failure ends the session: the process group is then in an unknown state.

Failures, always as autotune errors: a user mistake found in a rank keeps its type
(:class:`~autotune.errors.ConfigError`, ...), anything else is a :class:`SessionError` with the
rank and its message; a command that takes longer than ``timeout`` or ranks that exit end the
session with a :class:`SessionError` too. The processes are always reaped: on ``close()``, on
leaving a ``with`` block, when the session is garbage-collected or the interpreter exits, and,
if the parent is killed, by a watchdog in each rank.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import shutil
import socket
import tempfile
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import (
    AutotuneError,
    ConfigError,
    RankFailed,
    RankTraceback,
    SessionError,
    UnsupportedError,
    WorkloadError,
)
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import Measurement, MemoryBreakdown, Status
from autotune.measurement.schedule import RankReport, assemble
from autotune.procs.channel import command, decode, encode
from autotune.procs.launch import RankProcesses, child_env, log_tail, start_module
from autotune.procs.session_worker import PARENT_ENV, TOKEN_ENV
from autotune.train.base import StepResult, check_micro_batch
from autotune.train.deepspeed_config import engine_precision
from autotune.train.zero_state import TrainingState, load_state
from autotune.workload import Workload

__all__ = [
    "RankMemory",
    "RankSession",
    "RankTraceback",
    "Reconfigured",
    "SessionError",
    "SessionStep",
    "TrackedSessionStep",
]

# User mistakes found inside a rank keep their type, so the CLI still exits with 2 for them.
USER_ERRORS: dict[str, type[AutotuneError]] = {
    "ConfigError": ConfigError,
    "UnsupportedError": UnsupportedError,
    "WorkloadError": WorkloadError,
}
_WORKER = "autotune.procs.session_worker"
_TICK = 0.2  # seconds between checks that torchrun still runs while waiting for replies
_CLOSE_SECONDS = 10.0  # for the ranks to close their engines and exit before they are killed


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


@dataclass(frozen=True, kw_only=True)
class SessionStep:
    """One optimizer step of every rank."""

    loss: float  # mean over every rank's micro-batches (all-reduced in the ranks)
    samples: int  # global: over all ranks
    seconds: float  # the slowest rank's (a data-parallel step ends on all ranks together)
    lr: float
    overflow: bool  # fp16 loss scaling skipped the update
    per_rank: tuple[StepResult, ...]


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """Exact tensor bytes of one rank in a tracked step (see :func:`~autotune.train.zero.tracked_zero_step`)."""

    rank: int
    resident: MemoryBreakdown  # held between steps
    at_peak: MemoryBreakdown  # at the moment of the rank's peak total
    category_peaks: MemoryBreakdown  # each category's own maximum


@dataclass(frozen=True, kw_only=True)
class TrackedSessionStep:
    """A step under exact memory tracking on every rank."""

    step: SessionStep
    at_peak: MemoryBreakdown  # of the rank with the highest peak: what a per-device budget must hold
    per_rank: tuple[RankMemory, ...]

    @property
    def peak_bytes(self) -> int:
        return self.at_peak.total


@dataclass(frozen=True, kw_only=True)
class Reconfigured:
    seconds: float  # the slowest rank's
    rebuilt: str | None  # why the ranks built a new engine (None: changed on the live engine)


class RankSession:
    """``ranks`` DeepSpeed ranks on this machine, started once and driven by commands.

    ``start(workload, config)`` begins training from the workload's initial model (again: a new
    run in the same processes); ``reconfigure`` changes the config between steps, keeping the
    training state (see :meth:`autotune.train.zero.ZeroTrainer.reconfigure`).

    Args:
        ranks: Number of ranks (processes), >= 1.
        device: ``cpu``, ``cuda`` or None (CUDA when available): one device per rank.
        timeout: Seconds any command (and the start-up) may take before the session is ended.
    """

    def __init__(self, *, ranks: int, device: str | None = None, timeout: float = 600.0) -> None:
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise ConfigError(f"RankSession ranks must be an int >= 1, but got {ranks!r}.")
        if not timeout > 0:
            raise ConfigError(f"RankSession timeout must be > 0 seconds, but got {timeout!r}.")
        self.ranks, self.timeout = ranks, float(timeout)
        self.device_type = device_type_of(device)
        self.config: TrainConfig | None = None
        self.workload: Workload | None = None
        self.rank_pids: tuple[int, ...] = ()
        self._run_dir = Path(tempfile.mkdtemp(prefix="autotune-session-"))
        self._sockets: list[socket.socket] = []
        self._buffers: list[bytearray] = []
        self._state_files = 0
        token = secrets.token_hex(16)
        env = child_env(self.device_type, ranks) | {TOKEN_ENV: token, PARENT_ENV: str(os.getpid())}
        with socket.create_server(("127.0.0.1", 0)) as listener:
            host, port = listener.getsockname()[:2]
            try:
                self._procs = start_module(
                    _WORKER, [str(self._run_dir), host, str(port)], nprocs=ranks, run_dir=self._run_dir, env=env
                )
            except BaseException:
                shutil.rmtree(self._run_dir, ignore_errors=True)
                raise
            # From here on the processes exist: reaped however this object ends (GC, interpreter exit).
            self._finalizer = weakref.finalize(self, _shutdown, self._procs, self._sockets, self._run_dir)
            try:
                self._accept(listener, token)
            except BaseException:
                self._finalizer()
                raise

    @property
    def launcher_pid(self) -> int:
        """torchrun's pid."""
        return self._procs.proc.pid

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    # ---- start-up -------------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket, token: str) -> None:
        """Wait until every rank has connected and said hello with the session's token."""
        deadline = time.monotonic() + self.timeout
        by_rank: dict[int, tuple[socket.socket, int]] = {}
        listener.settimeout(_TICK)
        while len(by_rank) < self.ranks:
            self._check_alive("start-up", deadline, self.timeout)
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            hello = _read_hello(conn, deadline)
            if hello is None or not secrets.compare_digest(str(hello.get("hello")), token):  # not our rank
                conn.close()
                continue
            self._sockets.append(conn)  # closed by the finalizer, whatever happens next
            by_rank[int(hello["rank"])] = (conn, int(hello["pid"]))
        self._sockets[:] = [by_rank[r][0] for r in range(self.ranks)]  # in rank order (the same list)
        for sock in self._sockets:
            sock.settimeout(None)
        self._buffers[:] = [bytearray() for _ in range(self.ranks)]
        self.rank_pids = tuple(by_rank[r][1] for r in range(self.ranks))

    def _check_alive(self, what: str, deadline: float, seconds: float) -> None:
        """End the session and raise if torchrun has exited or ``deadline`` has passed."""
        code = self._procs.poll()
        if code is not None:
            tail = log_tail(self._run_dir)
            self._finalizer()
            raise SessionError(
                f"the ranks exited (torchrun status {code}) during {what}; the session is closed.\n{tail}"
            )
        if time.monotonic() > deadline:
            self._finalizer()
            raise SessionError(f"the ranks did not finish {what} within {seconds:g} s; the session is closed.")

    # ---- commands ---------------------------------------------------------------------------------------

    def start(self, workload: Workload, config: TrainConfig) -> None:
        """Train ``workload`` (a fresh copy of its model) under ``config`` on every rank."""
        self._check(workload, config)
        assert workload.source is not None  # check_configs
        self._call(
            "start",
            workload=workload.source,
            config=config.to_dict(),
            device=self.device_type,
            timeout=self.timeout,
        )
        self.workload, self.config = workload, config

    def reconfigure(self, config: TrainConfig) -> Reconfigured:
        """Switch every rank to ``config``; a ZeRO stage change builds new engines with the state carried over."""
        workload = self._started()
        self._check(workload, config)
        replies = self._call("reconfigure", config=config.to_dict())
        self.config = config
        return Reconfigured(seconds=max(r["seconds"] for r in replies), rebuilt=replies[0]["rebuilt"])

    def measure(
        self,
        workload: Workload,
        config: TrainConfig,
        *,
        steps: int,
        warmup: int,
        memory_budget: int | None,
        progress: ProgressFn | None = None,
    ) -> Measurement:
        """Measure ``config`` from the workload's initial model: every rank runs the measurement
        schedule (:class:`~autotune.measurement.schedule.Schedule`) and reports; an out-of-memory
        rank gives an ``oom`` Measurement and ends the session."""
        self._check(workload, config)
        assert workload.source is not None  # check_configs
        self.workload = self.config = None  # the ranks close their trainer after measuring
        try:
            replies = self._call(
                "measure",
                on_progress=None if progress is None else lambda p: progress(p["phase"], p["done"], p["total"]),
                workload=workload.source,
                config=config.to_dict(),
                device=self.device_type,
                timeout=self.timeout,
                steps=steps,
                warmup=warmup,
                memory_budget=memory_budget,
            )
            failure: tuple[Status, str] | None = None
        except RankFailed as e:
            if not e.out_of_memory:
                raise e.training_error(workload, config) from e
            replies, failure = [], ("oom", f"out of memory on rank {e.rank}: {e.message.splitlines()[0]}")
        return assemble(
            workload.name,
            config,
            device=self.device_type,
            warmup=warmup,
            steps=steps,
            memory_budget=memory_budget,
            reports=[RankReport.from_dict(r) for r in replies],
            failure=failure,
        )

    def step(self) -> SessionStep:
        """One optimizer step on every rank."""
        self._started()
        return _aggregate([StepResult(**r) for r in self._call("step")])

    def tracked_step(self) -> TrackedSessionStep:
        """One optimizer step under exact memory tracking (MemTracker, DeepSpeed's buffers labelled)."""
        self._started()
        replies = self._call("tracked_step")
        per_rank = tuple(
            RankMemory(
                rank=rank,
                resident=MemoryBreakdown(**r["resident"]),
                at_peak=MemoryBreakdown(**r["at_peak"]),
                category_peaks=MemoryBreakdown(**r["category_peaks"]),
            )
            for rank, r in enumerate(replies)
        )
        worst = max(per_rank, key=lambda m: m.at_peak.total)
        step = _aggregate([StepResult(**r["result"]) for r in replies])
        return TrackedSessionStep(step=step, at_peak=worst.at_peak, per_rank=per_rank)

    def state(self) -> TrainingState:
        """The full training state: fp32 parameters, optimizer state, buffers (rank 0's), gathered."""
        self._started()
        self._state_files += 1
        path = self._run_dir / f"state-{self._state_files}.safetensors"
        self._call("state", path=str(path))
        try:
            return load_state(path)
        finally:
            path.unlink()

    def close(self) -> None:
        """Ask the ranks to close their engines and exit, then reap every process. Idempotent."""
        if self.closed:
            return
        try:
            self._call("close", wait=_CLOSE_SECONDS)
            deadline = time.monotonic() + _CLOSE_SECONDS
            while self._procs.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        except SessionError:
            pass  # already reaped by _call; nothing more to close
        finally:
            self._finalizer()

    def __enter__(self) -> RankSession:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- the channel --------------------------------------------------------------------------------------

    def _started(self) -> Workload:
        if self.workload is None:
            raise SessionError("no training has started in this session; call start(workload, config) first.")
        return self.workload

    def _check(self, workload: Workload, config: TrainConfig) -> None:
        if config.ranks != self.ranks:
            raise ConfigError(
                f"TrainConfig.ranks must equal the session's ranks ({self.ranks}), but got {config.ranks}."
            )
        check_configs(workload, [config], self.device_type)

    def _call(
        self,
        op: str,
        *,
        wait: float | None = None,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        **args: Any,
    ) -> list[dict[str, Any]]:
        """Send ``op`` to every rank; return their replies in rank order, or end the session and raise.

        ``wait``: seconds to wait for the replies (default: the session's timeout). A rank may send
        ``{"progress": ...}`` lines before its reply: they go to ``on_progress``. Ctrl-C while
        waiting ends the session at once (the ranks are busy; nothing would answer a ``close``).
        """
        try:
            return self._exchange(op, wait, on_progress, args)
        except KeyboardInterrupt:
            self._finalizer()
            raise

    def _exchange(
        self, op: str, wait: float | None, on_progress: Callable[[dict[str, Any]], None] | None, args: dict[str, Any]
    ) -> list[dict[str, Any]]:
        if self.closed:
            raise SessionError(f"the session is closed, but got command {op!r}; start a new RankSession.")
        line = encode(command(op, **args))
        try:
            for sock in self._sockets:
                sock.sendall(line)
        except OSError as e:  # a rank is gone
            tail = log_tail(self._run_dir)
            self._finalizer()
            raise SessionError(f"cannot send {op!r} to the ranks ({e}); the session is closed.\n{tail}") from e
        wait = self.timeout if wait is None else wait
        deadline = time.monotonic() + wait
        replies: dict[int, dict[str, Any]] = {}
        while len(replies) < self.ranks:
            # Sync point: the parent waits for the slowest rank.
            waiting = [s for r, s in enumerate(self._sockets) if r not in replies]
            readable, _, _ = select.select(waiting, [], [], _TICK)
            for sock in readable:
                rank = self._sockets.index(sock)
                for message in self._receive(rank, op):
                    if "progress" in message:
                        if on_progress is not None:
                            on_progress(message["progress"])
                        continue
                    if "error" in message:
                        self._finalizer()  # the others may wait for this rank in a collective: end them
                        raise _rank_error(rank, op, message["error"])
                    replies[rank] = message["ok"]
            if len(replies) < self.ranks:
                self._check_alive(f"command {op!r}", deadline, wait)
        return [replies[r] for r in range(self.ranks)]

    def _receive(self, rank: int, op: str) -> list[dict[str, Any]]:
        """The whole lines (JSON messages) the rank has sent so far; a partial line waits in its buffer."""
        data = self._sockets[rank].recv(1 << 16)
        if not data:  # the rank closed its end: it is exiting
            tail = log_tail(self._run_dir)
            self._finalizer()
            raise SessionError(f"rank {rank} closed its connection during {op!r}; the session is closed.\n{tail}")
        buffer = self._buffers[rank]
        buffer += data
        *lines, rest = bytes(buffer).split(b"\n")
        buffer[:] = rest
        return [decode(line) for line in lines]


def _read_hello(conn: socket.socket, deadline: float) -> dict[str, Any] | None:
    """A connecting rank's first line, or None if it is not a JSON object in time."""
    conn.settimeout(max(0.1, deadline - time.monotonic()))
    data = b""
    try:
        while b"\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                return None
            data += chunk
        hello = json.loads(data)
    except (TimeoutError, ValueError, OSError):
        return None
    return hello if isinstance(hello, dict) else None


def _aggregate(results: list[StepResult]) -> SessionStep:
    return SessionStep(
        loss=results[0].loss,  # every rank has the same all-reduced mean
        samples=sum(r.samples for r in results),
        seconds=max(r.seconds for r in results),
        lr=results[0].lr,
        overflow=any(r.overflow for r in results),
        per_rank=tuple(results),
    )


def _rank_error(rank: int, op: str, error: dict[str, Any]) -> Exception:
    """The rank's exception as an autotune error: a user mistake keeps its type and message."""
    user_error = USER_ERRORS.get(error["type"])
    if user_error is not None:
        e: Exception = user_error(error["message"])
    else:
        e = RankFailed(
            rank=rank, op=op, type=error["type"], message=error["message"], out_of_memory=error["out_of_memory"]
        )
    e.__cause__ = RankTraceback(f"rank {rank}:\n{error['traceback']}")
    return e


def _shutdown(procs: RankProcesses, sockets: list[socket.socket], run_dir: Path) -> None:
    """End the session's processes and remove its run directory (also run by the finalizer at exit)."""
    for sock in sockets:
        sock.close()
    # Ranks first: after a failure their state is lost anyway, and torchrun's own SIGTERM handling
    # waits for ranks stuck in a collective (~3 s); after a clean close they have exited already.
    procs.kill_ranks()
    procs.reap()
    shutil.rmtree(run_dir, ignore_errors=True)
