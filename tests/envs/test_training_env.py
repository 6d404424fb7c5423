from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import autotune.envs  # noqa: F401  (registers the environments)
import gymnasium as gym
import numpy as np
import pytest
import torch
from autotune.envs._codec import FRACTION_LEVELS, Levels
from autotune.envs.core import OBSERVATION_SIZE
from autotune.envs.training import TrainingEnv
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from autotune import Knobs
from autotune.measurement.tracker import tracked_step
from tests.paths import ZERO_WORKLOADS
from tests.processes import alive

STRUCTURES = Path(__file__).parents[1] / "memory" / "structures.py"

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
    assert obs.shape == (OBSERVATION_SIZE,) and obs.dtype == np.float32
    assert info["knobs"] == env.unwrapped._levels_knobs(Levels.default_for(32))  # type: ignore[attr-defined]
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
    new = Levels(micro=env._cursor.micro, precision=2, checkpoint=2)
    trainer.reconfigure(env._config(new))
    assert all(torch.equal(a, b) for a, b in zip(params, trainer.model.parameters(), strict=True))
    for k, v in trainer.optimizer.state.items():
        assert all(torch.equal(state[k][n], t) for n, t in v.items() if isinstance(t, torch.Tensor))
    trainer.reconfigure(env.config_of(env.knobs))
    for _ in range(5):
        _, _, terminated, _, info = env.step(np.array([1, 1, 2, 2, 0]))  # more bf16 + recompute each step
        assert not terminated
        losses.append(info["loss"])
    assert env._cursor.precision == 4 and env._cursor.checkpoint == 4
    assert np.mean(losses[-3:]) < np.mean(losses[:3])
    env.close()


def test_over_budget_step_is_not_run_and_penalized() -> None:
    env = _env(memory_budget=1.0)  # exactly the default's peak
    env.reset(seed=0)
    before = env._cursor
    # smaller micro-batches: accumulating, the gradients live through every forward (more memory here)
    _, reward, terminated, _, info = env.step(np.array([2, 1, 1, 1, 0]))
    assert reward == -1.0 and not terminated
    assert info["reward_terms"] == {"over_budget": 1.0}
    assert env._cursor == before
    env.close()


@pytest.mark.parametrize("action", [[0, 0, 0, 0, 3], [2, 2, 2, 2, 0]])
def test_rewards_are_finite(action: list[int]) -> None:
    env = _env(memory_budget=10.0)
    env.reset(seed=1)
    _, reward, _, _, _ = env.step(np.array(action))
    assert np.isfinite(reward)
    assert env._cursor.zero_stage == 0  # one rank: stages map to 0
    env.close()


def test_ranks_must_be_a_positive_int() -> None:
    with pytest.raises(ValueError, match=f"^{re.escape('ranks must be an int >= 1, but got 0.')}$"):
        TrainingEnv(workloads=[USER], ranks=0)


# ---- two DeepSpeed ranks: one session for the module (a launch costs ~10 s) --------------------------

TINY = f"{ZERO_WORKLOADS}:build"


@pytest.fixture(scope="module")
def ranked_env() -> Iterator[TrainingEnv]:
    # through gym.make, so the spec (nondeterministic=True: real timings) is attached
    env = gym.make("autotune/Training-v0", workloads=[TINY], ranks=2, steps_per_action=2, memory_budget=10.0)
    yield env.unwrapped  # type: ignore[misc]
    env.close()


def test_with_two_ranks_passes_the_gymnasium_check_without_warnings(ranked_env: TrainingEnv) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_env(ranked_env, skip_render_check=True)
    assert ranked_env.max_zero_stage == 3


def test_a_zero_action_on_two_ranks_changes_the_stage_and_the_measured_peak(ranked_env: TrainingEnv) -> None:
    _, start = ranked_env.reset(seed=0)
    assert start["knobs"] == Knobs(batch_size=32, micro_batch_size=16, ranks=2)
    _, reward, terminated, _, info = ranked_env.step(np.array([1, 1, 1, 1, 3]))
    assert info["knobs"] == dataclasses.replace(start["knobs"], zero_stage=3)
    assert info["knobs"] == dataclasses.replace(start["knobs"], zero_stage=3)
    assert ranked_env.session is not None and ranked_env.session.config is not None
    assert ranked_env.session.config.zero_stage == 3  # the ranks train at stage 3 now
    assert info["peak_bytes"] < start["peak_bytes"]  # each rank holds half of the model states
    assert np.isfinite(reward) and not terminated and info["b_noise"] is None
    _, _, _, _, back = ranked_env.step(np.array([1, 1, 1, 1, 0]))
    assert back["knobs"].zero_stage == 0 and back["peak_bytes"] == start["peak_bytes"]
    assert back["loss"] < start["loss"]  # training went on across both changes


def test_closing_the_env_reaps_its_ranks(ranked_env: TrainingEnv) -> None:
    ranked_env.reset(seed=1)
    session = ranked_env.session
    assert session is not None
    pids = [*session.rank_pids, session.launcher_pid]
    ranked_env.close()
    assert ranked_env.session is None and session.closed
    assert not any(alive(pid) for pid in pids)


