"""PPO (stable-baselines3) on the simulated environment, and policy files that never unpickle.

A policy file is a directory with ``policy.safetensors`` (the actor-critic weights) and
``policy.json`` (spaces, network shape, versions, how it was trained). Loading rebuilds SB3's
``ActorCriticPolicy`` from the JSON and loads the tensors: no pickle, so a policy from anywhere
is safe to load (SB3's own ``.zip`` format pickles its spaces and hyperparameters).
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from autotune.envs.calibration import WorkloadProfile
from autotune.envs.core import OBSERVATION_SIZE
from autotune.envs.simulated import SimulatedEnv

from autotune.errors import ConfigError

__all__ = ["Policy", "train_policy", "save_policy", "load_policy", "evaluate", "PRETRAINED_DIR", "POLICY_FORMAT"]

POLICY_FORMAT = 1
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
NET_ARCH = (64, 64)
RANK_CHOICES = (1, 1, 2, 4, 8)  # one rank in 2 of 5 episodes: the common case, where ZeRO is off


@dataclass(frozen=True)
class Policy:
    """A loaded policy: ``act(obs)`` returns the action (deterministic: the distribution's mode)."""

    network: Any  # stable_baselines3 ActorCriticPolicy
    metadata: dict[str, Any]

    def act(self, observation: np.ndarray) -> np.ndarray:
        action, _ = self.network.predict(observation, deterministic=True)
        return np.asarray(action)


def _make_env(
    profiles: Sequence[WorkloadProfile] | None, randomize: bool, budget: float | None
) -> Callable[[], gym.Env[Any, Any]]:
    def make() -> gym.Env[Any, Any]:
        # Randomized training also draws the rank count, so the ZeRO action has something to teach.
        env = SimulatedEnv(profiles=profiles, randomize=randomize, memory_budget=budget,
                           ranks=RANK_CHOICES if randomize else 1)  # fmt: skip
        return gym.wrappers.TimeLimit(env, max_episode_steps=env.horizon)

    return make


def train_policy(
    *,
    timesteps: int,
    profiles: Sequence[WorkloadProfile] | None = None,
    randomize: bool = True,
    memory_budget: float | None = None,
    n_envs: int = 4,
    seed: int = 0,
    verbose: int = 0,
) -> Any:
    """Train PPO on vectorized simulated envs; returns the SB3 ``PPO`` model."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    torch.manual_seed(seed)
    venv = make_vec_env(_make_env(profiles, randomize, memory_budget), n_envs=n_envs, seed=seed)
    model = PPO(
        "MlpPolicy",
        venv,
        n_steps=256,  # x n_envs per rollout: 16 episodes of 16 steps per env between updates
        batch_size=256,
        n_epochs=10,
        gamma=0.95,  # episodes are 16 steps: a short horizon
        ent_coef=0.01,
        learning_rate=3e-4,
        policy_kwargs={"net_arch": list(NET_ARCH)},
        seed=seed,
        verbose=verbose,
        device="cpu",
    )
    model.learn(total_timesteps=timesteps)
    return model


def save_policy(
    model: Any, directory: Path, *, trained_on: Sequence[str], timesteps: int, extra: dict[str, Any] | None = None
) -> None:
    import stable_baselines3
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in model.policy.state_dict().items()}
    save_file(state, str(directory / "policy.safetensors"))
    meta = {
        "format": POLICY_FORMAT,
        "algorithm": "PPO",
        "observation_size": OBSERVATION_SIZE,
        "action_nvec": [int(n) for n in model.action_space.nvec],
        "net_arch": list(NET_ARCH),
        "trained_on": list(trained_on),
        "timesteps": timesteps,
        "versions": {
            "stable_baselines3": stable_baselines3.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        **(extra or {}),
    }
    (directory / "policy.json").write_text(json.dumps(meta, indent=2))


def load_policy(directory: Path = PRETRAINED_DIR) -> Policy:
    from gymnasium import spaces
    from safetensors.torch import load_file
    from stable_baselines3.common.policies import ActorCriticPolicy

    meta = json.loads((directory / "policy.json").read_text())
    if meta.get("format") != POLICY_FORMAT or meta.get("observation_size") != OBSERVATION_SIZE:
        raise ConfigError(
            f"policy in {directory} has format {meta.get('format')} and observation size "
            f"{meta.get('observation_size')}; this autotune reads format {POLICY_FORMAT} with size {OBSERVATION_SIZE}"
        )
    network = ActorCriticPolicy(
        spaces.Box(-1.0, 1.0, (OBSERVATION_SIZE,), dtype=np.float32),
        spaces.MultiDiscrete(meta["action_nvec"]),
        lr_schedule=lambda _: 0.0,
        net_arch=meta["net_arch"],
    )
    network.load_state_dict(load_file(str(directory / "policy.safetensors")))
    network.set_training_mode(False)
    return Policy(network=network, metadata=meta)


def evaluate(act: Callable[[np.ndarray], np.ndarray], env: gym.Env[Any, Any], *, episodes: int, seed: int) -> float:
    """Mean undiscounted episode return of ``act`` over ``episodes`` seeded episodes."""
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + i)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return float(np.mean(returns))
