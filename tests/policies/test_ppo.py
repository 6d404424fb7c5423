from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from autotune.envs import SimulatedEnv, shipped_profiles
from autotune.envs.core import OBSERVATION_SIZE
from autotune.policies import transfer
from autotune.policies.ppo import (
    EPISODE_STEPS,
    PRETRAINED_DIR,
    evaluate,
    load_policy,
    save_policy,
    simulated_venv,
    train_policy,
)
from autotune.policies.transfer import fine_tune

from autotune.errors import ConfigError


def _env() -> gym.Env[np.ndarray, np.ndarray]:
    return gym.wrappers.TimeLimit(SimulatedEnv(randomize=False, horizon=EPISODE_STEPS), max_episode_steps=EPISODE_STEPS)


def test_ppo_beats_random_and_always_keep_on_the_simulator(tmp_path: Path) -> None:
    model = train_policy(timesteps=12_000, randomize=False, seed=0)
    rng = np.random.default_rng(0)
    ppo = evaluate(lambda o: model.predict(o, deterministic=True)[0], _env(), episodes=40, seed=1000)
    rand = evaluate(lambda o: rng.integers(0, [3, 3, 3, 3, 4, 3, 3]), _env(), episodes=40, seed=1000)
    keep = evaluate(lambda o: np.array([1, 1, 1, 1, 0, 1, 1]), _env(), episodes=40, seed=1000)
    assert ppo > max(keep, rand), (ppo, keep, rand)
    # the saved policy (safetensors + JSON, no pickle) acts exactly like the trained one
    save_policy(model, tmp_path / "p", trained_on=["shipped profiles"], timesteps=12_000)
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["policy.json", "policy.safetensors"]
    loaded = load_policy(tmp_path / "p")
    obs = torch.rand(32, OBSERVATION_SIZE).numpy() * 2 - 1
    assert np.array_equal(loaded.act(obs), model.predict(obs, deterministic=True)[0])


def test_the_shipped_policy_loads_and_beats_always_keep() -> None:
    """The pretrained policy matches this code's spaces and still does better than doing nothing
    on the calibrated profiles (the README's table has the full evaluation)."""
    policy = load_policy()
    assert policy.metadata["observation_size"] == OBSERVATION_SIZE
    assert policy.metadata["action_nvec"] == [3, 3, 3, 3, 4, 3, 3]
    shipped = evaluate(policy.act, _env(), episodes=24, seed=2000)
    keep = evaluate(lambda o: np.array([1, 1, 1, 1, 0, 1, 1]), _env(), episodes=24, seed=2000)
    assert shipped > keep, (shipped, keep)


def test_the_shipped_policy_loads_without_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a policy file must load without pickle")

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    policy = load_policy()
    assert policy.act(np.zeros(OBSERVATION_SIZE, dtype=np.float32)).shape == (7,)


def test_fine_tuning_on_one_profile_is_bounded_and_keeps_the_spaces() -> None:
    policy = load_policy()
    profile = next(p for p in shipped_profiles() if p.workload == "mlp-digits")
    tuned = fine_tune(policy, profile, memory_budget=0.75, seconds=0.5, n_envs=1)
    assert tuned.metadata["fine_tuned"]["on"] == "mlp-digits" and tuned.metadata["fine_tuned"]["steps"] >= 256
    assert tuned.act(np.zeros(OBSERVATION_SIZE, dtype=np.float32)).shape == (7,)
    assert fine_tune(policy, profile, memory_budget=0.75, seconds=0) is policy


@pytest.mark.parametrize(("floor", "start"), [(None, True), (4, False)])
def test_fine_tuning_trains_where_the_run_is_floored_and_starts(
    floor: int | None, start: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BatchNorm model's closed split (None) and the real environment's start within the budget
    reach every simulated environment that fine-tuning trains on."""
    made: list[Any] = []

    def recording(**kwargs: Any) -> Any:
        made.append(simulated_venv(**kwargs))
        return made[-1]

    monkeypatch.setattr(transfer, "simulated_venv", recording)
    profile = next(p for p in shipped_profiles() if p.workload == "mlp-digits")
    kwargs: dict[str, Any] = {"min_micro_batch": floor, "start_within_budget": start}
    fine_tune(load_policy(), profile, memory_budget=0.75, seconds=0.1, n_envs=2, **kwargs)
    envs = [env.unwrapped for env in made[0].envs]
    assert [(e.micro_floor, e.start_within_budget) for e in envs] == [(floor, start)] * 2


def test_a_format_2_policy_is_refused_in_one_line(tmp_path: Path) -> None:
    """A policy trained before the selective level and the outer precision were actions (format 2:
    five actions, 20 observations) cannot act in these spaces: one line says which format it is."""
    old = tmp_path / "format-2"
    old.mkdir()
    meta = json.loads((PRETRAINED_DIR / "policy.json").read_text())
    old_meta = {**meta, "format": 2, "observation_size": 20, "action_nvec": [3, 3, 3, 3, 4]}
    (old / "policy.json").write_text(json.dumps(old_meta))
    (old / "policy.safetensors").write_bytes((PRETRAINED_DIR / "policy.safetensors").read_bytes())
    with pytest.raises(ConfigError) as raised:
        load_policy(old)
    assert str(raised.value) == (
        f"policy '{old}' has format 2 and observation size 20; this autotune reads format 3 with size 22."
    )
