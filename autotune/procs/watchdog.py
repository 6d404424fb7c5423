"""The one parent-death watchdog of every child process autotune starts.

A child blocked in a collective, or in minutes of training, does not notice that its parent died
until it next talks to it (never, inside a hung all-reduce). A daemon thread polls the parent and
ends the child with ``os._exit`` (no cleanup that could block) once the parent is gone.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

__all__ = ["start_time", "watch_parent"]


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of ``/proc/PID/stat``), or None when it is gone.

    A pid can be reused by a new process after the old one exits; the pair (pid, start time) cannot.
    """
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (not Linux): existence only
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "alive"


def watch_parent(pid: int, *, exit_code: int, interval: float = 1.0) -> None:
    """End this process with ``exit_code`` when process ``pid`` (its parent) is gone."""
    started = start_time(pid)

    def watch() -> None:
        while start_time(pid) == started:
            time.sleep(interval)
        os._exit(exit_code)

    threading.Thread(target=watch, name="autotune-parent-watchdog", daemon=True).start()
