"""A fake run's series cut into windows (see :data:`~autotune.memory.profile_record.Windows`), each
kept as the moments that are its maximum at some micro-batch size (the upper envelope of their
lines through the profile's two sizes)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from fractions import Fraction

from autotune.memory.fake_run import Run
from autotune.memory.profile_record import Moment, Window, Windows

__all__ = ["paired_windows"]


def paired_windows(a: Run, b: Run, sizes: tuple[int, int], bucket: int) -> Windows:
    """Cut both runs' series into windows (see ``Windows``) and keep in each the moments that are
    its maximum at some micro-batch size."""
    if len(a.series) != len(b.series) or a.cuts != b.cuts:
        # The sizes ran different operations (shape-dependent code): no line per moment, only
        # each size's own maximum.
        return tuple(_window(p, bucket) for p in _cut(a)), tuple(_window(p, bucket) for p in _cut(b))
    pairs = [_window_pair(p, q, sizes, bucket) for p, q in zip(_cut(a), _cut(b), strict=True)]
    return tuple(x for x, _ in pairs), tuple(y for _, y in pairs)


def _cut(run: Run) -> list[list[Moment]]:
    n = len(run.blocks.saved)
    cuts = run.cuts if run.cuts is not None else [len(run.series)] * (3 * n + 1)  # all in the first
    bounds = [0, *cuts, len(run.series)]
    return [run.series[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def _window(part: list[Moment], bucket: int) -> Window:
    """The window of one size alone: its maximum by each measure."""
    late = [x for x in part if x.gradients >= bucket]
    peak = [max(part, key=lambda x: (x.activations + x.temporaries, -x.gradients))] if part else []
    kept = [max(part, key=lambda x: x.activations + x.temporaries + x.gradients)] if part else []
    reducing = [max(late, key=lambda x: (x.activations + x.temporaries, -x.gradients))] if late else []
    return Window(tuple(peak), tuple(kept), tuple(reducing))


def _window_pair(p: list[Moment], q: list[Moment], sizes: tuple[int, int], bucket: int) -> tuple[Window, Window]:
    def pick(measure: Callable[[Moment], int], among: list[int]) -> list[int]:
        lines = [(measure(p[t]), measure(q[t]), -q[t].gradients) for t in among]
        return [among[k] for k in _envelope(lines, sizes)]

    every = list(range(len(p)))
    late = [t for t in every if p[t].gradients >= bucket]  # gradients do not depend on the batch
    chosen = (
        pick(lambda x: x.activations + x.temporaries, every),
        pick(lambda x: x.activations + x.temporaries + x.gradients, every),
        pick(lambda x: x.activations + x.temporaries, late),
    )
    return Window(*(tuple(p[t] for t in c) for c in chosen)), Window(*(tuple(q[t] for t in c) for c in chosen))


def _envelope(lines: Sequence[tuple[int, int, int]], sizes: tuple[int, int]) -> list[int]:
    """Indices of the lines that are highest at some micro-batch size m >= 1 (the upper envelope).

    Line ``t`` is ``lines[t][0]`` at ``sizes[0]`` and ``lines[t][1]`` at ``sizes[1]``, linear in m;
    ``lines[t][2]`` breaks ties (higher wins). Walked from m = 1 upwards: the highest line, then
    the line that overtakes it first, and so on (a few lines; ~100-1000 moments per window).
    """
    m0, m1 = sizes
    # One line per (value at m = 1, slope): the best tie-breaker, then the earliest moment.
    best: dict[tuple[Fraction, int], int] = {}
    for t, (a, b, tie) in enumerate(lines):
        key = (a + Fraction((b - a) * (1 - m0), m1 - m0), b - a)
        if key not in best or tie > lines[best[key]][2]:
            best[key] = t
    # Pareto front: a line lower at m = 1 and no steeper than another is never highest.
    front: list[tuple[Fraction, int, int]] = []
    for (start, slope), t in sorted(best.items(), key=lambda kv: (-kv[0][1], -kv[0][0])):
        if not front or start > front[-1][0]:
            front.append((start, slope, t))
    if not front:
        return []
    current = max(front, key=lambda x: (x[0], x[1]))
    chosen = [current[2]]
    while True:
        steeper = [x for x in front if x[1] > current[1]]
        if not steeper:
            return chosen
        # Where each steeper line overtakes the current one (on or after the current m).
        current = min(steeper, key=lambda x: ((current[0] - x[0]) / (x[1] - current[1]), -x[1]))
        chosen.append(current[2])
