"""The progress callback of a measurement, shared by the local and the multi-rank schedule.

Its own module so that imports point one way: :mod:`.measuring` dispatches to :mod:`.multirank`,
and both report progress with this type.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["ProgressFn"]

#: ``progress(phase, done, total)``: phase is "warmup", "memory" or "timed".
ProgressFn = Callable[[str, int, int], None]
