"""Where the CLI's tables and progress go: rich on a terminal, whole rows anywhere else.

Rich sizes its output to the terminal; when stdout is a file, a pipe or a CI log it falls back to
80 columns and wraps every table row over several lines ("22.48 / MiB"), which nobody can read
or grep. Off a terminal these consoles are wide enough that a table keeps one line per row at its
natural width (rich never pads a table or a line of text to the console's width), without colour
codes; live progress (bars, spinners) is for a terminal only: rich's spinners print nothing
there, and :class:`autotune.search.display.ProgressDisplay` does not start.
"""

from __future__ import annotations

from typing import IO

from rich.console import Console

__all__ = ["OFF_TERMINAL_WIDTH", "make_console"]

#: Columns off a terminal: wider than any of autotune's tables, so no row wraps.
OFF_TERMINAL_WIDTH = 1000


def make_console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console on stdout (tables, results), stderr (``stderr=True``: notes, progress) or ``file``.

    On a terminal: rich's own (the terminal's width, colour). Anywhere else: ``OFF_TERMINAL_WIDTH``
    columns, so each table row stays on one line.
    """
    # markup=False: autotune's lines are plain text, and rich would take the extra in
    # "pip install 'torch-autotune[hf]'" for a style tag and print it without "[hf]".
    out = Console(stderr=stderr, file=file, markup=False)
    if out.is_terminal:
        return out
    return Console(stderr=stderr, file=file, width=OFF_TERMINAL_WIDTH, markup=False)
