"""The climb at the end of a ``tune`` episode, on a scripted environment: exact moves, exact order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from autotune.envs._codec import Levels, knobs_to_config
from autotune.envs.core import OVER_BUDGET_PENALTY, Interval, MachineDescriptor, ModelDescriptor, TuningEnv
from autotune.policies.climb import Climb, level_neighbours
from autotune.policies.episode import run_episode

from autotune.config import TrainConfig
from autotune.knobs import Knobs

GIB = 2**30
STAY = (1, 1, 1, 1, 0, 1, 1)
START = Levels(micro=2, accum=2, precision=0, checkpoint=4)  # 4 x 4, every block recomputed


class _Terrain(TuningEnv):
    """Each knob setting trains at ``throughput(levels)`` samples/s with a peak of 1 GiB (or
    ``peak(levels)``), except where ``over`` says it is over the 2 GiB budget: with the peak of
    1 GiB the objective per GiB is the throughput."""

    def __init__(
        self,
        throughput: Callable[[Levels], float],
        over: frozenset[Levels] = frozenset(),
        reduced_speed: float = 1.0,
        peak: Callable[[Levels], int] = lambda _: GIB,
        blocks: int = 4,
    ) -> None:
        super().__init__(horizon=8)
        self.blocks = blocks
        self.throughput = throughput
        self.over = over
        self.peak = peak
        self.reduced_speed = reduced_speed
        self.trained: list[Levels] = []

    def config_of(self, knobs: Knobs) -> TrainConfig:
        return knobs.to_config(tuple(range(self.blocks)))

    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        model = ModelDescriptor(
            num_parameters=1, activation_bytes_per_sample=1.0, num_blocks=self.blocks, top_quarter_share=0.5
        )
        return START, model, MachineDescriptor(reduced_speed=self.reduced_speed, budget_ratio=2.0), 2 * GIB

    def _peak_bytes(self, knobs: Levels) -> int:
        return 3 * GIB if knobs in self.over else self.peak(knobs)

    def _train(self, knobs: Levels) -> Interval:
        self.trained.append(knobs)
        return Interval(
            batch=knobs.effective_batch_size,
            throughput=self.throughput(knobs),
            peak_bytes=self.peak(knobs),
            b_noise=None,
            loss=1.0,
            train_seconds=1.0,
            reconfig_seconds=0.0,
        )


def _k(env: TuningEnv, levels: Levels) -> Knobs:
    """``levels`` as the knobs they stand for on ``env``'s model."""
    return levels.knobs(env.num_blocks, ranks=env.ranks)


def _ks(env: TuningEnv, levels: list[Levels]) -> list[Knobs]:
    return [_k(env, x) for x in levels]


