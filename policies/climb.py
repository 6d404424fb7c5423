"""The end of a ``tune`` episode: a greedy climb from the best configuration the episode measured.

A policy's episode is eight steps, and a policy that has settled stays where it is: its remaining
steps measure the configuration it already measured. On hf-gpt2 the shipped policy settled on
2x8 bf16 with every block recomputed and never measured the same split without recompute, the
best configuration of the exhaustive grid (the picks benchmark, docs/benchmark-log.md). The study
ends the same way for the same reason (:mod:`autotune.search.refine`): a short search needs its
last measurements next to its best one.

So an episode's last :func:`~autotune.search.refine.refine_trials` steps, and every step after the
policy proposes to stay or a move the environment refuses (the run stays, and so does the
observation the policy acts on), are the climb's: it moves toward one *neighbour* of the incumbent (the
step best by the episode's objective so far: per GiB, or samples/s within the budget), one knob one
level away in the environment's own tables (:func:`neighbours`), the first that no step has
visited or been refused and that the environment admits within the budget. A neighbour that
measures better is the next incumbent, and the move that reached it is tried again first from
there (a pattern move: recompute one level less, then one less again). With every neighbour of
the incumbent tried, the climb goes on from the next best step's. The climb acts through the
environment's action space, as the policy does, so the episode's rewards, records and re-timing
are the same for its steps.

A move to more reduced-precision blocks is not the climb's where the environment measured a
reduced-precision step at :data:`~autotune.search.precisions.DOMINATED_SLOWDOWN` times the fp32
step or more at reset (the study's rule for leaving a precision out of its space): such a move
loses at least the throughput it saves per GiB, and on a CPU without bf16 units it cost the climb
one or two of its few steps (shared-encoder, docs/benchmark-log.md). The policy may still move there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.knobs import KnobLevels, apply_action
from autotune.search.precisions import DOMINATED_SLOWDOWN
from autotune.search.refine import pattern_first

if TYPE_CHECKING:
    from autotune.envs.core import TuningEnv

__all__ = ["Climb", "neighbours", "settled"]

_FIELDS = ("accum", "micro", "precision", "checkpoint", "zero_stage")


def neighbours(levels: KnobLevels, *, max_zero_stage: int) -> list[KnobLevels]:
    """The knobs one move of one knob away from ``levels`` at the same effective batch, moves that
    usually raise throughput first (the order of the study's refinement): a larger micro-batch, one
    recompute level less, one reduced-precision level more, one ZeRO stage lower; then the reverses."""
    z = levels.zero_stage
    moves = [(0, 1, 1, 1, z), (1, 1, 1, 0, z), (1, 1, 2, 1, z)]
    moves += [(1, 1, 1, 1, z - 1)] if z > 0 else []
    moves += [(2, 1, 1, 1, z), (1, 1, 1, 2, z), (1, 1, 0, 1, z)]
    moves += [(1, 1, 1, 1, z + 1)] if z < max_zero_stage else []
    out: list[KnobLevels] = []
    for move in moves:
        new = apply_action(levels, move, max_zero_stage=max_zero_stage)
        if new != levels and new not in out:
            out.append(new)
    return out


def _distance(a: KnobLevels, b: KnobLevels) -> int:
    return sum(abs(getattr(a, f) - getattr(b, f)) for f in _FIELDS)


class Climb:
    """Chooses the climb's actions on ``env`` (:class:`~autotune.envs.core.TuningEnv`).

    Call :meth:`action` before each climb step with every step's knobs and value by the episode's
    objective so far (:meth:`autotune.policies.episode.Episode.value`; None where the step did not
    count: over the budget or a non-finite loss), and
    :meth:`stepped` after it with the knobs the environment is on.
    """

    def __init__(self, env: TuningEnv) -> None:
        self.env = env
        self.tried: set[KnobLevels] = set()  # visited, refused, or chosen as a target
        self.target: KnobLevels | None = None
        self._came_from: dict[KnobLevels, KnobLevels] = {}  # a target -> the incumbent it neighbours
        self._expected: KnobLevels | None = None

    def action(self, measured: Sequence[tuple[KnobLevels, float | None]]) -> tuple[int, ...] | None:
        """The next action toward the incumbent's first untried admitted neighbour; None when there
        is none (every neighbour tried or over the budget) or nothing measured counts yet."""
        self.tried.update(levels for levels, _ in measured)
        current = self.env.levels
        if self.target is None or self.target == current:
            self.target = self._next_target(measured)
        while self.target is not None:
            action = self._toward(current, self.target)
            if action is not None:
                self._expected = self.env.next_levels(action)
                return action
            self.target = self._next_target(measured)  # unreachable from here in the tables
        return None

    def stepped(self, levels: KnobLevels) -> None:
        """The environment is on ``levels`` after the step: a move it refused is never tried again."""
        if self._expected is not None and levels != self._expected:
            self.tried.add(self._expected)
            self.target = None
        self.tried.add(levels)
        self._expected = None

    def _next_target(self, measured: Sequence[tuple[KnobLevels, float | None]]) -> KnobLevels | None:
        counted = [(value, -i, levels) for i, (levels, value) in enumerate(measured) if value is not None]
        # The best value first (the earliest step on a tie); when every neighbour of the best
        # is tried, the next best's: one noisy step can make a setting the best whose neighbours
        # are all worse (lstm-lm: 2x8 over 4x4, whose recompute neighbours were the grid's best),
        # and the episode's remaining steps are better spent next to the runner-up than refused.
        ranked: list[KnobLevels] = []
        for _, _, levels in sorted(counted, reverse=True):
            if levels not in ranked:
                ranked.append(levels)
        machine = self.env.machine
        slow_reduced = machine is not None and machine.reduced_speed * DOMINATED_SLOWDOWN <= 1.0
        for incumbent in ranked:
            candidates = neighbours(incumbent, max_zero_stage=self.env.max_zero_stage)
            for candidate in pattern_first(candidates, self._came_from.get(incumbent), incumbent):
                if candidate in self.tried or (slow_reduced and candidate.precision > incumbent.precision):
                    continue
                self.tried.add(candidate)
                if self.env.admits(candidate):
                    self._came_from[candidate] = incumbent
                    return candidate
        return None

    def _toward(self, current: KnobLevels, target: KnobLevels) -> tuple[int, ...] | None:
        """The action whose knobs come nearest ``target``, touching the fewest knobs (None if none
        comes nearer than here). Every action of the space is tried: 324, no training."""
        nvec = [int(n) for n in self.env.action_space.nvec]  # type: ignore[attr-defined]
        keep = (1, 1, 1, 1, current.zero_stage)
        distance, _, action = min(
            (_distance(self.env.next_levels(a), target), sum(x != k for x, k in zip(a, keep, strict=True)), a)
            for a in itertools.product(*(range(n) for n in nvec))
        )
        return action if distance < _distance(current, target) else None


def settled(env: TuningEnv, action: Sequence[int]) -> bool:
    """Whether ``action`` keeps ``env`` on the knobs it is on (the policy proposes to stay)."""
    return env.next_levels(tuple(int(a) for a in action)) == env.levels
