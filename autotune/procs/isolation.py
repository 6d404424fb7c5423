"""Measurements in a child process with a hard time limit, so no configuration can hang a study.

One long-lived child (``spawn`` start method: no forked torch or OpenMP state) rebuilds the
workload from ``Workload.source`` once and then measures config after config, sent over a pipe
as JSON messages (:mod:`autotune.procs.channel`, as the rank session's).
The parent waits at most ``timeout`` seconds for each answer; past it, or if the child dies
(segfault, the kernel's OOM killer), the child is SIGKILLed, the trial fails with the reason, and
a fresh child is started for the next trial. Startup (importing torch, building the workload) has
its own limit and is not charged to a trial.

The child also exits by itself within a second once its parent is gone (SIGKILL of the study
process included), so an interrupted study leaves no orphan burning the CPU. It ignores SIGINT:
Ctrl-C reaches the whole process group, and the parent alone answers it (one line, exit 130),
killing the child on its way out instead of letting it print a traceback of its own.

A workload that breaks its contract (:class:`WorkloadError`, e.g. a loss_fn that returns no
scalar) is the user's mistake, not a failed configuration: it is raised again in the parent and
ends the study.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import AutotuneError, MeasurementFailed, StudyError, TrainingError, WorkloadError
from autotune.measurement.cuda_memory import ALLOC_CONF_VAR
from autotune.measurement.record import Measurement
from autotune.procs.channel import command, decode, encode, error_reply
from autotune.procs.watchdog import watch_parent

if TYPE_CHECKING:
    from autotune.measurement.compiled import CompileCheck
    from autotune.measurement.sidebyside import Retimed
    from autotune.memory.check import StepPeak

__all__ = ["MeasurementFailed", "MeasurementProcess"]

#: Seconds an idle measuring child has to exit on its own once its pipe closes (interpreter
#: teardown: well under a second without compiled code) before it is killed.
EXIT_GRACE = 5.0


class MeasurementProcess:
    """A child process that measures configs of one workload.

    Args:
        source: ``Workload.source`` of the workload (a reference ``load_workload`` resolves).
        threads: ``torch.set_num_threads`` in the child (None: torch's default).
        device: Passed to :func:`autotune.measure`.
        startup_timeout: Seconds allowed for the child to import torch and build the workload.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` in the child, set before its first CUDA allocation
            (the allocator reads it once); None: the child inherits this process's.
    """

    def __init__(
        self,
        source: str,
        *,
        threads: int | None = None,
        device: str | None = None,
        startup_timeout: float = 600.0,
        alloc_conf: str | None = None,
    ) -> None:
        self.source = source
        self.threads = threads
        self.device = device
        self.alloc_conf = alloc_conf
        self.startup_timeout = startup_timeout
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: Connection | None = None
        self._building = False  # launched, its "ready" (or its error) not read yet

    def launch(self) -> None:
        """Start the child without waiting for it (idempotent): it imports torch and builds the
        workload (seconds to tens of seconds at real size) while this process does other work;
        :meth:`built` says whether it is done, :meth:`start` waits for it."""
        if self._process is not None and self._process.is_alive():
            return
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        process = ctx.Process(
            target=_serve,
            args=(child, self.source, self.threads, self.device, os.getpid(), self.alloc_conf),
            name="autotune-measure",
            daemon=True,
        )
        with _sigint_ignored():  # inherited through exec: ignored from the child's first instruction
            process.start()
        child.close()
        self._process, self._conn, self._building = process, parent, True

    def built(self) -> bool:
        """Whether :meth:`start` would not wait: the launched child has answered (ready, or why it
        could not build the workload), or none was launched."""
        return not self._building or self._conn is None or self._conn.poll()

    def start(self) -> None:
        """Start the child (unless :meth:`launch` did) and wait until the workload is built
        (idempotent)."""
        if self._process is not None and self._process.is_alive() and not self._building:
            return
        self.launch()
        reply = self._receive(self.startup_timeout, what="starting the measurement process")
        self._building = False
        if "error" in reply:
            self.close()
            error = reply["error"]
            if error["type"] == "WorkloadError":
                raise WorkloadError(error["message"])
            if error["type"] == "StudyError":
                raise StudyError(error["message"])
            raise StudyError(f"the measurement process could not build workload {self.source!r}: {error['message']}")

    def measure(
        self, config: TrainConfig, *, steps: int, warmup: int, memory_budget: int | None, timeout: float
    ) -> Measurement:
        """Measure ``config``; raise :class:`MeasurementFailed` if it errs, crashes or takes too long."""
        self.start()
        assert self._conn is not None
        self._conn.send_bytes(
            encode(command("measure", config=config.to_dict(), steps=steps, warmup=warmup, memory_budget=memory_budget))
        )
        reply = self._receive(timeout, what="the measurement")
        if "error" in reply:
            error = reply["error"]
            if error["type"] == "WorkloadError":  # the workload is broken for every config: the study stops
                raise WorkloadError(error["message"])
            raise MeasurementFailed(f"{error['type']}: {error['message']}")
        return Measurement.from_dict(reply["ok"])

    def check(self, config: TrainConfig, *, predicted: int | None = None, timeout: float) -> StepPeak:
        """One check step of the memory model in the child, on its device
        (:func:`autotune.memory.check.check_step`): the peak, or why the step failed. Raises
        :class:`MeasurementFailed` only if the child crashes or takes longer than ``timeout``."""
        from autotune.memory.check import StepPeak

        self.start()
        assert self._conn is not None
        self._conn.send_bytes(encode(command("check", config=config.to_dict(), predicted=predicted)))
        reply = self._receive(timeout, what="the memory check step")
        if "error" in reply:
            raise MeasurementFailed(f"{reply['error']['type']}: {reply['error']['message']}")
        ok = reply["ok"]
        return StepPeak(ok["measured"], ok["failure"], ok["out_of_memory"])

    def retime(
        self,
        configs: list[TrainConfig],
        *,
        scales: list[float],
        timeout: float,
        rounds: int = 3,
        max_rounds: int = 6,
    ) -> Retimed:
        """Re-time ``configs`` side by side in the child
        (:func:`autotune.measurement.sidebyside.retime_configs`, ``rounds`` to ``max_rounds``
        rounds); raise :class:`MeasurementFailed` if it errs, crashes or takes longer than
        ``timeout`` seconds."""
        from autotune.measurement.sidebyside import Retimed

        self.start()
        assert self._conn is not None
        message = command(
            "retime", configs=[c.to_dict() for c in configs], scales=scales, rounds=rounds, max_rounds=max_rounds
        )
        self._conn.send_bytes(encode(message))
        reply = self._receive(timeout, what="the re-timing")
        if "error" in reply:
            raise MeasurementFailed(f"{reply['error']['type']}: {reply['error']['message']}")
        return Retimed.from_dict(reply["ok"])

    def compare_compiled(self, config: TrainConfig, *, memory_budget: int | None, timeout: float) -> CompileCheck:
        """Time ``config`` eager and compiled side by side in the child
        (:func:`autotune.measurement.compiled.compare_compiled`, mode ``default``); raise
        :class:`MeasurementFailed` if it errs, crashes or takes longer than ``timeout`` seconds."""
        from autotune.measurement.compiled import CompileCheck

        self.start()
        assert self._conn is not None
        self._conn.send_bytes(encode(command("compile", config=config.to_dict(), memory_budget=memory_budget)))
        reply = self._receive(timeout, what="the compile check")
        if "error" in reply:
            raise MeasurementFailed(f"{reply['error']['type']}: {reply['error']['message']}")
        return CompileCheck.from_dict(reply["ok"])

    def _receive(self, timeout: float, *, what: str) -> dict[str, Any]:
        assert self._conn is not None and self._process is not None
        try:
            if self._conn.poll(timeout):
                return decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            pass  # the child died: report its exit code below
        if self._process.is_alive():
            self.close(grace=0.0)
            raise MeasurementFailed(f"{what} exceeded the time limit of {timeout:g} s and was killed")
        code = self._process.exitcode
        self.close(grace=0.0)
        raise MeasurementFailed(f"the measurement process died during {what} (exit code {code})")

    def close(self, *, grace: float = EXIT_GRACE) -> None:
        """End the child (if any) and forget it; the next measure starts a new one.

        The pipe closes first: an idle child reads its end and exits on its own, its exit
        handlers run (inductor's compile workers, started by a compiled step, shut down instead of
        leaving a leaked semaphore for Python to warn of at exit). One that has not exited
        within ``grace`` seconds (busy past a time limit, or on Ctrl-C: 0) is killed.
        """
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        self._building = False
        if self._process is not None:
            if grace > 0:
                self._process.join(timeout=grace)
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=10)
            self._process = None

    def __enter__(self) -> MeasurementProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(grace=EXIT_GRACE if exc_type is None else 0.0)  # Ctrl-C or an error: at once


class _sigint_ignored:
    """SIGINT ignored while a child is spawned (main thread only: elsewhere signals cannot be set)."""

    def __enter__(self) -> None:
        self.previous = None
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, signal.SIG_IGN)

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


# ---- the child ---------------------------------------------------------------------------------


def _serve(
    conn: Connection, source: str, threads: int | None, device: str | None, parent_pid: int, alloc_conf: str | None
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and kills this process
    if alloc_conf is not None:  # before anything touches CUDA: the allocator reads it once
        os.environ[ALLOC_CONF_VAR] = alloc_conf
    # The pipe tells the child its parent is gone only when it next reads; a measurement may run
    # for minutes.
    watch_parent(parent_pid, exit_code=3)
    import torch

    from autotune.procs.measure import measure

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        workload = _build(source, device)
    except AutotuneError as e:
        conn.send_bytes(encode(error_reply(e)))
        return
    conn.send_bytes(encode({"ok": "ready"}))
    while True:
        try:
            message = decode(conn.recv_bytes())
        except EOFError:
            return
        args = message["args"]
        if message["op"] == "retime":
            conn.send_bytes(encode(_retime(workload, args, device)))
            continue
        if message["op"] == "check":
            conn.send_bytes(encode(_check(workload, args, device)))
            continue
        if message["op"] == "compile":
            conn.send_bytes(encode(_compile(workload, args, device)))
            continue
        try:
            config = TrainConfig.from_dict(args["config"])
            m = measure(
                workload,
                config,
                steps=args["steps"],
                warmup=args["warmup"],
                memory_budget=args["memory_budget"],
                device=device,
            )
        except AutotuneError as e:  # WorkloadError ends the study; anything else fails the trial
            conn.send_bytes(encode(error_reply(e)))
            continue
        conn.send_bytes(encode({"ok": m.to_dict()}))


def _retime(workload: Any, args: dict[str, Any], device: str | None) -> dict[str, Any]:
    from autotune.measurement.sidebyside import retime_configs

    try:
        configs = [TrainConfig.from_dict(c) for c in args["configs"]]
        timed = retime_configs(
            workload,
            configs,
            scales=args["scales"],
            device=device,
            rounds=args["rounds"],
            max_rounds=args["max_rounds"],
        )
        return {"ok": timed.to_dict()}
    except AutotuneError as e:
        return error_reply(e)


def _compile(workload: Any, args: dict[str, Any], device: str | None) -> dict[str, Any]:
    from autotune.measurement.compiled import compare_compiled

    try:
        config = TrainConfig.from_dict(args["config"])
        check = compare_compiled(workload, config, device=device, memory_budget=args["memory_budget"])
    except (AutotuneError, RuntimeError) as e:  # Dynamo's and Inductor's errors, and an OOM, are RuntimeErrors
        return error_reply(e)
    return {"ok": check.to_dict()}


def _check(workload: Any, args: dict[str, Any], device: str | None) -> dict[str, Any]:
    from autotune.memory.check import check_step

    try:
        config = TrainConfig.from_dict(args["config"])
        peak = check_step(workload, config, device=device, predicted=args.get("predicted"))
    except AutotuneError as e:  # the user's data at fault (its worst case): the study says so
        return error_reply(e)
    return {"ok": peak._asdict()}


def _build(source: str, device: str | None) -> Any:
    from autotune.knobs import smallest_micro_batch
    from autotune.procs.measure import measure
    from autotune.resolve import load_workload

    try:
        workload = load_workload(source)
    except AutotuneError as e:
        raise StudyError(f"the measurement process could not build workload {source!r}: {e}") from e
    # One throwaway measurement pays the process's one-time costs (the device's context and
    # libraries, the autograd engine's threads: the first measurement of gpt-tiny ran at half the
    # throughput of later ones), which would otherwise be charged to the first trial, a baseline;
    # each trial's own warm-up steps pay what depends on its shapes. At the smallest micro-batch the
    # workload allows: at the whole batch in fp32, GPT-2 small at sequence 1024 (batch 32) holds
    # 52 GiB, past a 24 GB card, and past a 24 GiB host, whose kernel killed this process.
    micro = smallest_micro_batch(workload.batch_size, workload.micro_batch_floor)
    warm = TrainConfig(micro_batch_size=min(micro, workload.dataset_size or micro))
    # A failure of this one configuration is for the trials that reach it to say.
    with contextlib.suppress(TrainingError):
        measure(workload, warm, steps=1, warmup=1, device=device)
    return workload
