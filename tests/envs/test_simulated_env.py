from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import autotune.envs  # noqa: F401  (registers the environments)
import gymnasium as gym
import numpy as np
import pytest
from autotune.envs import SimulatedEnv, WorkloadProfile, calibrate, load_profile, save_profile, shipped_profiles
from autotune.envs._codec import Levels, knobs_to_config
from autotune.envs.calibration import peak_table_index
from autotune.envs.core import OBSERVATION_SIZE
from autotune.envs.costmodel import step_cost
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from autotune import measure
from autotune.memory.blocks import profile_blocks
from tests.conftest import make_resmlp


@pytest.mark.parametrize("randomize", [False, True])
def test_passes_gymnasium_and_sb3_checks_without_warnings(randomize: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        env = gym.make("autotune/Simulated-v0", randomize=randomize, ranks=(1, 2, 8) if randomize else 1).unwrapped
        check_env(env, skip_render_check=True)
        sb3_check_env(env, warn=True)


def _rollout(seed: int) -> list[tuple[np.ndarray, float]]:
    env = gym.make("autotune/Simulated-v0", randomize=True)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    out = [(obs, 0.0)]
    for _ in range(40):
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        out.append((obs, float(reward)))
        if terminated or truncated:
            obs, _ = env.reset()
    return out


def test_seeded_rollouts_are_identical() -> None:
    a, b, c = _rollout(7), _rollout(7), _rollout(8)
    assert all(np.array_equal(x[0], y[0]) and x[1] == y[1] for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, c, strict=True))


def test_shipped_profiles_cover_the_built_in_workloads_and_generated_ones() -> None:
    names = {p.workload for p in shipped_profiles()}
    assert {"gpt-tiny", "mlp-digits", "resnet-tiny"} <= names
    assert {f"random:{seed}" for seed in range(10, 15)} <= names
    assert "random:3" not in names  # held out: the README's transfer check runs on it


def test_cost_model_orders_memory_like_the_knobs() -> None:
    p = next(p for p in shipped_profiles() if p.workload == "gpt-tiny")
    base = step_cost(p, Levels(micro=5))
    assert step_cost(p, Levels(micro=5, checkpoint=4)).peak_bytes < base.peak_bytes
    assert step_cost(p, Levels(micro=5, precision=4)).peak_bytes < base.peak_bytes
    assert step_cost(p, Levels(micro=4)).peak_bytes < base.peak_bytes
    assert step_cost(p, Levels(micro=5, checkpoint=4)).seconds > base.seconds  # recompute costs time


def test_calibration_round_trips_through_json(tmp_path: Path) -> None:
    profile = calibrate(make_resmlp(), curve_steps=6)
    save_profile(profile, tmp_path / "p.json")
    again = load_profile(tmp_path / "p.json")
    assert again == profile
    assert isinstance(again, WorkloadProfile)
    assert len(again.blocks) == 4 and again.parameters_bytes == make_resmlp().num_parameters * 4
    assert abs(sum(b.time_share for b in again.blocks) - 1.0) < 1e-9
    env = SimulatedEnv(profiles=[again], memory_budget=0.8)
    obs, info = env.reset(seed=0)
    assert info["budget_bytes"] < info["peak_bytes"]  # 0.8 of the default's peak
    assert obs.shape == (OBSERVATION_SIZE,)


def test_calibrated_memory_is_the_measured_peak(tmp_path: Path) -> None:
    """The simulator's memory of a calibrated workload is the memory model's: in fp32, the peak
    of a real, measured step to within a few scalars (the model leaves out the loss and the
    gradient norm, 4 bytes each); the block-sum model it replaces is off by up to 28%."""
    workload = make_resmlp()
    profile = calibrate(workload, curve_steps=4)
    assert profile.peak_table is not None and len(profile.peak_table) == 8 * 5 * 5 * 2
    ranking = profile_blocks(workload, micro_batch_size=2).ranked()
    for levels in (Levels(micro=3), Levels(micro=4, checkpoint=2), Levels(micro=3, accum=1, checkpoint=4)):
        measured = measure(workload, knobs_to_config(levels, ranking), steps=1, warmup=1).peak_bytes
        assert measured is not None
        simulated = step_cost(profile, levels).peak_bytes
        assert simulated == profile.peak_table[peak_table_index(levels)]
        assert 0 <= measured - simulated <= 32, (levels, measured, simulated)
    untabled = dataclasses.replace(profile, peak_table=None)  # a synthetic model's fallback
    assert step_cost(untabled, Levels(micro=3)).peak_bytes != step_cost(profile, Levels(micro=3)).peak_bytes