def test_the_starting_peak_is_measured_with_optimizer_state() -> None:
    env = _env(memory_budget=10.0)
    _, info = env.reset(seed=0)
    assert env.trainer is not None and env.trainer.optimizer.state  # trained before measuring
    at_peak = tracked_step(env.trainer).at_peak  # the same knobs again, in the middle of training
    assert info["peak_bytes"] == at_peak.total
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_budget": 0.0}, "MemoryBudget.fraction must be a finite number > 0, but got 0.0."),
        ({"memory_budget": -0.5}, "MemoryBudget.fraction must be a finite number > 0, but got -0.5."),
        ({"memory_budget": 0}, "MemoryBudget.bytes must be an int >= 1, but got 0."),
        (
            {"memory_budget": [0.75]},
            "memory_budget must be bytes (int), a string such as '8GiB' or '75%', or a fraction of the "
            "default's peak (float), but got [0.75].",
        ),
        (
            {"memory_budget": "75"},
            "memory_budget needs a unit: a size such as 75GiB or 75MiB, or a percentage such as 75%, but got '75'.",
        ),
        ({"horizon": 0}, "horizon must be an int >= 1, but got 0."),
    ],
)
def test_bad_arguments_are_refused_before_any_training(kwargs: dict[str, object], message: str) -> None:
    from autotune.errors import ConfigError

    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        TrainingEnv(workloads=["no-such-workload"], **kwargs)  # type: ignore[arg-type]


def test_a_knob_the_model_cannot_take_is_infeasible_not_a_crash() -> None:
    """bf16 that raises (a kernel this CPU lacks): reset measures its speed as 0, and an action into
    it is refused like an over-budget one, with the reason kept; the run goes on in fp32."""
    from autotune.envs._codec import FRACTION_LEVELS
    from autotune.envs.core import OVER_BUDGET_PENALTY

    env = TrainingEnv(
        workloads=["tests.data.no_low_precision:build"], steps_per_action=2, horizon=4, memory_budget=1 << 40
    )
    try:
        obs, _ = env.reset(seed=0)
        all_bf16 = dataclasses.replace(env._cursor, precision=FRACTION_LEVELS - 1)
        reason = "RuntimeError: could not create a primitive descriptor for this op in reduced precision"
        assert env.infeasible == {env._levels_knobs(all_bf16): reason}
        assert obs[15] == -1.0  # log2 of the reduced-precision speed, clipped: the slowest it knows
        start = env._cursor
        _, reward, terminated, _, info = env.step(np.array([1, 1, 2, 1, 0]))  # one more level of bf16
        assert (reward, terminated, env._cursor) == (-OVER_BUDGET_PENALTY, False, start)
        assert info["reward_terms"] == {"over_budget": 1.0}
        assert len(env.infeasible) == 2
        _, reward, _, _, _ = env.step(np.array([1, 1, 1, 2, 0]))  # recompute more: fp32 still trains
        assert reward != -OVER_BUDGET_PENALTY
    finally:
        env.close()


def test_a_per_block_mix_on_blocks_that_are_not_a_chain_is_measured_not_trusted() -> None:
    """A UNet's skip connections break the memory model's per-block composition: the environment
    never admits a mix of recomputed and plain blocks on its prediction; it measures its peak
    (one tracked step, as an adaptive run and a study's trial do) and judges that, and still
    admits uniform settings on their prediction."""
    from autotune.errors import PredictionWarning

    env = TrainingEnv(workloads=[f"{STRUCTURES}:build_unet"], steps_per_action=2, horizon=4, memory_budget=10.0)
    # The episode's profile is checked against real steps, as an adaptive run's gate's is: it says so.
    with pytest.warns(PredictionWarning, match="configurations that treat blocks differently are predicted unverified"):
        env.reset(seed=0)
    try:
        start = env._cursor
        every = dataclasses.replace(start, checkpoint=FRACTION_LEVELS - 1)
        some = dataclasses.replace(start, checkpoint=1)
        assert env._config(some).block_checkpoints(5) not in ((False,) * 5, (True,) * 5)
        assert env._predicted_peak(every) is not None and env._admitted(every)
        assert env._predicted_peak(some) is None and not env._admitted(some)
        measured = len(env.measured_peaks)
        assert env.admits(env._levels_knobs(some))  # within the budget on its measured peak
        assert env.measured_peaks[measured:] == [(env._levels_knobs(some), env._peaks[some])] and env._admitted(some)
        # Another mix, unverified and predicted over a lower budget: refused, nothing runs.
        other = dataclasses.replace(start, checkpoint=2)
        prediction = env._prediction(other)
        assert prediction is not None and not prediction[1]
        env._budget = env._gate.budget = prediction[0] - 1  # type: ignore[union-attr]
        assert not env.admits(env._levels_knobs(other)) and len(env.measured_peaks) == measured + 1
    finally:
        env.close()


def test_on_a_model_held_in_bf16_bf16_is_infeasible_without_a_profile_or_a_step() -> None:
    """Loaded in bf16, a precision knob changes nothing: reset profiles and checks no bf16 mode,
    probes no bf16 step, and says why; an action into bf16 is refused with that reason."""
    from autotune.envs._codec import FRACTION_LEVELS

    from tests.paths import HELD_BF16

    lines: list[str] = []
    env = TrainingEnv(workloads=[f"{HELD_BF16}:build"], steps_per_action=2, horizon=4, memory_budget=1 << 40)
    env.note = lines.append
    try:
        obs, _ = env.reset(seed=0)
        all_bf16 = dataclasses.replace(env._cursor, precision=FRACTION_LEVELS - 1)
        assert env.infeasible == {env._levels_knobs(all_bf16): "held-net's parameters are bfloat16 already"}
        assert env._memory is not None and tuple(env._memory.modes) == ("fp32",)
        assert obs[15] == -1.0  # the reduced speed the policy sees: none
        (probed,) = [line for line in lines if line.startswith("machine probed")]
        assert probed.startswith("machine probed: no bf16 (held-net's parameters are bfloat16 already), recompute ")
    finally:
        env.close()
