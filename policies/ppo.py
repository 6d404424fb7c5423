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

import autotune.envs  # noqa: F401  (registers the environments)
import gymnasium as gym
import numpy as np
import torch
from autotune.envs.calibration import WorkloadProfile
from autotune.envs.core import OBSERVATION_SIZE

from autotune.errors import ConfigError
from autotune.units import MemoryBudget

__all__ = [
    "Policy",
    "train_policy",
    "save_policy",
    "write_policy",
    "load_policy",
    "evaluate",
    "simulated_venv",
    "new_ppo",
    "PRETRAINED_DIR",
    "POLICY_FORMAT",
    "EPISODE_STEPS",
]

#: 2: the batch is the user's (split and batch actions), 20 observations; 3: the selective
#: recompute level and the outer precision in the action space and the observation (22).
POLICY_FORMAT = 3
#: Real env steps of an episode at ``tune`` (each trains a few optimizer steps): the policy is
#: trained on episodes of this length, so its time observation means the same there.
EPISODE_STEPS = 8
PRETRAINED_DIR = Path(__file__).parent / "pretrained"
NET_ARCH = (64, 64)
RANK_CHOICES = (1, 1, 2, 4, 8)  # one rank in 2 of 5 episodes: the common case, where ZeRO is off


@dataclass(frozen=True)
class Policy:
    """A loaded policy: ``act(obs)`` returns the action (deterministic: the distribution's mode).

    Attributes:
        network: The stable-baselines3 ``ActorCriticPolicy`` that acts.
        metadata: ``policy.json``: the action space (``action_nvec``), the network's layers, how it was trained.
        directory: Where it was loaded from (for messages), or None.

    Example:
        >>> import numpy as np
        >>> from autotune.policies import load_policy
        >>> action = load_policy().act(np.zeros(22, dtype=np.float32))
        >>> action.shape
        (7,)
    """

    network: Any  # stable_baselines3 ActorCriticPolicy
    metadata: dict[str, Any]
    directory: Path | None = None  # where it was loaded from, for messages

    def act(self, observation: np.ndarray) -> np.ndarray:
        """The action for ``observation`` (one per knob of the action space; the distribution's mode)."""
        action, _ = self.network.predict(observation, deterministic=True)
        return np.asarray(action)

    def check_action_space(self, space: gym.spaces.Space[Any]) -> None:
        """Refuse an environment whose actions differ from the policy's (before any training runs)."""
        nvec = [int(n) for n in self.metadata["action_nvec"]]
        env_nvec = [int(n) for n in space.nvec] if isinstance(space, gym.spaces.MultiDiscrete) else None
        if nvec != env_nvec:
            where = f"policy {str(self.directory)!r}" if self.directory is not None else "the policy"
            raise ConfigError(
                f"{where} chooses actions from MultiDiscrete({nvec}), but the environment's action space is {space}."
            )


def simulated_venv(
    *,
    profiles: Sequence[WorkloadProfile] | None,
    randomize: bool,
    memory_budget: MemoryBudget | str | int | float | None,
    n_envs: int,
    seed: int,
    adapt_batch: bool = False,
    min_micro_batch: int | None = 1,
    start_within_budget: bool = False,
) -> Any:
    """Vectorized ``autotune/Simulated-v0`` with episodes of :data:`EPISODE_STEPS` steps
    (``min_micro_batch`` and ``start_within_budget`` as :class:`~autotune.envs.SimulatedEnv` takes them)."""
    from stable_baselines3.common.env_util import make_vec_env

    # Randomized training also draws the rank count, so the ZeRO action has something to teach.
    # A callable, not the id: given an id, make_vec_env asks for render_mode="rgb_array", which the
    # env does not offer (Gymnasium warns).
    env_kwargs: dict[str, Any] = {
        "profiles": profiles,
        "randomize": randomize,
        "memory_budget": memory_budget,
        "ranks": RANK_CHOICES if randomize else 1,
        "horizon": EPISODE_STEPS,
        "adapt_batch": adapt_batch,
        "min_micro_batch": min_micro_batch,
        "start_within_budget": start_within_budget,
    }
    return make_vec_env(
        lambda: gym.make("autotune/Simulated-v0", max_episode_steps=EPISODE_STEPS, **env_kwargs),
        n_envs=n_envs,
        seed=seed,
    )


def new_ppo(venv: Any, *, seed: int, verbose: int = 0, learning_rate: float = 3e-4) -> Any:
    """SB3 PPO with this project's hyperparameters (one place: training and fine-tuning share them)."""
    from stable_baselines3 import PPO

    return PPO(
        "MlpPolicy",
        venv,
        n_steps=256,  # x n_envs per rollout: 32 episodes of 8 steps per env between updates
        batch_size=256,
        n_epochs=10,
        gamma=0.9,  # episodes are 8 steps: a short horizon
        ent_coef=0.01,
        learning_rate=learning_rate,
        policy_kwargs={"net_arch": list(NET_ARCH)},
        seed=seed,
        verbose=verbose,
        device="cpu",
    )