def test_zero_action_is_live_with_ranks_and_mapped_without() -> None:
    keep = np.array([1, 1, 1, 1, 0])
    stage3 = np.array([1, 1, 1, 1, 3])
    env = SimulatedEnv(ranks=4, memory_budget=2.0, noise=0.0)
    _, info0 = env.reset(seed=0)
    _, _, _, _, info = env.step(stage3)
    assert info["knobs"].ranks == 4 and info["knobs"].zero_stage == 3
    assert info["knobs"].batch_size == 4 * info0["knobs"].micro_batch_size  # the global batch
    assert info["peak_bytes"] < info0["peak_bytes"]  # model states split over 4 ranks
    assert info["throughput"] < info0["throughput"]  # ZeRO-3's parameter gathers cost time
    assert info["reward_terms"]["reconfig"] > 0  # rebuilding the engine is charged
    _, _, _, _, info = env.step(keep)
    assert info["knobs"].zero_stage == 0
    single = SimulatedEnv(ranks=1)
    single.reset(seed=0)
    _, _, _, _, info = single.step(stage3)
    assert info["knobs"].zero_stage == 0


def test_on_a_profile_without_their_tables_the_selective_and_outer_actions_are_harmless() -> None:
    """A profile written before the selective level and the outer precision were actions (a user's
    own, from an older autotune): the outer move changes the configuration and nothing simulated
    (the outer parts stay fp32 there), the selective move costs its recompute time and saves no
    memory (never preferred), and neither is refused; where the model cannot run the reduced
    precision, the outer move is."""
    from autotune.envs._codec import Move

    shipped = next(p for p in shipped_profiles() if p.workload == "gpt-tiny")
    profile = dataclasses.replace(
        shipped,
        blocks=tuple(dataclasses.replace(b, selective_per_sample=None) for b in shipped.blocks),
        selective_peak_table=None,
        outer_peak_table=None,
        outer_selective_peak_table=None,
    )

    def stepped(move: Move, p: WorkloadProfile = profile) -> tuple[float, dict[str, object]]:
        env = SimulatedEnv(profiles=[p], memory_budget=1.0, noise=0.0)
        env.reset(seed=0)
        env._cursor = dataclasses.replace(env._cursor, checkpoint=2)  # recomputed quarters to move from
        _, reward, _, _, info = env.step(np.array(move.action))
        return reward, info

    keep_reward, keep = stepped(Move.KEEP)
    outer_reward, outer = stepped(Move.OUTER_REDUCED)
    assert outer["knobs"].outer_low_precision and not keep["knobs"].outer_low_precision
    assert (outer_reward, outer["throughput"], outer["peak_bytes"]) == (
        keep_reward,
        keep["throughput"],
        keep["peak_bytes"],
    )
    selective_reward, selective = stepped(Move.MORE_SELECTIVE)
    assert selective["knobs"].selective_blocks > 0 and selective["reward_terms"].get("over_budget") is None
    assert selective["peak_bytes"] == keep["peak_bytes"] and selective["throughput"] < keep["throughput"]
    assert selective_reward < keep_reward
    failing = dataclasses.replace(profile, reduced_failure="no bf16 here")
    refused_reward, refused = stepped(Move.OUTER_REDUCED, failing)
    assert refused_reward == -1.0 and refused["reward_terms"] == {"over_budget": 1.0}
    assert not refused["knobs"].outer_low_precision
