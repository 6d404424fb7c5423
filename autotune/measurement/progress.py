"""Progress: the callback of a measurement, and THE format of a setup phase's line.

Its own module so that imports point one way: :mod:`.measuring` dispatches to :mod:`.multirank`,
and both report progress with this type. The phase lines (``study``, ``tune``, ``predict``: what
each part of the setup did and its seconds) are written by :func:`phase_line` alone, so a user
never waits in silence and every such line ends the same way.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["Note", "PhaseClock", "ProgressFn", "loaded_line", "notes", "phase_line", "quiet", "ranked_line", "since"]

#: ``progress(phase, done, total)``: phase is "warmup", "memory" or "timed".
ProgressFn = Callable[[str, int, int], None]

#: ``note(line)``: one setup phase's line (:func:`phase_line`), said as the phase ends.
Note = Callable[[str], None]


def quiet(line: str) -> None:
    """A :data:`Note` that says nothing."""


def _to_stderr(line: str) -> None:
    print(f"autotune: {line}", file=sys.stderr, flush=True)


def notes(progress: bool | Note) -> Note:
    """The :data:`Note` of a ``progress`` argument (:class:`autotune.Adaptive`, the callbacks).

    Args:
        progress: True: each line on stderr, after ``autotune:`` (in the user's own script the
            lines say whose they are); False: none; a callable: each line, as it is.

    Returns:
        The note.
    """
    if callable(progress):
        return progress
    return _to_stderr if progress else quiet


def ranked_line(start: float) -> str:
    """The block ranking's line (a study's, an adaptive run's): ``blocks ranked by the activation
    bytes they save (one fake-tensor forward, 0.9 s)``."""
    return phase_line("blocks ranked by the activation bytes they save", start, "one fake-tensor forward")


class PhaseClock:
    """A :data:`Note` of phase lines from calls made as each phase *begins* (the simulator's
    calibration says ``"step times under seven configurations"`` before it times them): the line of
    a phase, with its seconds, is said when the next one begins, and the last one's by :meth:`end`.

    Args:
        note: Where the lines go.
        prefix: Before each phase's words (``"start plan: "``).

    Example:
        >>> lines = []
        >>> clock = PhaseClock(lines.append, "start plan: ")
        >>> clock("memory of the default configuration")
        >>> clock("step times under seven configurations")
        >>> clock.end()
        >>> [line.rpartition(" (")[0] for line in lines]
        ['start plan: memory of the default configuration', 'start plan: step times under seven configurations']
    """

    def __init__(self, note: Note, prefix: str = "") -> None:
        self.note, self.prefix = note, prefix
        self._phase: tuple[str, float] | None = None

    def __call__(self, what: str) -> None:
        self.end()
        self._phase = (what, time.perf_counter())

    def end(self) -> None:
        """Say the phase under way, if any."""
        if self._phase is not None:
            what, start = self._phase
            self._phase = None
            self.note(phase_line(f"{self.prefix}{what}", start))


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