def train_policy(
    *,
    timesteps: int,
    profiles: Sequence[WorkloadProfile] | None = None,
    randomize: bool = True,
    memory_budget: float | None = None,
    n_envs: int = 4,
    seed: int = 0,
    verbose: int = 0,
    init: Policy | None = None,
) -> Any:
    """Train PPO on vectorized simulated envs (from ``init``'s weights if given); returns the SB3 ``PPO``."""
    if not isinstance(timesteps, int) or isinstance(timesteps, bool) or timesteps < 1:
        raise ConfigError(f"timesteps must be an int >= 1, but got {timesteps!r}.")
    torch.manual_seed(seed)
    venv = simulated_venv(profiles=profiles, randomize=randomize, memory_budget=memory_budget, n_envs=n_envs, seed=seed)
    model = new_ppo(venv, seed=seed, verbose=verbose)
    if init is not None:
        model.policy.load_state_dict(init.network.state_dict())
    model.learn(total_timesteps=timesteps)
    return model


def save_policy(
    model: Any, directory: Path, *, trained_on: Sequence[str], timesteps: int, extra: dict[str, Any] | None = None
) -> None:
    import stable_baselines3

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
    write_policy(model.policy, directory, metadata=meta)


def write_policy(network: Any, directory: Path, *, metadata: dict[str, Any]) -> None:
    """Write a policy directory: ``network``'s weights (safetensors) and ``metadata`` (JSON, with
    the keys :func:`load_policy` requires, as a loaded :class:`Policy` carries them)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().cpu().contiguous() for k, v in network.state_dict().items()}
    save_file(state, str(directory / "policy.safetensors"))
    (directory / "policy.json").write_text(json.dumps(metadata, indent=2))


_POLICY_FILES = "a policy directory holds policy.json and policy.safetensors (autotune train-policy --out writes one)"


def load_policy(directory: Path = PRETRAINED_DIR) -> Policy:
    """Load a policy directory; anything wrong with it is a one-line :class:`ConfigError`.

    Args:
        directory: A folder with ``policy.json`` and ``policy.safetensors`` (``autotune train-policy
            --out`` writes one); by default the shipped policy's.

    Returns:
        The policy, ready to act.

    Raises:
        ConfigError: the folder or a file is missing, unreadable, or not a policy of this version.

    Example:
        >>> from autotune.policies import PRETRAINED_DIR, load_policy
        >>> policy = load_policy(PRETRAINED_DIR)  # the shipped policy, the default
        >>> [int(n) for n in policy.metadata["action_nvec"]]
        [3, 3, 3, 3, 4, 3, 3]
    """
    from gymnasium import spaces
    from stable_baselines3.common.policies import ActorCriticPolicy

    meta = _read_metadata(directory)
    state = _read_weights(directory)
    network = ActorCriticPolicy(
        spaces.Box(-1.0, 1.0, (OBSERVATION_SIZE,), dtype=np.float32),
        spaces.MultiDiscrete(meta["action_nvec"]),
        lr_schedule=lambda _: 0.0,
        net_arch=meta["net_arch"],
    )
    _check_shapes(directory, meta, state, network.state_dict())
    network.load_state_dict(state)
    network.set_training_mode(False)
    return Policy(network=network, metadata=meta, directory=directory)


def _read_metadata(directory: Path) -> dict[str, Any]:
    where = f"policy {str(directory)!r}"
    if not directory.exists():
        raise ConfigError(f"{where} does not exist: {_POLICY_FILES}.")
    if not directory.is_dir():
        raise ConfigError(f"{where} is not a directory: {_POLICY_FILES}.")
    for name in ("policy.json", "policy.safetensors"):
        if not (directory / name).is_file():
            raise ConfigError(f"{where} has no {name}: {_POLICY_FILES}.")
    try:
        meta: Any = json.loads((directory / "policy.json").read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: policy.json is not valid JSON ({str(e).splitlines()[0]}).") from None
    required = ("format", "observation_size", "action_nvec", "net_arch")
    missing = [k for k in required if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise ConfigError(f"{where}: policy.json lacks key {missing[0]!r} (required: {', '.join(required)}).")
    if meta["format"] != POLICY_FORMAT or meta["observation_size"] != OBSERVATION_SIZE:
        raise ConfigError(
            f"{where} has format {meta['format']!r} and observation size {meta['observation_size']!r}; "
            f"this autotune reads format {POLICY_FORMAT} with size {OBSERVATION_SIZE}."
        )
    for key, low in (("action_nvec", 2), ("net_arch", 1)):
        value = meta[key]
        if not isinstance(value, list) or not value or not all(_is_int(v) and v >= low for v in value):
            raise ConfigError(
                f"{where}: policy.json's {key} must be a non-empty list of ints >= {low}, but got {value!r}."
            )
    return dict(meta)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(directory / "policy.safetensors"))
    except (SafetensorError, OSError) as e:
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"policy {str(directory)!r}: policy.safetensors is not a readable safetensors file ({detail})."
        ) from None


def _check_shapes(
    directory: Path, meta: dict[str, Any], state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]
) -> None:
    where = f"policy {str(directory)!r}: policy.safetensors does not match policy.json"
    where += f" (action_nvec {meta['action_nvec']}, net_arch {meta['net_arch']})"
    for key in sorted(set(expected) | set(state)):
        if key not in state:
            raise ConfigError(f"{where}: tensor {key!r} is missing.")
        if key not in expected:
            raise ConfigError(f"{where}: unexpected tensor {key!r}.")
        if tuple(state[key].shape) != tuple(expected[key].shape):
            raise ConfigError(
                f"{where}: {key} has shape {tuple(state[key].shape)}, expected {tuple(expected[key].shape)}."
            )


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
