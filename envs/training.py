"""``autotune/Training-v0``: the environment over a *running* training loop.

Each step applies the agent's knob changes to the live model (per-block wrappers, micro-batch,
accumulation, loss scaling; weights and optimizer state untouched; with several ranks a ZeRO stage
change rebuilds the DeepSpeed engines and carries that state over), trains a few real optimizer
steps and measures them. Spaces and reward are :class:`TuningEnv`'s.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Sequence

from autotune.envs.core import Interval, MachineDescriptor, ModelDescriptor, TuningEnv
from autotune.envs.knobs import FRACTION_LEVELS, KnobLevels, knobs_to_config

from autotune.config import TrainConfig
from autotune.errors import ConfigError, one_line
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.tracker import tracked_step
from autotune.memory.blocks import profile_blocks
from autotune.procs.session import RankSession, SessionStep
from autotune.resolve import load_workload
from autotune.train.base import StepResult
from autotune.train.local import Trainer
from autotune.units import MemoryBudget
from autotune.workload import Workload

__all__ = ["TrainingEnv"]

_MAX_ZERO_STAGE = 3  # DeepSpeed's stages: 0 (data parallel), 1 (+ optimizer state), 2 (+ gradients), 3 (+ parameters)


def _budget(value: MemoryBudget | int | float) -> MemoryBudget:
    if isinstance(value, MemoryBudget):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"memory_budget must be a MemoryBudget, bytes (int) or a fraction (float), but got {value!r}."
        )
    return MemoryBudget(bytes=value) if isinstance(value, int) else MemoryBudget(fraction=value)


class TrainingEnv(TuningEnv):
    """The real training loop as an environment: see :class:`TuningEnv` for spaces and reward.

    ## Arguments
    - ``workloads``: workload references (built-in names, ``file.py:build``, ...); reset picks one
      with ``self.np_random`` and starts it from the PyTorch-default configuration (fp32, the
      workload's batch in one micro-batch per rank, nothing recomputed, ZeRO stage 0).
    - ``memory_budget``: a :class:`~autotune.units.MemoryBudget`, bytes (int), or a fraction
      (float) of the default configuration's measured peak (per rank).
    - ``steps_per_action``: real optimizer steps per env step. With one micro-batch per step on
      one rank, the first of them runs as two half micro-batches to feed the gradient-noise
      estimate and is not timed.
    - ``device``: ``cpu``, ``cuda`` or None (CUDA when available).
    - ``ranks``: data-parallel ranks. 1 trains in this process (``autotune.train.local.Trainer``).
      More trains on that many DeepSpeed ranks of a :class:`~autotune.procs.session.RankSession`,
      started at the first reset (~10 s) and kept for every episode until ``close()``.

    ## ZeRO stages
    With ``ranks > 1`` the ZeRO action is real: a stage change builds new DeepSpeed engines and
    carries the training state over (fp32 parameters, Adam's moments and step, the LR schedule's
    position, the data stream's position), so training goes on where it was; every other knob
    changes on the live engine. The rebuild's seconds count in the reward's reconfiguration term.
    With ``ranks == 1`` every stage maps to 0 (:func:`~autotune.envs.knobs.apply_action`; no
    action is invalid, so none is masked): ZeRO partitions model states *across* ranks, and at
    one rank stages 1-2 only add DeepSpeed's fp32 master copy (measured: 24 MB more for a
    12.6M-parameter GPT, nothing saved).

    Peak memory of each knob setting is measured exactly once per episode (one real step under
    MemTracker, the highest rank's peak with ranks > 1, then cached: it is identical every time).
    A setting the model cannot run on this machine (one rank: a kernel that raises, such as bf16
    autocast around ``nn.LSTM`` on an AVX2 CPU) is infeasible: refused like an over-budget one,
    with the reason in ``infeasible``; if all-bf16 cannot run, the reduced-precision speed in the
    observation is 0. A failure of the starting configuration is the user's and is raised.
    The gradient noise scale is estimated on one rank only: ZeRO reduces (and partitions) the
    gradients inside the engine, where the micro-batch gradients are not seen; with ranks > 1,
    ``b_noise`` is None (statistical efficiency 1).
    """

    def __init__(
        self,
        *,
        workloads: Sequence[str] = ("mlp-digits",),
        memory_budget: MemoryBudget | int | float = 1.0,
        steps_per_action: int = 4,
        horizon: int = 16,
        device: str | None = None,
        ranks: int = 1,
    ) -> None:
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise ConfigError(f"ranks must be an int >= 1, but got {ranks!r}.")
        super().__init__(horizon=horizon, max_zero_stage=_MAX_ZERO_STAGE if ranks > 1 else 0)
        if not workloads:
            raise ConfigError("TrainingEnv needs at least one workload reference, but got none.")
        if steps_per_action < 2:
            raise ConfigError(f"steps_per_action must be >= 2, but got {steps_per_action}.")
        if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
            raise ConfigError(f"horizon must be an int >= 1, but got {horizon!r}.")
        self.workload_refs = tuple(workloads)
        self.memory_budget = _budget(memory_budget)
        self.steps_per_action = steps_per_action
        self.device = device
        self.ranks = ranks
        self.trainer: Trainer | None = None  # ranks == 1
        self.session: RankSession | None = None  # ranks > 1
        self.workload: Workload | None = None
        self._ranking: tuple[int, ...] = ()
        self._peaks: dict[KnobLevels, int] = {}
        #: Knob settings the model could not run on this machine this episode, with the reason.
        self.infeasible: dict[KnobLevels, str] = {}
        self._model_states = 1  # params + grads + optimizer state, measured with the default knobs
        self._workloads: dict[str, Workload] = {}

    def config_of(self, knobs: KnobLevels) -> TrainConfig:
        """The training configuration that ``knobs`` (knob levels) encode for the current workload."""
        return knobs_to_config(knobs, self._ranking, ranks=self.ranks)

    def _loop(self) -> Trainer | RankSession:
        loop = self.trainer if self.ranks == 1 else self.session
        assert loop is not None, "reset() starts the training loop"
        return loop

    def _begin_episode(self) -> tuple[KnobLevels, ModelDescriptor, MachineDescriptor, int]:
        ref = self.workload_refs[int(self.np_random.integers(len(self.workload_refs)))]
        if ref not in self._workloads:
            self._workloads[ref] = load_workload(ref)
        wl = self.workload = self._workloads[ref]
        profile = profile_blocks(wl, micro_batch_size=2)
        self._ranking = profile.ranked()
        # Data parallelism splits the workload's batch over the ranks (so its LR applies as is).
        start = KnobLevels.default_for(max(1, wl.batch_size // self.ranks))
        if self.ranks == 1:
            self.close()
            self.trainer = Trainer(wl, self.config_of(start), device=self.device)
        else:
            if self.session is None or self.session.closed:  # first episode, or a rank failed
                self.session = RankSession(ranks=self.ranks, device=self.device)
            self.session.start(wl, self.config_of(start))  # a fresh model, in the running ranks
        self._peaks = {}
        self.infeasible = {}
        self.levels = start
        # Adam (and ZeRO's optimizers) create their state in the first step, after the activation
        # peak: a first step's peak leaves it out (gpt-tiny: 34.0 MB vs 44.1 MB from then on).
        self._loop().step()
        default_peak = self._peak_bytes(start)
        budget = self.memory_budget.resolve(lambda: default_peak)
        bytes_sorted = sorted(profile.saved_bytes, reverse=True)
        quarter = max(1, round(len(bytes_sorted) / 4))
        model = ModelDescriptor(
            num_parameters=wl.num_parameters,
            activation_bytes_per_sample=sum(profile.saved_bytes) / profile.micro_batch_size,
            num_blocks=len(profile.names),
            top_quarter_share=sum(bytes_sorted[:quarter]) / max(sum(bytes_sorted), 1),
        )
        machine = MachineDescriptor(reduced_speed=self._reduced_speed(start), budget_ratio=budget / self._model_states)
        return start, model, machine, budget

    def _reduced_speed(self, knobs: KnobLevels) -> float:
        """Step throughput with every block in reduced precision relative to fp32, measured here
        on two real steps each: the simulator's definition (``SimulatedEnv``), so a policy sees
        the same quantity on both. Costs four training steps per episode (with ranks > 1, two
        engine rebuilds too: all blocks bf16 is a bf16 engine)."""
        loop = self._loop()
        seconds = {}
        for level in (FRACTION_LEVELS - 1, 0):  # ends back on the starting (fp32) knobs
            loop.reconfigure(self.config_of(dataclasses.replace(knobs, precision=level)))
            try:
                seconds[level] = min(loop.step().seconds for _ in range(2))
            except Exception as e:
                if self.session is not None or level == 0 or is_out_of_memory(e):
                    raise
                # The model cannot run in reduced precision on this machine (oneDNN has no bf16
                # LSTM primitive on AVX2 CPUs): the policy sees the slowest speed it knows.
                self._discard_failed_step()
                self.infeasible[dataclasses.replace(knobs, precision=level)] = one_line(e)
                seconds[level] = float("inf")
        return seconds[0] / seconds[FRACTION_LEVELS - 1]

    def _discard_failed_step(self) -> None:
        """Drop what a step that raised half-way left behind: partial gradients of its micro-batches."""
        assert self.trainer is not None
        self.trainer.optimizer.zero_grad(set_to_none=True)

    def _peak_bytes(self, knobs: KnobLevels) -> int:
        """Measured once per knob setting (a real training step under MemTracker), then cached.

        With ranks > 1, measuring another ZeRO stage builds its engines and then the current ones
        again (state carried over both ways): the step that follows trains where the episode was.
        """
        if knobs not in self._peaks:
            loop = self._loop()
            loop.reconfigure(self.config_of(knobs))
            try:
                self._peaks[knobs], self._model_states = self._tracked_step()
            except Exception as e:
                # 2**62 bytes: certainly over any budget, so the env refuses the setting with the
                # over-budget penalty. A rank's out-of-memory ends its session with a SessionError
                # (raised here). The starting configuration already trained one step, so another
                # setting failing on one rank is a knob the model cannot take (a kernel this CPU
                # lacks), not a bug in the user's code.
                if is_out_of_memory(e):
                    self._peaks[knobs] = 2**62
                elif self.session is None and knobs != self.levels:
                    self._discard_failed_step()
                    self.infeasible[knobs] = one_line(e)
                    self._peaks[knobs] = 2**62
                else:
                    raise
            finally:
                loop.reconfigure(self.config_of(self.levels))
        return self._peaks[knobs]

    def _tracked_step(self) -> tuple[int, int]:
        """(peak bytes, model-state bytes) of one real step under exact memory tracking."""
        if self.session is not None:
            tracked = self.session.tracked_step()
            return tracked.peak_bytes, max(m.category_peaks.model_states for m in tracked.per_rank)
        assert self.trainer is not None
        local = tracked_step(self.trainer)
        return local.at_peak.total, local.category_peaks.model_states

    def _train(self, knobs: KnobLevels) -> Interval:
        loop = self._loop()
        t0 = time.perf_counter()
        config = self.config_of(knobs)
        if config != loop.config:
            loop.reconfigure(config)  # with ranks > 1 a ZeRO stage change rebuilds the engines here
        reconfig = time.perf_counter() - t0
        results: list[StepResult | SessionStep] = []
        local = self.trainer
        if local is not None and knobs.accum_steps == 1 and knobs.micro_batch_size % 2 == 0:
            results.append(local.step(split=2))  # the noise estimate's second batch size
        timed = [loop.step() for _ in range(self.steps_per_action - len(results))]
        results += timed
        return Interval(
            # Per rank, as the episode's reference batch (TuningEnv._batch0) is: the ratio is what counts.
            batch=self._global_batch(knobs),
            throughput=statistics.median(r.samples / r.seconds for r in timed),
            peak_bytes=self._peak_bytes(knobs),
            b_noise=None if local is None else local.gns.estimate().b_simple,
            loss=statistics.fmean(r.loss for r in results),
            train_seconds=sum(r.seconds for r in results),
            reconfig_seconds=reconfig,
        )

    def close(self) -> None:
        """End the local loop, or the session's ranks (every process reaped)."""
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
        if self.session is not None:
            self.session.close()
            self.session = None
