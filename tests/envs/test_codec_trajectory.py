"""One simulated episode pinned: the shipped policy's observation and the transitions must not move.

The environments' action codec (``autotune/envs/_codec.py``) is the shipped policy's contract: an
action is a step through the level tables, and the observation shows the levels. On a model of two
blocks two precision (or recompute) levels cover the same count of blocks, so a step can move the
observation without moving the Knobs: this episode crosses that case on purpose.
"""

from __future__ import annotations

import numpy as np
import pytest
from autotune.envs import SimulatedEnv

SEVENTH = float(np.float32(1 / 7))  # micro-batch level 4 of 0..7 (16), as the observation encodes it

# (action, Knobs after it, observation entries 6-10: accumulation, micro-batch, precision,
# checkpoint and ZeRO levels, reward)
TRAJECTORY = [
    ((1, 1, 2, 1, 0), "16x1", [-1.0, SEVENTH, -0.5, -1.0, -1.0], 0.0),  # precision level 1: 0 of 2 blocks
    ((1, 1, 2, 1, 0), "16x1 bf16:1", [-1.0, SEVENTH, 0.0, -1.0, -1.0], 0.228287),
    ((0, 1, 1, 2, 0), "16x1 bf16:1", [-1.0, SEVENTH, 0.0, -0.5, -1.0], 0.228287),  # no larger split
    ((1, 1, 1, 2, 0), "16x1 bf16:1 ckpt:1", [-1.0, SEVENTH, 0.0, 0.0, -1.0], 0.319388),
    ((2, 1, 0, 1, 0), "8x2 ckpt:1", [-5 / 7, -SEVENTH, -0.5, 0.0, -1.0], -0.19942),
    ((1, 1, 1, 0, 0), "8x2", [-5 / 7, -SEVENTH, -0.5, -0.5, -1.0], -0.069429),
]


def test_a_two_block_episode_steps_through_the_levels_as_the_policy_was_trained() -> None:
    env = SimulatedEnv(randomize=True, noise=0.0)
    observation, info = env.reset(seed=37)
    assert env.num_blocks == 2
    assert info["knobs"].describe() == "16x1"
    assert observation[6:11].tolist() == [-1.0, SEVENTH, -1.0, -1.0, -1.0]
    for action, knobs, levels, reward in TRAJECTORY:
        observation, got, terminated, truncated, info = env.step(np.asarray(action))
        assert (info["knobs"].describe(), terminated, truncated) == (knobs, False, False)
        assert observation[6:11].tolist() == pytest.approx(levels, abs=1e-7)
        assert got == pytest.approx(reward, abs=1e-6)
        assert "over_budget" not in info["reward_terms"]
