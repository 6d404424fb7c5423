"""A busy machine, said once before anything is timed.

With as many torch threads as cores, OpenMP threads spin-wait at every barrier for the one the
scheduler took off its core; when another process competes for the cores a step can take 10x
longer (measured on 2 cores: gpt-tiny 0.1 s -> 3.2 s per step), and timings that decide between
configurations become noise. The 1-minute load average, read before the command's own steps run,
counts the other processes' runnable threads; with the threads torch will use it says whether
the cores are oversubscribed. ``study``, ``tune`` and ``train`` print :func:`busy_warning`'s line
once at their start; ``--threads`` (fewer threads than cores) is the remedy it names.

While timing, :class:`autotune.measurement.sidebyside.CoreLoad` measures what other processes
actually used (the output's ``busy machine: other processes used ...`` line).
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["LOAD_VAR", "OTHER_LOAD", "busy_warning", "load_average", "warn_if_busy"]

#: Half a runnable thread on average: another process, not the kernel's housekeeping.
OTHER_LOAD = 0.5
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
) -> str | None:
    """Say :func:`busy_warning`'s line through ``note`` if the machine is busy (``load`` and
    ``cores`` default to this machine's); returns the line or None."""
    line = busy_warning(load if load is not None else load_average(), threads=threads, cores=cores or _cores())
    if line is not None:
        note(line)
    return line


def _cores() -> int:
    # The cores this process may run on (a container's or taskset's share), not the machine's.
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1
