"""The user's effective batch is the user's training maths: no action changes it by default, and
with batch adaptation it never goes below the user's; the reward is relative to the start; the
real environment never runs a configuration over the budget after its first step."""

from __future__ import annotations

import autotune.envs  # noqa: F401  (registers the environments)
import gymnasium as gym
import numpy as np
import pytest
from autotune.envs import SimulatedEnv
from autotune.envs._codec import Levels
from autotune.envs.training import TrainingEnv

from tests.conftest import make_resmlp

USER = "tests.data.my_workload:build"  # 3 blocks, trains in milliseconds
KEEP = np.array([1, 1, 1, 1, 0])


def _random_walk(env: gym.Env[np.ndarray, np.ndarray], seed: int, steps: int) -> tuple[int, list[dict[str, object]]]:
    _, info = env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    infos = []
    for _ in range(steps):
        _, _, terminated, truncated, step_info = env.step(rng.integers(0, [3, 3, 3, 3, 4]))
        infos.append(step_info)
        if terminated or truncated:
            break
    return int(info["batch"]), infos


@pytest.mark.parametrize("seed", range(12))
def test_no_action_sequence_changes_the_batch_in_the_simulator(seed: int) -> None:
    env = gym.make("autotune/Simulated-v0", randomize=True, ranks=(1, 2, 4))
    batch0, infos = _random_walk(env, seed, 16)
    assert all(i["batch"] == batch0 and i["knobs"].batch_size == batch0 for i in infos)


@pytest.mark.parametrize("seed", range(12))
def test_with_batch_adaptation_the_batch_never_goes_below_the_start(seed: int) -> None:
    env = gym.make("autotune/Simulated-v0", randomize=True, ranks=(1, 2), adapt_batch=True)
    batch0, infos = _random_walk(env, seed, 16)
    assert all(i["batch"] >= batch0 for i in infos)


def test_batch_adaptation_grows_the_batch_when_asked() -> None:
    env = SimulatedEnv(adapt_batch=True, memory_budget=4.0, noise=0.0)
    _, info0 = env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([1, 2, 1, 1, 0]))
    assert info["batch"] == 2 * info0["batch"]


@pytest.mark.parametrize("adapt_batch", [False, True])
def test_the_reward_of_the_unchanged_configuration_is_zero(adapt_batch: bool) -> None:
    env = SimulatedEnv(memory_budget=2.0, noise=0.0, adapt_batch=adapt_batch)
    env.reset(seed=3)
    rewards = [env.step(KEEP)[1] for _ in range(4)]
    assert rewards == [0.0] * 4


def test_no_action_sequence_changes_the_batch_of_a_real_loop() -> None:
    env = TrainingEnv(workloads=[USER], steps_per_action=2, horizon=8, memory_budget=10.0)
    try:
        batch0, infos = _random_walk(env, 0, 8)
        assert batch0 == 32
        assert all(i["batch"] == batch0 and env.config_of(i["knobs"]).micro_batch_size > 0 for i in infos)
        assert all(i["knobs"].batch_size == batch0 for i in infos)
    finally:
        env.close()


def test_a_budget_below_the_default_peak_is_never_exceeded_after_the_first_step() -> None:
    env = TrainingEnv(workloads=[make_resmlp(n=256)], steps_per_action=2, horizon=12, memory_budget=0.6)
    try:
        _, info = env.reset(seed=0)
        budget = info["budget_bytes"]
        default, default_peak = env.measured_peaks[0]  # the PyTorch default, measured for the budget
        assert default == env._levels_knobs(Levels.default_for(32)) and default_peak > budget
        # The episode starts where an adaptive run would: the first smaller micro-batch within it.
        assert info["peak_bytes"] <= budget and env._cursor.micro_batch_size < default.micro_batch_size
        assert env.prediction_verified  # the memory model predicted the default within 5%
        rng = np.random.default_rng(0)
        for t in range(12):
            # first back towards larger micro-batches (over the budget), then anywhere
            env.step(np.array([0, 1, 1, 1, 0]) if t < 3 else rng.integers(0, [3, 3, 3, 3, 4]))
        measured = env.measured_peaks
        assert len(measured) > 2  # something beyond the default and the start ran
        assert all(peak <= budget for _, peak in measured[1:]), (budget, measured)
    finally:
        env.close()