class _Policy:
    def __init__(self, actions: Callable[[int], tuple[int, ...]]) -> None:
        self.actions = actions
        self.calls = 0

    def act(self, observation: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.asarray(self.actions(self.calls))


def _less_recompute_is_faster(k: Levels) -> float:
    """Each recompute level less: +10; a micro-batch level away from 4: -5; each bf16 level: -3."""
    return 100.0 + 10 * (4 - k.checkpoint) - 5 * abs(k.micro - 2) - 3 * k.precision


def _knobs(k: Levels) -> tuple[int, int, int]:
    return (k.micro_batch_size, k.precision, k.checkpoint)


def test_a_settled_policy_hands_over_and_the_climb_walks_to_no_recompute() -> None:
    env = _Terrain(_less_recompute_is_faster)
    policy: Any = _Policy(lambda _: STAY)
    episode = run_episode(env, policy, workload="w", seed=0, steps=8, refine=2)
    # Step 1: the policy proposes to stay, so every step climbs. The larger micro-batch is tried
    # first and is worse; then one recompute level less is better, and the same move again from
    # there, down to none; then the neighbours of 4x4 without recompute.
    assert [_knobs(k) for k in env.trained] == [
        (4, 0, 4),
        (8, 0, 4),
        (4, 0, 3),
        (4, 0, 2),
        (4, 0, 1),
        (4, 0, 0),
        (8, 0, 0),
        (4, 1, 0),
        (2, 0, 0),
    ]
    assert [s.source for s in episode.steps] == [None] + ["climb"] * 8
    assert episode.best is not None and (episode.best.step, episode.best.throughput) == (5, 140.0)
    # Every climb step moved one knob: the action touches the split or one of precision and recompute.
    assert [s.action for s in episode.steps[1:3]] == [(0, 1, 1, 1, 0, 1, 1), (2, 1, 1, 0, 0, 1, 1)]


def test_without_refine_the_policy_acts_alone() -> None:
    env = _Terrain(_less_recompute_is_faster)
    policy: Any = _Policy(lambda _: STAY)
    episode = run_episode(env, policy, workload="w", seed=0, steps=8)
    assert env.trained == [START] * 9
    assert [s.source for s in episode.steps] == [None] + ["policy"] * 8
    assert episode.best is not None and episode.best.step == 0


def test_a_moving_policy_keeps_all_but_the_last_quarter() -> None:
    env = _Terrain(_less_recompute_is_faster)
    # Never settles: one micro-batch level up, then back, and so on.
    policy: Any = _Policy(lambda n: (0, 1, 1, 1, 0) if n % 2 else (2, 1, 1, 1, 0))
    episode = run_episode(env, policy, workload="w", seed=0, steps=8, refine=2)
    assert [s.source for s in episode.steps] == [None] + ["policy"] * 6 + ["climb"] * 2
    # The policy measured 4x4 and 8x2 with every block recomputed; the climb goes from 4x4, the
    # best, to its next untried neighbour (one recompute level less), then once more the same way.
    assert [_knobs(k) for k in env.trained[-2:]] == [(4, 0, 3), (4, 0, 2)]
    assert policy.calls == 8  # the policy is still asked: its action decides when it has settled


def test_a_policy_move_the_environment_refuses_hands_over_at_once() -> None:
    less_recompute = Levels(micro=2, accum=2, precision=0, checkpoint=3)
    env = _Terrain(_less_recompute_is_faster, over=frozenset({less_recompute}))
    policy: Any = _Policy(lambda _: (1, 1, 1, 0, 0))  # one recompute level less: over the budget
    episode = run_episode(env, policy, workload="w", seed=0, steps=4, refine=1)
    # Step 1 is refused (nothing trains) and the run stays on 4x4 with the same observation:
    # from step 2 on, the climb's; without the hand-over the policy would ask for the same move
    # until the last quarter. The climb never targets the refused setting.
    assert [s.source for s in episode.steps] == [None, "policy", "climb", "climb", "climb"]
    assert [_knobs(k) for k in env.trained] == [(4, 0, 4), (8, 0, 4), (4, 1, 4), (2, 0, 4)]
    assert episode.steps[1].reward == -OVER_BUDGET_PENALTY


def test_the_climb_skips_a_neighbour_over_the_budget() -> None:
    over = frozenset({Levels(micro=2, accum=2, precision=0, checkpoint=3)})
    env = _Terrain(_less_recompute_is_faster, over=over)
    policy: Any = _Policy(lambda _: STAY)
    run_episode(env, policy, workload="w", seed=0, steps=3, refine=1)
    # 8x2 (worse), then not one recompute level less (over the budget): one bf16 level more.
    assert [_knobs(k) for k in env.trained] == [(4, 0, 4), (8, 0, 4), (4, 1, 4), (2, 0, 4)]


@pytest.mark.parametrize("reduced_speed", [0.5, 0.51])
def test_where_a_reduced_step_measured_twice_the_fp32_step_the_climb_adds_no_reduced_block(
    reduced_speed: float,
) -> None:
    over = frozenset({Levels(micro=2, accum=2, precision=0, checkpoint=3)})
    env = _Terrain(_less_recompute_is_faster, over=over, reduced_speed=reduced_speed)
    policy: Any = _Policy(lambda _: STAY)
    run_episode(env, policy, workload="w", seed=0, steps=3, refine=1)
    if reduced_speed == 0.5:  # bf16 at 2x the fp32 step: 8x2, then 2x8 (an action moves the split one level)
        assert [_knobs(k) for k in env.trained] == [(4, 0, 4), (8, 0, 4), (4, 0, 4), (2, 0, 4)]
    else:  # a little faster than that: one bf16 level more is the third move, as above
        assert [_knobs(k) for k in env.trained] == [(4, 0, 4), (8, 0, 4), (4, 1, 4), (2, 0, 4)]


def test_with_every_neighbour_tried_the_step_is_the_policy_s() -> None:
    env = _Terrain(lambda k: 100.0)
    env.reset(seed=0)
    climb = Climb(env)
    tried = [(n, None) for n in climb.neighbours(_k(env, START))]  # tried, none counted
    assert climb.action([(_k(env, START), 100.0), *tried]) is None
    assert climb.action([(_k(env, START), None)]) is None  # nothing counted yet: no incumbent


def test_neighbours_in_order_at_the_ends_of_the_tables() -> None:
    env = _Terrain(lambda k: 100.0)
    env.reset(seed=0)
    corner = Levels(accum=0, micro=4, precision=0, checkpoint=4)  # 16 x 1, every block recomputed
    assert Climb(env).neighbours(_k(env, corner)) == _ks(
        env,
        [
            Levels(accum=0, micro=4, precision=0, checkpoint=3),
            Levels(accum=0, micro=4, precision=1, checkpoint=4),
            Levels(accum=1, micro=3, precision=0, checkpoint=4),
            # The selective moves after the old ones: a full level selective instead.
            Levels(accum=0, micro=4, precision=0, checkpoint=3, selective=1),
            # The outer precision's move last of all.
            Levels(accum=0, micro=4, precision=0, checkpoint=4, outer=True),
        ],
    )
    env.ranks, env.max_zero_stage = 2, 3  # ZeRO stages move on ranks
    middle = Levels(accum=1, micro=3, precision=2, checkpoint=2, zero_stage=1)
    assert Climb(env).neighbours(_k(env, middle)) == _ks(
        env,
        [
            Levels(accum=0, micro=4, precision=2, checkpoint=2, zero_stage=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=1, zero_stage=1),
            Levels(accum=1, micro=3, precision=3, checkpoint=2, zero_stage=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=2, zero_stage=0),
            Levels(accum=2, micro=2, precision=2, checkpoint=2, zero_stage=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=3, zero_stage=1),
            Levels(accum=1, micro=3, precision=1, checkpoint=2, zero_stage=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=2, zero_stage=2),
            Levels(accum=1, micro=3, precision=2, checkpoint=1, zero_stage=1, selective=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=2, zero_stage=1, selective=1),
            Levels(accum=1, micro=3, precision=2, checkpoint=2, zero_stage=1, outer=True),
        ],
    )
    # From the outer parts in bf16, the move back to fp32 (and every other move keeps them there).
    outer = Climb(env).neighbours(_k(env, Levels(accum=0, micro=4, checkpoint=4, outer=True)))
    assert outer[-1] == _k(env, corner)
    assert all(k.outer_low_precision for k in outer[:-1])


def test_on_three_blocks_a_move_skips_the_level_that_covers_the_same_blocks() -> None:
    # Levels 2 and 3 both recompute 2 of 3 blocks: one recompute level less from level 3 is the
    # next count (level 1, one block), never the same configuration under another level.
    env = _Terrain(lambda k: 100.0, blocks=3)
    env.reset(seed=0)
    here = Levels(micro=2, accum=2, precision=0, checkpoint=3)
    around = level_neighbours(here, num_blocks=3, selective=True, outer=True)  # the climb's, in levels
    assert [(k.checkpoint, k.precision, k.selective) for k in around if k.micro == here.micro] == [
        (1, 0, 0),
        (3, 1, 0),
        (4, 0, 0),
        (1, 0, 2),  # a full block selective instead: two of three levels
        (3, 0, 1),  # one selective block more
        (3, 0, 0),  # the outer parts in bf16 (the last move)
    ]
    assert around[-1].outer and not any(k.outer for k in around[:-1])
    assert len({knobs_to_config(k, (0, 1, 2)) for k in around} | {knobs_to_config(here, (0, 1, 2))}) == len(around) + 1


@pytest.mark.parametrize("refine", [0, 1])
def test_the_episode_s_json_says_who_chose_each_step(refine: int) -> None:
    env = _Terrain(_less_recompute_is_faster)
    policy: Any = _Policy(lambda _: (0, 1, 1, 1, 0))  # one move, then settled at the table's end
    episode = run_episode(env, policy, workload="w", seed=0, steps=2, refine=refine)
    sources = [s["source"] for s in episode.to_dict()["steps"]]
    assert sources == ([None, "policy", "climb"] if refine else [None, "policy", "policy"])


def test_with_every_neighbour_of_the_best_tried_the_climb_goes_on_from_the_runner_up() -> None:
    env = _Terrain(lambda k: 100.0)
    env.reset(seed=0)
    climb = Climb(env)
    around = climb.neighbours(_k(env, START))
    runner_up = around[1]  # one recompute level less than START
    measured = [(_k(env, START), 100.0)] + [(n, 95.0 if n == runner_up else None) for n in around]
    action = climb.action(measured)
    # Every neighbour of START was tried: the runner-up's first untried one, its larger
    # micro-batch, reached from START in one action (split and recompute at once).
    assert runner_up == _k(env, Levels(micro=2, accum=2, precision=0, checkpoint=3))
    target = Levels(micro=3, accum=1, precision=0, checkpoint=3)
    assert action is not None and env.next_knobs(action) == climb.target == _k(env, target)


def _recompute_saves_half_a_gib(k: Levels) -> int:
    """1 GiB with every block recomputed (level 4), half a GiB more for each level less: level 1
    (2.5 GiB) is over the 2 GiB budget."""
    return GIB + (4 - k.checkpoint) * GIB // 2


@pytest.mark.parametrize("objective", ["per-gib", "throughput"])
def test_the_climb_and_the_best_step_follow_the_objective(objective: str) -> None:
    env = _Terrain(_less_recompute_is_faster, peak=_recompute_saves_half_a_gib)
    policy: Any = _Policy(lambda _: STAY)
    episode = run_episode(env, policy, workload="w", seed=0, steps=8, refine=2, objective=objective)  # type: ignore[arg-type]
    best = episode.best
    assert best is not None
    if objective == "per-gib":  # every move from 4x4 all recomputed (100 per GiB) is worse per GiB
        assert [_knobs(k) for k in env.trained[:5]] == [(4, 0, 4), (8, 0, 4), (4, 0, 3), (4, 1, 4), (2, 0, 4)]
        assert (best.step, best.throughput, best.peak_bytes) == (0, 100.0, GIB)
    else:  # one recompute level less each time: +10 samples/s, down to level 2 (level 1 is over the budget)
        assert [_knobs(k) for k in env.trained[:4]] == [(4, 0, 4), (8, 0, 4), (4, 0, 3), (4, 0, 2)]
        assert (best.step, best.throughput, best.peak_bytes) == (3, 120.0, 2 * GIB)
    assert (4, 0, 1) not in [_knobs(k) for k in env.trained]
    assert episode.to_dict().get("objective") == (None if objective == "per-gib" else "throughput")


def test_the_climb_reaches_the_selective_level_through_a_sixth_action_entry() -> None:
    """Where every other neighbour is worse, the climb moves a full level to selective recompute:
    the action's sixth entry, applied by the environment."""

    def selective_pays(k: Levels) -> float:
        return 100.0 + 20 * k.selective - 5 * abs(k.micro - 2) - 3 * k.precision - 10 * (4 - k.checkpoint - k.selective)

    env = _Terrain(selective_pays)
    policy: Any = _Policy(lambda _: STAY)
    episode = run_episode(env, policy, workload="w", seed=0, steps=6, refine=2)
    # 8x2, one recompute level less, bf16, 2x8 (all worse); then a full level selective instead,
    # better, and the same move again from there.
    assert [(k.micro_batch_size, k.precision, k.checkpoint, k.selective) for k in env.trained] == [
        (4, 0, 4, 0),
        (8, 0, 4, 0),
        (4, 0, 3, 0),
        (4, 1, 4, 0),
        (2, 0, 4, 0),
        (4, 0, 3, 1),
        (4, 0, 2, 2),
    ]
    # From 2x8: the split back and the band's move in one action; then the band's move alone.
    assert [s.action for s in episode.steps[5:]] == [(0, 1, 1, 0, 0, 2, 1), (1, 1, 1, 0, 0, 2, 1)]
    assert episode.best is not None and episode.best.throughput == 140.0


def test_the_climb_reaches_the_outer_precision_through_a_seventh_action_entry_after_the_other_moves() -> None:
    """Where the outer parts in bf16 pay and every other move is worse, the climb tries every
    other neighbour first (the steps it took before the outer precision was a knob), then moves
    the outer parts to bf16 with the action's seventh entry."""

    def outer_pays(k: Levels) -> float:
        return _less_recompute_is_faster(k) - 20 * (4 - k.checkpoint) - 30 * k.selective + 25 * k.outer

    env = _Terrain(outer_pays)
    policy: Any = _Policy(lambda _: STAY)
    episode = run_episode(env, policy, workload="w", seed=0, steps=6, refine=2)
    # 8x4 (worse), one recompute level less (worse), bf16 (worse), 2x8 (worse), the selective
    # move (worse), then the outer parts in bf16: better, and the best step.
    assert [(k.micro_batch_size, k.precision, k.checkpoint, k.selective, k.outer) for k in env.trained] == [
        (4, 0, 4, 0, False),
        (8, 0, 4, 0, False),
        (4, 0, 3, 0, False),
        (4, 1, 4, 0, False),
        (2, 0, 4, 0, False),
        (4, 0, 3, 1, False),
        (4, 0, 4, 0, True),
    ]
    # From 2x8 the split back and the selective move; from there a full level up (which takes the
    # selective quarter back) and the outer move in one action, the selective entry kept.
    assert [s.action for s in episode.steps[5:]] == [(0, 1, 1, 0, 0, 2, 1), (1, 1, 1, 2, 0, 1, 2)]
    assert episode.best is not None and episode.best.throughput == 125.0
    config = env.config_of(_k(env, env.trained[-1]))
    assert (config.precision, config.outer_precision, config.checkpoint) == ("fp32", "bf16", True)
