from __future__ import annotations

import warnings

import autotune.envs  # noqa: F401  (registers the environments)
import gymnasium as gym
import numpy as np
import pytest
import torch
from autotune.envs.knobs import KnobLevels
from autotune.envs.training import TrainingEnv
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from autotune import Knobs

USER = "tests.data.my_workload:build"  # 3 blocks, trains in milliseconds


def _env(**kwargs: object) -> TrainingEnv:
    return TrainingEnv(workloads=[USER], steps_per_action=2, horizon=8, **kwargs)  # type: ignore[arg-type]


def test_passes_gymnasium_and_sb3_checks_without_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # through gym.make, so the spec (nondeterministic=True: real timings) is attached
        env = gym.make("autotune/Training-v0", workloads=[USER], steps_per_action=2).unwrapped
        check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=True)
        env.close()


def test_registered_with_time_limit() -> None:
    env = gym.make("autotune/Training-v0", workloads=[USER], steps_per_action=2)
    assert env.spec is not None and env.spec.max_episode_steps == 16 and env.spec.nondeterministic
    obs, info = env.reset(seed=0)
    assert obs.shape == (18,) and obs.dtype == np.float32
    assert info["levels"] == KnobLevels.default_for(32)
    assert info["knobs"] == Knobs(batch_size=32, micro_batch_size=32)  # the study's encoding
    env.close()


def test_reconfiguring_keeps_weights_and_optimizer_state_and_training_goes_on() -> None:
    env = _env(memory_budget=10.0)  # budget out of the way: this test is about state
    env.reset(seed=0)
    trainer = env.trainer
    assert trainer is not None
    losses = []
    for _ in range(3):
        _, _, _, _, info = env.step(np.array([1, 1, 1, 1, 0]))
        losses.append(info["loss"])
    params = [p.detach().clone() for p in trainer.model.parameters()]
    state = {
        k: {n: t.clone() for n, t in v.items() if isinstance(t, torch.Tensor)}
        for k, v in trainer.optimizer.state.items()
    }
    # Raise reduced precision and checkpointing to the next level, as an action does; compare
    # right after the change, before any training step.
    new = KnobLevels(micro=env.levels.micro, precision=2, checkpoint=2)
    trainer.reconfigure(env._config(new))
    assert all(torch.equal(a, b) for a, b in zip(params, trainer.model.parameters(), strict=True))
    for k, v in trainer.optimizer.state.items():
        assert all(torch.equal(state[k][n], t) for n, t in v.items() if isinstance(t, torch.Tensor))
    trainer.reconfigure(env._config(env.levels))
    for _ in range(5):
        _, _, terminated, _, info = env.step(np.array([1, 1, 2, 2, 0]))  # more bf16 + recompute each step
        assert not terminated
        losses.append(info["loss"])
    assert env.levels.precision == 4 and env.levels.checkpoint == 4
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    env.close()


def test_over_budget_step_is_not_run_and_penalized() -> None:
    env = _env(memory_budget=1.0)  # exactly the default's peak: any larger micro-batch exceeds it
    env.reset(seed=0)
    before = env.levels
    _, reward, terminated, _, info = env.step(np.array([1, 2, 1, 1, 0]))  # micro-batch up
    assert reward == -1.0 and not terminated
    assert info["reward_terms"] == {"over_budget": 1.0}
    assert env.levels == before
    env.close()


@pytest.mark.parametrize("action", [[0, 0, 0, 0, 3], [2, 2, 2, 2, 0]])
def test_rewards_are_finite(action: list[int]) -> None:
    env = _env(memory_budget=10.0)
    env.reset(seed=1)
    _, reward, _, _, _ = env.step(np.array(action))
    assert np.isfinite(reward)
    assert env.levels.zero_stage == 0  # one rank: stages map to 0
    env.close()
