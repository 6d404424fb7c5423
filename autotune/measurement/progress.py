"""Progress: the callback of a measurement, and THE format of a setup phase's line.

Its own module so that imports point one way: :mod:`.measuring` dispatches to :mod:`.multirank`,
and both report progress with this type. The phase lines (``study``, ``tune``, ``predict``: what
each part of the setup did and its seconds) are written by :func:`phase_line` alone, so a user
never waits in silence and every such line ends the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["ProgressFn", "loaded_line", "phase_line", "since"]

#: ``progress(phase, done, total)``: phase is "warmup", "memory" or "timed".
ProgressFn = Callable[[str, int, int], None]


def since(start: float) -> str:
    """The seconds since ``start`` (a :func:`time.perf_counter` reading), as ``"1.2 s"``."""
    return f"{time.perf_counter() - start:.1f} s"


def phase_line(what: str, start: float, detail: str | None = None) -> str:
    """One phase's line: ``what (detail, 1.2 s)``, or ``what (1.2 s)`` without ``detail``.

    Args:
        what: What the phase did (``"workload gpt-tiny loaded: 1,263,616 parameters"``).
        start: The :func:`time.perf_counter` reading when the phase began.
        detail: How it did it (``"one fake-tensor forward"``), said before the seconds.

    Returns:
        The line, seconds to one decimal.
    """
    return f"{what} ({'' if detail is None else f'{detail}, '}{since(start)})"


def loaded_line(workload: Workload, start: float) -> str:
    """The first phase's line: ``workload gpt-tiny loaded: 1,263,616 parameters, 6 blocks (0.1 s)``."""
    blocks = len(workload.block_names())
    return phase_line(
        f"workload {workload.name} loaded: {workload.num_parameters:,} parameters, {blocks} blocks", start
    )
