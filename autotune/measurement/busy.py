"""A busy machine, said once before anything is timed.

With as many torch threads as cores, OpenMP threads spin-wait at every barrier for the one the
scheduler took off its core; when another process competes for the cores a step can take an order
of magnitude longer, and timings that decide between
configurations become noise. The 1-minute load average, read before the command's own steps run,
counts the other processes' runnable threads; with the threads torch will use it says whether
the cores are oversubscribed. ``study``, ``tune`` and ``train`` print :func:`busy_warning`'s line
once at their start; ``--threads`` (fewer threads than cores) is the remedy it names.

The load average is an exponentially decaying mean: a minute after a test suite or a build
ends it still reads over one. So when it says busy, :func:`warn_if_busy` samples what other
processes use of the cores right now (:class:`CoreLoad`, a quarter of a second) and stays
silent when that is under half a core: the machine was busy, and no longer is. While timing,
:class:`CoreLoad` measures what other processes actually used (the output's ``busy machine:
other processes used ...`` line).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

__all__ = ["LOAD_VAR", "OTHER_LOAD", "CoreLoad", "busy_warning", "load_average", "warn_if_busy"]

#: Half a runnable thread on average: another process, not the kernel's housekeeping.
OTHER_LOAD = 0.5
#: How long :func:`warn_if_busy` samples the cores when the load average says busy.
SAMPLE_SECONDS = 0.25
#: A fixed load-average reading instead of the machine's (``0``: never warn). Tests set it, so the
#: outputs they compare exactly do not depend on what else runs on the machine.
LOAD_VAR = "AUTOTUNE_LOAD_AVERAGE"


def load_average() -> float | None:
    """The 1-minute load average (or :data:`LOAD_VAR`'s reading), None where the platform has none."""
    fixed = os.environ.get(LOAD_VAR)
    if fixed is not None:
        try:
            return float(fixed)
        except ValueError:
            from autotune.errors import ConfigError

            raise ConfigError(f"{LOAD_VAR} must be a number, but got {fixed!r}.") from None
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # Windows has no getloadavg
        return None


def busy_warning(load: float | None, *, threads: int, cores: int) -> str | None:
    """One line when other processes (``load``, the load average before our own steps) and
    ``threads`` torch threads oversubscribe ``cores``, else None."""
    if load is None or load < OTHER_LOAD or load + threads <= cores:
        return None
    fewer = max(1, cores - round(load))
    plural = "s" if threads != 1 else ""
    return (
        f"busy machine: load average {load:.1f} on {cores} cores; timings will be noisy ({threads} torch "
        f"thread{plural} and the other processes oversubscribe the cores: OpenMP threads wait on each other); "
        f"fewer threads time steadier, see --threads (e.g. --threads {fewer})"
    )


def warn_if_busy(
    threads: int,
    note: Callable[[str], None],
    *,
    load: float | None = None,
    cores: int | None = None,
    now: Callable[[], float | None] | None = None,
) -> str | None:
    """Say :func:`busy_warning`'s line through ``note`` if the machine is busy (``load`` and
    ``cores`` default to this machine's); returns the line or None.

    A busy load average is checked against what other processes use of the cores ``now``
    (default: a :data:`SAMPLE_SECONDS` sample of :class:`CoreLoad`; none when ``load`` or
    :data:`LOAD_VAR` fixes the reading): under :data:`OTHER_LOAD` cores, what made it busy has
    ended, and nothing is said."""
    fixed = load is not None or os.environ.get(LOAD_VAR) is not None
    line = busy_warning(load if load is not None else load_average(), threads=threads, cores=cores or _cores())
    if line is None:
        return None
    if now is None and not fixed:
        now = _sample
    if now is not None:
        others = now()
        if others is not None and others < OTHER_LOAD:
            return None
    note(line)
    return line


def _sample() -> float | None:
    load = CoreLoad.start()
    time.sleep(SAMPLE_SECONDS)
    return load.other_cores()


def _cores() -> int:
    # The cores this process may run on (a container's or taskset's share), not the machine's.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


class CoreLoad:
    """What other processes used of the cores since :meth:`start` (Linux: ``/proc/stat``'s busy
    time minus the CPU time of this process and its children; elsewhere the load average minus this
    process's threads). Our own threads and children are excluded: they are the work being timed."""

    def __init__(self, busy: float | None, own: float, wall: float) -> None:
        self._busy, self._own, self._wall = busy, own, wall

    @classmethod
    def start(cls) -> CoreLoad:
        return cls(_busy_seconds(), _own_seconds(), time.monotonic())

    def other_cores(self) -> float | None:
        """Cores' worth of CPU time other processes used per second since :meth:`start`."""
        wall = time.monotonic() - self._wall
        busy = _busy_seconds()
        if self._busy is not None and busy is not None and wall > 0.05:
            return max(0.0, (busy - self._busy - (_own_seconds() - self._own)) / wall)
        try:
            return max(0.0, os.getloadavg()[0] - 1.0)
        except OSError:
            return None


def _own_seconds() -> float:
    """CPU seconds of this process and of its live child processes: their work is ours (a study's
    measuring child builds the workload while the study checks the machine; a DataLoader's workers
    load the batches being timed)."""
    import multiprocessing

    t = os.times()  # with the children that have ended and been waited for
    live = sum(_process_seconds(p.pid) for p in multiprocessing.active_children())
    return t.user + t.system + t.children_user + t.children_system + live


def _process_seconds(pid: int | None) -> float:
    """CPU seconds of process ``pid`` so far (Linux: ``/proc/PID/stat``'s utime and stime), 0.0
    where it cannot be read (gone, or no ``/proc``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float | None:
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return (sum(ticks[:8]) - idle) / os.sysconf("SC_CLK_TCK")
