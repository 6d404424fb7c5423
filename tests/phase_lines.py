"""The setup phases' lines a command says on stderr before its result (each ends with its seconds,
``... (1.2 s)``: autotune.measurement.progress.phase_line and the memory checks' lines)."""

from __future__ import annotations

import re

#: One phase line (its seconds at its end).
PHASE = re.compile(r".* \((?:.*, )?\d+\.\d s\)")


def without_phase_lines(err: str) -> str:
    """``err`` with its leading phase lines removed; every line before the rest must be one."""
    lines = err.splitlines(keepends=True)
    n = 0
    while n < len(lines) and PHASE.fullmatch(lines[n].rstrip("\n")) and not lines[n].startswith("autotune "):
        n += 1
    return "".join(lines[n:])
