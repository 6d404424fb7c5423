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
level away in the environment's own tables (:meth:`Climb.neighbours`: THE neighbourhood,
:func:`autotune.knobs.neighbours`, through the level tables), the first that no step has
visited or been refused and that the environment admits within the budget. A neighbour that
measures better is the next incumbent, and the move that reached it is tried again first from
there (a pattern move: recompute one level less, then one less again). With every neighbour of
the incumbent tried, the climb goes on from the next best step's. The climb acts through the
environment's action space, as the policy does, so the episode's rewards, records and re-timing
are the same for its steps.

The climb also moves the selective recompute level (:attr:`~autotune.knobs.Knobs.selective_blocks`,
the action's sixth entry) and the outer precision (:attr:`~autotune.knobs.Knobs.outer_low_precision`:
the embeddings, final norm, head and loss in the reduced precision too; every block and the outer
parts in it is Hugging Face's ``bf16=True``; the seventh entry), ordinary entries of the action
space as the policy's are. Their moves come after every other, the outer one last, so the climb's
first steps are the ones it took before those knobs existed.

A move to more reduced-precision blocks, or of the outer parts into it, is not the climb's where
the environment measured a reduced-precision step at
:data:`~autotune.search.precisions.DOMINATED_SLOWDOWN` times the fp32 step or more at reset
(the study's rule for leaving a precision out of its space): such a move loses at least the
throughput it saves per GiB, and on a CPU without bf16 units it cost the climb one or two of its
few steps (shared-encoder, docs/benchmark-log.md). The policy may still move there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.envs._codec import ACCUM_LEVELS, MICRO_LEVELS, Levels, level_counts, levels_near

from autotune.knobs import Knobs, neighbours
from autotune.search.precisions import DOMINATED_SLOWDOWN
from autotune.search.refine import pattern_first

if TYPE_CHECKING:
    from autotune.envs.core import TuningEnv

__all__ = ["Climb", "level_neighbours", "settled"]

_FIELDS = ("accum", "micro", "precision", "checkpoint", "zero_stage", "selective", "outer")


def _distance(a: Levels, b: Levels) -> int:
    return sum(abs(getattr(a, f) - getattr(b, f)) for f in _FIELDS)


def level_neighbours(
    levels: Levels,
    *,
    num_blocks: int,
    ranks: int = 1,
    max_zero_stage: int = 0,
    selective: bool = False,
    outer: bool = False,
) -> list[Levels]:
    """The knob levels one knob one level away from ``levels`` at the same effective batch:
    :func:`autotune.knobs.neighbours` through the level tables (their power-of-two splits,
    quarters of the blocks, the ZeRO stages up to ``max_zero_stage`` on ranks), in its order.
    Where two levels cover the same count of blocks (a model of fewer than four), the move goes
    to the next count. The climb's (:meth:`Climb.neighbours`) and an
    adaptive run's policy source's (:class:`autotune.adapt.policy_source.PolicySource`).

    Args:
        levels: Where to move from.
        num_blocks: The model's blocks.
        ranks: The run's ranks (the ZeRO stage moves only on more than one).
        max_zero_stage: The highest ZeRO stage a move may reach.
        selective: Whether the selective recompute level moves too; its moves come after every
            other (the climb's: its few steps go where they went before the level existed until
            those are tried).
        outer: Whether the outer precision moves too (:attr:`Levels.outer`); its moves come
            after every other, the selective ones included, for the same reason. Without it the
            outer precision stays where ``levels`` has it.

    Returns:
        The neighbours, each once.
    """
    per_rank = levels.effective_batch_size
    micro = [m for m in MICRO_LEVELS if per_rank % m == 0 and per_rank // m in ACCUM_LEVELS]
    around = neighbours(
        levels.knobs(num_blocks, ranks=ranks),
        micro_batches=micro,
        block_counts=level_counts(num_blocks),
        zero_stages=range(max_zero_stage + 1) if ranks > 1 else (),
        outer=outer,
        selective=selective,
    )
    here = levels.knobs(num_blocks, ranks=ranks)
    # Stable: the old moves, then the selective ones, then the outer ones, each part in its order.
    around.sort(
        key=lambda k: (k.outer_low_precision != here.outer_low_precision, k.selective_blocks != here.selective_blocks)
    )
    return [levels_near(k, levels, num_blocks) for k in around]


class Climb:
    """Chooses the climb's actions on ``env`` (:class:`~autotune.envs.core.TuningEnv`), after its reset.

    Call :meth:`action` before each climb step with every step's knobs and value by the episode's
    objective so far (:meth:`autotune.policies.episode.Episode.value`; None where the step did not
    count: over the budget or a non-finite loss), and
    :meth:`stepped` after every step with the knobs the environment is on.

    Its public surface speaks :class:`~autotune.knobs.Knobs`; inside, it compares the
    environment's levels (its codec's cursor, ``autotune/envs/_codec.py``), as it always has: on a
    model of fewer than four blocks two levels cover the same blocks, and an action moves from
    the level the environment is on.
    """

    def __init__(self, env: TuningEnv) -> None:
        self.env = env
        self._tried: set[Levels] = set()  # visited, refused, or chosen as a target
        self._target: Levels | None = None
        self._came_from: dict[Levels, Levels] = {}  # a target -> the incumbent it neighbours
        self._expected: Levels | None = None
        self._seen: dict[Knobs, Levels] = {}  # knobs -> the level the environment was last on there
        self._trail: list[Levels] = []  # the level of each step since the climb was made
        self._trail.append(self._seen_levels(env))

    @property
    def target(self) -> Knobs | None:
        """The knobs the climb is moving toward (None before its first action, or with none left)."""
        return None if self._target is None else self._knobs(self._target)

    def action(self, measured: Sequence[tuple[Knobs, float | None]]) -> tuple[int, ...] | None:
        """The next action toward the incumbent's first untried admitted neighbour; None when there
        is none (every neighbour tried or over the budget) or nothing measured counts yet."""
        levelled = [(levels, value) for levels, (_, value) in zip(self._levels_of(measured), measured, strict=True)]
        self._tried.update(levels for levels, _ in levelled)
        current = self.env._cursor
        if self._target is None or self._target == current:
            self._target = self._next_target(levelled)
        while self._target is not None:
            action = self._toward(current, self._target)
            if action is not None:
                self._expected = self.env._next_levels(action)
                return action
            self._target = self._next_target(levelled)  # unreachable from here in the tables
        return None

    def neighbours(self, knobs: Knobs) -> list[Knobs]:
        """The knobs one knob one level away from ``knobs`` at the same effective batch
        (:func:`autotune.knobs.neighbours` through the environment's tables: its power-of-two
        splits, quarters of the blocks, its ZeRO stages on ranks), in its order: a larger
        micro-batch, one recompute level less, one reduced-precision level more, one ZeRO stage
        lower; then the reverses; then the moves of the selective level in the same order (a full
        level selective instead, one selective level less, and their reverses); then the outer
        precision's one move (into the reduced precision, or back to fp32). The selective and outer
        moves come last so that the climb's few steps go where they went before those knobs
        existed until those are tried: adding them never takes a step from them. Where
        two levels cover the same count of blocks (a model of fewer than four), the move goes to
        the next count."""
        return [self._knobs(levels) for levels in self._neighbours(self._levels(knobs))]

    def stepped(self, knobs: Knobs) -> None:
        """The environment is on ``knobs`` after the step: a move it refused is never tried again."""
        levels = self._seen_levels(self.env)
        self._trail.append(levels)
        assert self._knobs(levels) == knobs, f"stepped({knobs}) but the environment is on {self.env.knobs}"
        if self._expected is not None and levels != self._expected:
            self._tried.add(self._expected)
            self._target = None
        self._tried.add(levels)
        self._expected = None

    # ---- the levels, private -------------------------------------------------------------------------

    def _seen_levels(self, env: TuningEnv) -> Levels:
        """The environment's cursor, remembered as the level its knobs were last seen at."""
        levels = env._cursor
        self._seen[self._knobs(levels)] = levels
        return levels

    def _levels_of(self, measured: Sequence[tuple[Knobs, float | None]]) -> list[Levels]:
        """The levels of ``measured``'s steps: the ones the environment was on, where ``measured``
        is the episode's steps since the climb was made (two steps on the same knobs may be on two
        levels, and each keeps its own neighbours); else each knobs' own (:meth:`_levels`)."""
        knobs = [k for k, _ in measured]
        if knobs == [self._knobs(levels) for levels in self._trail]:
            return list(self._trail)
        return [self._levels(k) for k in knobs]

    def _levels(self, knobs: Knobs) -> Levels:
        """``knobs`` as the level the environment was on when it was on them (else the nearest
        the environment's cursor)."""
        seen = self._seen.get(knobs)
        return seen if seen is not None else levels_near(knobs, self.env._cursor, self.env.num_blocks)

    def _knobs(self, levels: Levels) -> Knobs:
        return levels.knobs(self.env.num_blocks, ranks=self.env.ranks)

    def _neighbours(self, levels: Levels) -> list[Levels]:
        return level_neighbours(
            levels,
            num_blocks=self.env.num_blocks,
            ranks=self.env.ranks,
            max_zero_stage=self.env.max_zero_stage,
            selective=True,
            outer=True,
        )

    def _next_target(self, measured: Sequence[tuple[Levels, float | None]]) -> Levels | None:
        counted = [(value, -i, levels) for i, (levels, value) in enumerate(measured) if value is not None]
        # The best value first (the earliest step on a tie); when every neighbour of the best
        # is tried, the next best's: one noisy step can make a setting the best whose neighbours
        # are all worse (lstm-lm: 2x8 over 4x4, whose recompute neighbours were the grid's best),
        # and the episode's remaining steps are better spent next to the runner-up than refused.
        ranked: list[Levels] = []
        for _, _, levels in sorted(counted, reverse=True):
            if levels not in ranked:
                ranked.append(levels)
        machine = self.env.machine
        slow_reduced = machine is not None and machine.reduced_speed * DOMINATED_SLOWDOWN <= 1.0
        for incumbent in ranked:
            candidates = self._neighbours(incumbent)
            for candidate in pattern_first(candidates, self._came_from.get(incumbent), incumbent):
                more_reduced = candidate.precision > incumbent.precision or candidate.outer > incumbent.outer
                if candidate in self._tried or (slow_reduced and more_reduced):
                    continue
                self._tried.add(candidate)
                if self.env._verdict(candidate).admitted:
                    self._came_from[candidate] = incumbent
                    return candidate
        return None

    def _toward(self, current: Levels, target: Levels) -> tuple[int, ...] | None:
        """The action whose knobs come nearest ``target``, touching the fewest knobs (None if none
        comes nearer than here). Every action of the space is tried, the outer entry's three only
        where ``target``'s outer precision is not ``current``'s (otherwise it keeps): 972
        (2,916) actions, no training."""
        *nvec, _ = (int(n) for n in self.env.action_space.nvec)  # type: ignore[attr-defined]
        keep = (1, 1, 1, 1, current.zero_stage, 1, 1)
        outer = range(3) if target.outer != current.outer else (1,)
        distance, _, action = min(
            (_distance(self.env._next_levels(a), target), sum(x != k for x, k in zip(a, keep, strict=True)), a)
            for a in itertools.product(*(range(n) for n in nvec), outer)
        )
        if distance >= _distance(current, target):
            return None
        return action


def settled(env: TuningEnv, action: Sequence[int]) -> bool:
    """Whether ``action`` keeps ``env`` on the level it is on (the policy proposes to stay; on a
    model of fewer than four blocks an action may move the level and not the knobs: not settled)."""
    return env._next_levels(tuple(int(a) for a in action)) == env._cursor
