"""Transfer by design: profile the new model, fine-tune the pretrained policy on its calibrated
simulator for bounded time, then act on the real loop.

GDP (Zhou et al. 2019) pretrains a placement policy over many graphs and fine-tunes it on the new
one; DreamShard (Zha et al. NeurIPS'22) trains on a learned cost model instead of the hardware.
Here the cost model is the simulator calibrated on the new model and this machine
(:func:`autotune.envs.calibration.calibrate`: its exact memory table, its reduced-precision speed
and recompute cost measured here, seconds for small models), so the policy that then acts on the
real training loop has already seen *this* model on *this* machine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from autotune.envs.calibration import Progress, WorkloadProfile, calibrate
from autotune.policies.ppo import Policy, new_ppo, simulated_venv

from autotune.errors import AutotuneError, ConfigError, NonFiniteLossError, ProposalError, one_line
from autotune.knobs import Knobs
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, objective_value
from autotune.memory.check import TOLERANCE
from autotune.units import DEFAULT_PEAK, MemoryBudget
from autotune.workload import Workload

if TYPE_CHECKING:
    from autotune.memory.profile_record import MemoryProfile

__all__ = [
    "CalibrationSize",
    "calibration_size",
    "profile_for_tuning",
    "fine_tune",
    "propose",
    "quick_profile",
    "simulated_best",
]


def profile_for_tuning(
    workload: Workload,
    *,
    curve_steps: int = 12,
    timing_rounds: int = 8,
    reuse: MemoryProfile | None = None,
    progress: Progress | None = None,
) -> WorkloadProfile:
    """The calibrated simulator's profile of ``workload`` on this machine. The loss and noise
    curves only matter with batch adaptation: a short one keeps this to the cost of the timed
    configurations and the memory table. ``reuse``: a memory profile of ``workload`` made before (a
    study's), whose fake runs the memory table does not make again. ``progress``: called as each
    phase of the calibration begins (:func:`~autotune.envs.calibrate`'s). Raises
    :class:`ProposalError` before any real step where the calibration would not fit where it runs."""
    size = calibration_size(workload, reuse=reuse)
    # The policy moves the selective level and the outer precision: their memory tables are in.
    return calibrate(
        workload,
        curve_steps=curve_steps,
        timing_rounds=timing_rounds,
        reuse=reuse,
        progress=progress,
        micro_batch=size.micro_batch,
        one_at_a_time=size.one_at_a_time,
    )


def fine_tune(
    policy: Policy,
    profile: WorkloadProfile,
    *,
    memory_budget: MemoryBudget | str | int | float,
    seconds: float,
    seed: int = 0,
    n_envs: int = 4,
    adapt_batch: bool = False,
    min_micro_batch: int | None = 1,
    start_within_budget: bool = False,
) -> Policy:
    """PPO from ``policy``'s weights on ``profile``'s simulator at ``memory_budget`` (as the
    environments read it, :meth:`MemoryBudget.parse`: a float is a fraction of the default's peak),
    for about ``seconds`` of wall time (checked after each rollout of ``256 x n_envs`` steps, then
    updated on: ~2-4 s here, at least one). ``seconds <= 0`` returns ``policy`` unchanged.

    ``min_micro_batch`` (:attr:`Workload.micro_batch_floor`) and ``start_within_budget`` make the
    simulator's episodes those of the run the policy is tuned for: a BatchNorm model's split stays
    closed, and the real environment starts an over-budget default within the budget."""
    if not np.isfinite(seconds):
        raise ConfigError(f"seconds must be a finite number, but got {seconds!r}.")
    if seconds <= 0:
        return policy
    from stable_baselines3.common.callbacks import BaseCallback

    class _Deadline(BaseCallback):
        """Stops learning at the first rollout that ends past the deadline, after its update
        (stopping inside a rollout would drop it without an update)."""

        def __init__(self, deadline: float) -> None:
            super().__init__()
            self.deadline = deadline
            self.stop = False

        def _on_rollout_end(self) -> None:
            self.stop = time.perf_counter() >= self.deadline

        def _on_step(self) -> bool:
            return not self.stop

    venv = simulated_venv(
        profiles=[profile],
        randomize=False,
        memory_budget=memory_budget,
        n_envs=n_envs,
        seed=seed,
        adapt_batch=adapt_batch,
        min_micro_batch=min_micro_batch,
        start_within_budget=start_within_budget,
    )
    model: Any = new_ppo(venv, seed=seed, learning_rate=1e-4)
    model.policy.load_state_dict(policy.network.state_dict())
    start = time.perf_counter()
    model.learn(total_timesteps=10**9, callback=_Deadline(start + seconds))
    model.policy.set_training_mode(False)
    meta = dict(policy.metadata)
    meta["fine_tuned"] = {
        "on": profile.workload,
        "steps": int(model.num_timesteps),
        "seconds": round(time.perf_counter() - start, 1),
    }
    return Policy(network=model.policy, metadata=meta, directory=policy.directory)


#: What ``autotune study`` spends on its policy proposal: a quick profile (2 timing rounds, a
#: 2-step curve: the curves only matter with batch adaptation) and no fine-tuning: a full
#: profile spends about half its time in its 8 timing rounds, which a proposal does not need.
PROPOSAL_TIMING_ROUNDS = 2
PROPOSAL_CURVE_STEPS = 2


def quick_profile(
    workload: Workload, *, reuse: MemoryProfile | None = None, progress: Progress | None = None
) -> WorkloadProfile:
    """The calibrated simulator's quick profile of ``workload`` (what ``autotune study``'s proposal
    and an adaptive run's plan use: seconds for the corpus models). It runs steps of copies of the
    model, the default configuration's included: its memory is that step's, beside the model's.

    Raises :class:`ProposalError` when the model cannot be profiled here, or when the memory model
    behind the simulator's peaks misses the default configuration's measured peak by more than
    :data:`autotune.memory.check.TOLERANCE` (a configuration "within the budget" would then mean
    nothing). A loss that is not finite is not the profiler's failure but the model's:
    :class:`NonFiniteLossError` passes through (a study goes on without a proposal and prunes the
    trials; an adaptive run stops). ``reuse`` and ``progress``: as :func:`profile_for_tuning`'s."""
    from autotune.envs._codec import Levels
    from autotune.envs.costmodel import step_cost

    try:
        profile = profile_for_tuning(
            workload,
            curve_steps=PROPOSAL_CURVE_STEPS,
            timing_rounds=PROPOSAL_TIMING_ROUNDS,
            reuse=reuse,
            progress=progress,
        )
    except (NonFiniteLossError, ProposalError):  # the model's loss, or no room: said as they are
        raise
    except (AutotuneError, RuntimeError) as e:  # the user's model failed a profiling step
        raise ProposalError(f"{workload.name} cannot be profiled for the simulator: {one_line(e)}") from None
    m = profile.default_micro_batch  # the default measured at a smaller micro-batch: its table entry
    levels = Levels.default_for(profile.batch_size) if m is None else Levels(micro=m.bit_length() - 1, accum=0)
    default_peak = step_cost(profile, levels).peak_bytes
    measured = profile.default_peak_bytes
    if measured is not None and abs(default_peak - measured) > TOLERANCE * measured:
        raise ProposalError(
            f"the memory model predicts {default_peak} B for {workload.name}'s default configuration, "
            f"which measured {measured} B (more than {TOLERANCE:.0%} off)"
        )
    return profile


#: The share of the free memory the simulator's calibration may take where it runs.
CALIBRATION_SHARE = 0.8


@dataclass(frozen=True, kw_only=True)
class CalibrationSize:
    """Where the calibration's real steps fit (:func:`calibration_size`).

    Attributes:
        micro_batch: The largest micro-batch they run at (None: the whole batch, the default).
        one_at_a_time: Whether its seven timed configurations run one after the other (one copy of
            the model alive) rather than side by side (seven at once).
    """

    micro_batch: int | None = None
    one_at_a_time: bool = False


def calibration_size(workload: Workload, *, reuse: MemoryProfile | None = None) -> CalibrationSize:
    """Where the calibration's real steps fit on the device they run on, or :class:`ProposalError`.

    The calibration measures the PyTorch default in one fp32 micro-batch and times seven
    configurations side by side (seven copies of the model and its optimizer state at once), on the
    device a measurement defaults to. At real size the whole batch does not fit there (GPT-2 small
    at sequence 1024 and batch 32: ~42 GiB in fp32, on a 24 GB card), nor seven copies of a large
    model (a 1B-parameter model's fp32 AdamW state is 16 GB each). Per micro-batch, from the whole
    batch down the powers of two dividing it, the first that fits (predicted by one fake-tensor
    profile, in seconds): with seven copies side by side, else with one at a time. Where not even one
    sample fits beside one copy, it cannot run. ``reuse``: a memory profile of ``workload`` made
    before (a study's), whose fp32 fake runs the profile here does not make again.
    """
    from autotune.config import TrainConfig
    from autotune.measurement.cuda_memory import free_bytes
    from autotune.memory.predict import predict_memory, profile_memory
    from autotune.train.local import resolve_device
    from autotune.units import format_bytes

    device = resolve_device(None)
    free = free_bytes(device)
    if free is None:
        return CalibrationSize()
    try:  # one fake-tensor profile, each micro-batch predicted from it
        profile = profile_memory(
            workload, modes=("fp32",), checkpointed=False, verify=False, reuse=reuse, device=device.type
        )
    except AutotuneError:
        return CalibrationSize()  # no prediction: the calibration finds out itself
    b0 = workload.batch_size
    # The whole batch first (the default itself), then powers of two dividing it, largest first,
    # within the simulator's micro-batch levels (1 ... 128).
    sizes = [b0] + [m for m in (2**i for i in range(7, -1, -1)) if m < b0 and b0 % m == 0]
    room = CALIBRATION_SHARE * free
    alone = 0
    for m in sizes:
        try:
            e = predict_memory(workload, TrainConfig(micro_batch_size=m), profile=profile, device_type=device.type)
        except AutotuneError:
            return CalibrationSize()
        micro = None if m == b0 else m
        alone = e.total
        if alone + 6 * (e.parameters + e.gradients + e.optimizer_state) <= room:
            return CalibrationSize(micro_batch=micro)
        if alone <= room:
            return CalibrationSize(micro_batch=micro, one_at_a_time=True)
    raise ProposalError(
        f"calibrating the simulator runs the PyTorch default (fp32, down to micro-batch {sizes[-1]}) on "
        f"{device.type}: about {format_bytes(alone)} at the least, and {format_bytes(free)} is free there"
    )


def simulated_best(
    profile: WorkloadProfile,
    *,
    batch_size: int,
    admits: Callable[[Knobs], bool],
    reduced: bool = True,
    selective: bool = False,
    outer: bool = False,
) -> tuple[Knobs, float] | None:
    """The knob setting of effective batch ``batch_size`` (one rank) with the most simulated
    samples/s per GiB among those ``admits`` passes, and that value; None when it passes none.
    A planner on the calibrated simulator, the policy's own training ground: exhaustive over the
    level tables (~150 settings, ~900 with both ``selective`` and ``outer``: milliseconds), so it
    cannot stop short of the simulator's optimum the way one policy episode can (from the default
    it walks toward less memory a quarter of the blocks at a time, and its best step is where it
    happened to be).

    ``reduced``, ``selective`` and ``outer`` say which knobs it searches besides the split and the
    whole-block recompute (:func:`autotune.envs.costmodel.ranked_settings`): the blocks' reduced
    precision, the selective recompute level, and the outer parts in the reduced precision (only
    with ``reduced``)."""
    from autotune.envs.costmodel import ranked_settings

    for value, levels in ranked_settings(profile, batch_size, reduced=reduced, selective=selective, outer=outer):
        knobs = levels.knobs(len(profile.blocks), reduced=profile.reduced)
        if admits(knobs):
            return knobs, value
    return None


def propose(
    workload: Workload,
    *,
    memory_budget: MemoryBudget | str | int | None,
    seconds: float = 0.0,
    policy: Policy | None = None,
    seed: int = 0,
    reuse: MemoryProfile | None = None,
    progress: Progress | None = None,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> Knobs:
    """The policy's proposal for ``workload`` without a real env step: profile the model (a quick
    profile), fine-tune the (pretrained) policy on its calibrated simulator for ``seconds``
    (default 0: as shipped), play one deterministic episode there and return the best
    configuration it reached within ``memory_budget`` (:meth:`MemoryBudget.parse`: bytes per rank as
    an int; None: the default's peak),
    as shared :class:`~autotune.Knobs`. ``autotune study`` enqueues it next to its baselines (one
    more measured trial). Raises :class:`ProposalError` and :class:`NonFiniteLossError` as
    :func:`quick_profile` does, and :class:`ProposalError` when the episode reaches nothing within
    the budget (an over-budget proposal would only be a trial pruned on its prediction).
    ``reuse``: a memory profile of ``workload`` made before (the study's, after its baselines):
    the simulator's memory tables do not make its fake runs again. ``progress``: called as each
    phase of the profile begins (:func:`profile_for_tuning`'s). ``objective``: which configuration
    the episode reached is the best (:func:`~autotune.measurement.objective.objective_value`: per
    GiB, or samples/s within the budget); the policy's moves are the same either way.
    """
    from autotune.envs.simulated import SimulatedEnv
    from autotune.policies.ppo import EPISODE_STEPS, load_policy

    budget = MemoryBudget.parse(memory_budget, default=DEFAULT_PEAK)
    profile = quick_profile(workload, reuse=reuse, progress=progress)
    tuned = fine_tune(
        policy or load_policy(),
        profile,
        memory_budget=budget,
        seconds=seconds,
        seed=seed,
        min_micro_batch=workload.micro_batch_floor,
        start_within_budget=True,
    )
    env = SimulatedEnv(
        profiles=[profile],
        memory_budget=budget,
        noise=0.0,
        horizon=EPISODE_STEPS,
        min_micro_batch=workload.micro_batch_floor,
        start_within_budget=True,  # where the real environment starts, for the real run's proposal
    )
    obs, info = env.reset(seed=seed)

    def value(info: dict[str, Any]) -> float:  # the shared objective at the fixed batch, within budget
        fits = info["peak_bytes"] <= info["budget_bytes"]
        return objective_value(float(info["throughput"]), int(info["peak_bytes"]), objective) if fits else -math.inf

    best: tuple[float, Knobs] = (value(info), env.knobs)
    for _ in range(EPISODE_STEPS):
        obs, _, terminated, _, info = env.step(tuned.act(obs))
        if value(info) > best[0]:
            best = (value(info), env.knobs)
        if terminated:
            break
    if best[0] == -math.inf:  # the start is over the budget and the episode never got under it
        raise ProposalError(
            f"the policy reached no configuration within the budget ({info['budget_bytes']} B) in {EPISODE_STEPS} "
            f"steps of {workload.name}'s simulator"
        )
    return best[1]
