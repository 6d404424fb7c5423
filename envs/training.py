"""``autotune/Training-v0``: the environment over a *running* training loop.

Each step applies the agent's knob changes to the live model (per-block wrappers, micro-batch,
accumulation, loss scaling; weights and optimizer state untouched), trains a few real optimizer
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
from autotune.measurement.memory import tracked_step
from autotune.measurement.oom import is_out_of_memory
from autotune.profile import profile_blocks
from autotune.runner.local import Trainer
from autotune.workload import Workload, load_workload

__all__ = ["TrainingEnv"]


class TrainingEnv(TuningEnv):
    """The real training loop as an environment: see :class:`TuningEnv` for spaces and reward.

    ## Arguments
    - ``workloads``: workload references (built-in names, ``file.py:build``, ...); reset picks one
      with ``self.np_random`` and starts it from the PyTorch-default configuration (fp32, the
      workload's batch in one micro-batch, nothing recomputed).
    - ``memory_budget``: bytes (int), or a fraction (float) of the default configuration's
      measured peak.
    - ``steps_per_action``: real optimizer steps per env step. With one micro-batch per step the
      first of them runs as two half micro-batches to feed the gradient-noise estimate and is not
      timed.
    - ``device``: ``cpu``, ``cuda`` or None (CUDA when available).

    Peak memory of each knob setting is measured exactly once per episode (one real step under
    MemTracker, then cached: it is identical every time). ZeRO stages map to 0: the local loop
    has one rank.
    """

    def __init__(
        self,
        *,
        workloads: Sequence[str] = ("mlp-digits",),
        memory_budget: int | float = 1.0,
        steps_per_action: int = 4,
        horizon: int = 16,
        device: str | None = None,
    ) -> None:
        super().__init__(horizon=horizon, max_zero_stage=0)
        if not workloads:
            raise ValueError("TrainingEnv needs at least one workload reference, but got none.")
        if steps_per_action < 2:
            raise ValueError(f"steps_per_action must be >= 2, but got {steps_per_action}.")
        self.workload_refs = tuple(workloads)
        self.memory_budget = memory_budget
        self.steps_per_action = steps_per_action
        self.device = device
        self.trainer: Trainer | None = None
        self.workload: Workload | None = None
        self._ranking: tuple[int, ...] = ()
        self._peaks: dict[KnobLevels, int] = {}
        self._model_states = 1  # params + grads + optimizer state, measured with the default knobs
        self._workloads: dict[str, Workload] = {}

    def _config(self, knobs: KnobLevels) -> TrainConfig:
        return knobs_to_config(knobs, self._ranking)

    def _begin_episode(self) -> tuple[KnobLevels, ModelDescriptor, MachineDescriptor, int]:
        ref = self.workload_refs[int(self.np_random.integers(len(self.workload_refs)))]
        if ref not in self._workloads:
            self._workloads[ref] = load_workload(ref)
        wl = self.workload = self._workloads[ref]
        profile = profile_blocks(wl, micro_batch_size=2)
        self._ranking = profile.ranked()
        start = KnobLevels.default_for(wl.batch_size)
        self.close()
        self.trainer = Trainer(wl, self._config(start), device=self.device)
        self._peaks = {}
        self.levels = start
        default_peak = self._peak_bytes(start)
        budget = self.memory_budget if isinstance(self.memory_budget, int) else int(default_peak * self.memory_budget)
        bytes_sorted = sorted(profile.saved_bytes, reverse=True)
        quarter = max(1, round(len(bytes_sorted) / 4))
        assert self.trainer is not None
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
        the same quantity on both. Costs four training steps per episode."""
        assert self.trainer is not None
        seconds = {}
        for level in (FRACTION_LEVELS - 1, 0):  # ends back on the starting (fp32) knobs
            self.trainer.reconfigure(self._config(dataclasses.replace(knobs, precision=level)))
            seconds[level] = min(self.trainer.step().seconds for _ in range(2))
        return seconds[0] / seconds[FRACTION_LEVELS - 1]

    def _peak_bytes(self, knobs: KnobLevels) -> int:
        """Measured once per knob setting (a real training step under MemTracker), then cached."""
        if knobs not in self._peaks:
            assert self.trainer is not None
            self.trainer.reconfigure(self._config(knobs))
            try:
                _, at_peak, own = tracked_step(self.trainer)
                self._peaks[knobs] = at_peak.total
                self._model_states = own.model_states
            except Exception as e:
                if not is_out_of_memory(e):
                    raise
                self._peaks[knobs] = 2**62  # a real OOM: certainly over any budget
            finally:
                self.trainer.reconfigure(self._config(self.levels))
        return self._peaks[knobs]

    def _train(self, knobs: KnobLevels) -> Interval:
        trainer = self.trainer
        assert trainer is not None
        t0 = time.perf_counter()
        config = self._config(knobs)
        if config != trainer.config:
            trainer.reconfigure(config)
        reconfig = time.perf_counter() - t0
        results = []
        probe = knobs.accum_steps == 1 and knobs.micro_batch_size % 2 == 0
        if probe:
            results.append(trainer.step(split=2))
        timed = [trainer.step() for _ in range(self.steps_per_action - len(results))]
        results += timed
        return Interval(
            batch=knobs.effective_batch_size,
            throughput=statistics.median(r.samples / r.seconds for r in timed),
            peak_bytes=self._peak_bytes(knobs),
            b_noise=trainer.gns.estimate().b_simple,
            loss=statistics.fmean(r.loss for r in results),
            train_seconds=sum(r.seconds for r in results),
            reconfig_seconds=reconfig,
        )

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None
