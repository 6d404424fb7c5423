"""``autotune/Simulated-v0``: the training-configuration environment over a calibrated cost model.

Same spaces and reward code as the real ``TrainingEnv`` (both are ``TuningEnv``); a step costs
microseconds instead of seconds, so PPO can take the ~10^5 steps it needs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from autotune.envs._codec import FRACTION_LEVELS, Levels
from autotune.envs.calibration import INFEASIBLE_PEAK, WorkloadProfile, load_profile
from autotune.envs.core import Interval, MachineDescriptor, ModelDescriptor, TuningEnv
from autotune.envs.costmodel import CPU_ZERO_OVERHEAD, StepCost, randomized_machine, randomized_profile, step_cost

from autotune.errors import ConfigError
from autotune.knobs import check_min_micro_batch
from autotune.measurement.goodput import statistical_efficiency
from autotune.tuning import TUNING
from autotune.units import MemoryBudget

__all__ = ["SimulatedEnv", "PROFILE_DIR", "shipped_profiles"]

#: Profiles measured with ``autotune profile`` on the team's 2-core CPU, shipped with the package.
PROFILE_DIR = Path(__file__).parent / "profiles"


def shipped_profiles() -> list[WorkloadProfile]:
    """The profiles shipped in :data:`PROFILE_DIR`, which :class:`SimulatedEnv` trains on by default.

    Example:
        >>> from autotune.envs import shipped_profiles
        >>> len(shipped_profiles()) > 0
        True
    """
    return [load_profile(p) for p in sorted(PROFILE_DIR.glob("*.json"))]


class SimulatedEnv(TuningEnv):
    """Simulated training: see :class:`TuningEnv` for spaces, reward and episode end.

    ## Arguments
    - ``profiles``: WorkloadProfiles or paths to their JSON (default: the shipped ones); reset
      picks one with ``self.np_random``.
    - ``memory_budget``: what :meth:`~autotune.units.MemoryBudget.parse` reads (``"75%"``, bytes,
      a ``MemoryBudget``) or a fraction (float) of the default configuration's peak, or None to
      draw it each episode log-uniformly between the least memory any knobs reach and 1.3x the
      default peak. Budgets are never set below 1.05x that least memory (always feasible).
    - ``randomize``: domain randomization (``randomized_profile``): in half of the episodes a
      synthetic model around the drawn profile on a drawn machine, in the other half the
      profile's own model (its exact memory table kept) on a drawn machine
      (``randomized_machine``): reduced-precision speed from a GPU's tensor cores to an AVX2 CPU.
    - ``adapt_batch``: let the batch action grow the batch (never below the profile's), with
      goodput in the reward (:class:`TuningEnv`); off by default: the batch is the user's.
    - ``min_micro_batch``: the smallest micro-batch a split may reach (None: no accumulation, as
      for a model with BatchNorm: :attr:`autotune.Workload.micro_batch_floor`).
    - ``start_within_budget``: start an episode whose default is over the budget where the
      training environment does (:class:`TuningEnv`'s Starting State); off by default, so
      pretraining episodes teach the policy to reach the budget from the default.
    - ``steps_per_action``: optimizer steps per env step (as in the real env).
    - ``noise``: relative standard deviation of simulated throughput measurements.
    - ``horizon``: episode length used to encode the fraction of training budget used.
    - ``ranks``: data-parallel ranks (an int), or a sequence of rank counts to draw from each
      episode. With more than one rank the ZeRO action is live (stages 0-3, ``costmodel.py``'s
      ZeRO arithmetic); with one it maps to stage 0, as in the real environment.
    - ``bandwidth``: collective bandwidth per rank in bytes/s, or None: 1e9 (an assumption, not
      a measurement), drawn log-uniformly from 1e9 (CPU ranks over gloo) to 1e11 (NVLink-class
      GPUs) each episode when ``randomize``.
    - ``zero_overhead``: a stage-3 step's extra time relative to a local step beyond bandwidth
      (``costmodel.py``), or None: 2.4 as measured on this CPU, drawn log-uniformly from 0.05
      to 4 each episode when ``randomize``.

    Example:
        >>> import gymnasium as gym
        >>> import autotune.envs  # registers autotune/Simulated-v0 and autotune/Training-v0
        >>> env = gym.make("autotune/Simulated-v0")
        >>> observation, info = env.reset(seed=0)
        >>> observation.shape
        (22,)
        >>> observation, reward, terminated, truncated, info = env.step(env.action_space.sample())
        >>> isinstance(reward, float), terminated or truncated
        (True, False)
    """

    def __init__(
        self,
        *,
        profiles: Sequence[WorkloadProfile | str | Path] | None = None,
        memory_budget: MemoryBudget | str | int | float | None = None,
        randomize: bool = False,
        steps_per_action: int = 4,
        noise: float = 0.03,
        horizon: int = TUNING.horizon,
        ranks: int | Sequence[int] = 1,
        bandwidth: float | None = None,
        zero_overhead: float | None = None,
        adapt_batch: bool = False,
        min_micro_batch: int | None = 1,
        start_within_budget: bool = False,
    ) -> None:
        super().__init__(horizon=horizon, max_zero_stage=0, adapt_batch=adapt_batch)
        self.micro_floor = check_min_micro_batch(min_micro_batch)
        self.start_within_budget = start_within_budget
        self.rank_choices = (ranks,) if isinstance(ranks, int) else tuple(ranks)
        if not self.rank_choices or any(not isinstance(r, int) or r < 1 for r in self.rank_choices):
            raise ConfigError(f"ranks must be an int >= 1 or a non-empty sequence of them, but got {ranks!r}.")
        if bandwidth is not None and not bandwidth > 0:
            raise ConfigError(f"bandwidth must be > 0 bytes/s, but got {bandwidth!r}.")
        self.bandwidth_arg = bandwidth
        self.bandwidth = bandwidth or 1e9
        if zero_overhead is not None and not zero_overhead >= 0:
            raise ConfigError(f"zero_overhead must be >= 0, but got {zero_overhead!r}.")
        self.zero_overhead_arg = zero_overhead
        self.zero_overhead = CPU_ZERO_OVERHEAD if zero_overhead is None else zero_overhead
        loaded = [p if isinstance(p, WorkloadProfile) else load_profile(Path(p)) for p in profiles or []]
        self.profiles = loaded or shipped_profiles()
        if not self.profiles:
            raise FileNotFoundError(f"no workload profiles given and none shipped in {PROFILE_DIR}")
        self.memory_budget = None if memory_budget is None else MemoryBudget.parse(memory_budget, fractions=True)
        self.randomize = randomize
        self.steps_per_action = steps_per_action
        self.noise = noise
        self.profile = self.profiles[0]
        self._progress = 0.0

    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        rng = self.np_random
        profile = self.profiles[int(rng.integers(len(self.profiles)))]
        if self.randomize:
            whole = rng.uniform() < 0.5
            self.profile = randomized_profile(profile, rng) if whole else randomized_machine(profile, rng)
        else:
            self.profile = profile
        self.ranks = self.rank_choices[int(rng.integers(len(self.rank_choices)))]
        self.max_zero_stage = 3 if self.ranks > 1 else 0
        if self.bandwidth_arg is None and self.randomize:
            self.bandwidth = float(math.exp(rng.uniform(math.log(1e9), math.log(1e11))))
        if self.zero_overhead_arg is None and self.randomize:
            self.zero_overhead = float(math.exp(rng.uniform(math.log(0.05), math.log(4.0))))
        start = Levels.default_for(self.profile.batch_size)
        default_peak = self._peak_bytes(start)
        # The least memory any knob setting reaches: micro-batch 1, every block recomputed and in
        # reduced precision (at ZeRO-3 with several ranks). A budget below it would make every
        # step a penalty (model states alone can exceed a budget), which teaches nothing.
        smallest = self._cost(
            Levels(
                micro=0, precision=FRACTION_LEVELS - 1, checkpoint=FRACTION_LEVELS - 1, zero_stage=self.max_zero_stage
            )
        )
        floor = 1.05 * min(smallest.peak_bytes, default_peak)
        if self.memory_budget is None:
            # log-uniform from the floor to 1.3x the default peak: tight and loose budgets alike
            u = rng.uniform(0.0, 1.0)
            budget = int(floor * (1.3 * default_peak / floor) ** u)
        else:
            budget = int(max(self.memory_budget.resolve(lambda: default_peak), floor))
        self._progress = 0.0
        p = self.profile
        per_block = [b.fp32_per_sample for b in p.blocks]
        model = ModelDescriptor.describe(
            num_parameters=p.num_parameters, block_bytes=per_block, other_bytes=p.other_activation_per_sample
        )
        return start, model, self._machine_descriptor(budget), budget

    def _machine_descriptor(self, budget: int) -> MachineDescriptor:
        # The same two ratios TrainingEnv measures at reset, at the episode's starting knobs.
        plain = Levels.default_for(self.profile.batch_size)
        full = dataclasses.replace(plain, precision=FRACTION_LEVELS - 1)
        ckpt = dataclasses.replace(plain, checkpoint=FRACTION_LEVELS - 1)
        t = _local_seconds(self.profile, plain)
        return MachineDescriptor(
            # 0 where the model cannot run in reduced precision: what TrainingEnv's probe reads
            reduced_speed=0.0 if self.profile.reduced_failure else t / _local_seconds(self.profile, full),
            budget_ratio=budget / self.profile.model_state_bytes,
            recompute_cost=_local_seconds(self.profile, ckpt) / t - 1.0,
        )

    def _cost(self, knobs: Levels) -> StepCost:
        return step_cost(
            self.profile, knobs, ranks=self.ranks, bandwidth=self.bandwidth, zero_overhead=self.zero_overhead
        )

    def _peak_bytes(self, knobs: Levels) -> int:
        if self.profile.reduced_failure and (knobs.precision > 0 or knobs.outer):
            return INFEASIBLE_PEAK  # refused like an over-budget setting, as TrainingEnv refuses it
        return self._cost(knobs).peak_bytes

    def _train(self, knobs: Levels) -> Interval:
        p = self.profile
        cost = self._cost(knobs)
        batch = self._global_batch(knobs)
        b_noise = self._curve(p.curve_b_noise)
        # Statistical progress in samples-at-the-starting-batch (Pollux): a bigger batch makes
        # less progress per sample once it exceeds the noise scale.
        eff = statistical_efficiency(batch_size=batch, base_batch_size=self._batch0, noise_scale=b_noise)
        self._progress += self.steps_per_action * batch * eff
        jitter = float(math.exp(self.np_random.normal(0.0, self.noise))) if self.noise else 1.0
        return Interval(
            batch=batch,
            throughput=batch / cost.seconds * jitter,
            peak_bytes=cost.peak_bytes,
            b_noise=b_noise,
            loss=self._curve(p.curve_loss),
            train_seconds=self.steps_per_action * cost.seconds,
            # Knob changes are free in the local loop; a ZeRO change rebuilds the engine: charged
            # as one step's time (state gathered and scattered again: one pass over the states).
            reconfig_seconds=cost.seconds if knobs.zero_stage != self._cursor.zero_stage else 0.0,
        )

    def _curve(self, values: Sequence[float]) -> float:
        return float(np.interp(self._progress, self.profile.curve_samples, values))


def _local_seconds(p: WorkloadProfile, knobs: Levels) -> float:
    return step_cost(p, knobs).seconds
