from __future__ import annotations

from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from autotune.envs import SimulatedEnv
from autotune.policies.ppo import evaluate, load_policy, save_policy, train_policy


def _env() -> gym.Env[np.ndarray, np.ndarray]:
    return gym.wrappers.TimeLimit(SimulatedEnv(randomize=False), max_episode_steps=16)


def test_ppo_beats_random_and_always_keep_on_the_simulator(tmp_path: Path) -> None:
    model = train_policy(timesteps=12_000, randomize=False, seed=0)
    rng = np.random.default_rng(0)
    ppo = evaluate(lambda o: model.predict(o, deterministic=True)[0], _env(), episodes=40, seed=1000)
    rand = evaluate(lambda o: rng.integers(0, [3, 3, 3, 3, 4]), _env(), episodes=40, seed=1000)
    keep = evaluate(lambda o: np.array([1, 1, 1, 1, 0]), _env(), episodes=40, seed=1000)
    assert ppo > max(keep, rand), (ppo, keep, rand)
    # the saved policy (safetensors + JSON, no pickle) acts exactly like the trained one
    save_policy(model, tmp_path / "p", trained_on=["shipped profiles"], timesteps=12_000)
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["policy.json", "policy.safetensors"]
    loaded = load_policy(tmp_path / "p")
    obs = torch.rand(32, 18).numpy() * 2 - 1
    assert np.array_equal(loaded.act(obs), model.predict(obs, deterministic=True)[0])


def test_the_shipped_policy_loads_and_beats_always_keep() -> None:
    """The pretrained policy matches this code's spaces and still does better than doing nothing
    on the calibrated profiles (the README's table has the full evaluation)."""
    policy = load_policy()
    assert policy.metadata["observation_size"] == 18 and policy.metadata["action_nvec"] == [3, 3, 3, 3, 4]
    shipped = evaluate(policy.act, _env(), episodes=24, seed=2000)
    keep = evaluate(lambda o: np.array([1, 1, 1, 1, 0]), _env(), episodes=24, seed=2000)
    assert shipped > keep, (shipped, keep)
