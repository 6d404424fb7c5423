"""``autotune/Training-v0``: the environment over a *running* training loop.

Each step applies the agent's knob changes to the live model (per-block wrappers, micro-batch,
accumulation, loss scaling; weights and optimizer state untouched; with several ranks a ZeRO stage
change rebuilds the DeepSpeed engines and carries that state over), trains a few real optimizer
steps and measures them. Spaces and reward are :class:`TuningEnv`'s.

Budget safety: the adaptive runs' admission rule (:class:`autotune.memory.gate.BudgetGate`, one
per episode): a configuration is run only if the memory model
(:func:`autotune.memory.predict.predict_memory`, a fake-tensor profile of the model, checked against
real steps of a copy of it) predicts it within the budget with the gate's headroom; an unverified
prediction counts as over budget unless the configuration was measured. On a GPU, a config over
the budget would run out of memory; here it simply is never run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

from autotune.envs._codec import ACCUM_LEVELS, FRACTION_LEVELS, Levels, knobs_to_config
from autotune.envs.calibration import INFEASIBLE_PEAK
from autotune.envs.core import Interval, MachineDescriptor, ModelDescriptor, TuningEnv, model_state_bytes

from autotune.config import TrainConfig
from autotune.errors import ConfigError, PredictionError, one_line
from autotune.knobs import Knobs
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.probe import probe_speeds
from autotune.measurement.progress import phase_line
from autotune.measurement.tracker import tracked_step
from autotune.memory.blocks import profile_blocks
from autotune.memory.check import TOLERANCE
from autotune.memory.gate import BudgetGate, admission, headroom_for
from autotune.memory.predict import profile_memory
from autotune.memory.profile import MemoryProfile
from autotune.procs.session import RankSession, SessionStep
from autotune.resolve import load_workload
from autotune.train.base import StepResult
from autotune.train.local import Trainer, resolve_device
from autotune.tuning import TUNING
from autotune.units import MemoryBudget
from autotune.workload import Workload

__all__ = ["TrainingEnv"]

_MAX_ZERO_STAGE = 3  # DeepSpeed's stages: 0 (data parallel), 1 (+ optimizer state), 2 (+ gradients), 3 (+ parameters)


class TrainingEnv(TuningEnv):
    """The real training loop as an environment: see :class:`TuningEnv` for spaces and reward.

    ## Arguments
    - ``workloads``: workload references (built-in names, ``file.py:build``, ...) or Workloads;
      reset picks one with ``self.np_random`` and starts it from the PyTorch-default
      configuration (fp32, the workload's batch in one micro-batch per rank, nothing recomputed,
      ZeRO stage 0). That batch stays the effective batch unless ``adapt_batch``.
    - ``adapt_batch``: let the agent grow the batch (never below the workload's), rewarded by
      goodput (:class:`TuningEnv`).
    - ``memory_budget``: what :meth:`~autotune.units.MemoryBudget.parse` reads (a ``MemoryBudget``,
      ``"8GiB"``, ``"75%"``, bytes as an int) or a fraction (float) of the default configuration's
      measured peak (per rank), as ``gymnasium.make`` kwargs have always given it.
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
    With ``ranks == 1`` every stage maps to 0 (the codec's ``apply_action``; no
    action is invalid, so none is masked): ZeRO partitions model states *across* ranks, and at
    one rank stages 1-2 only add DeepSpeed's fp32 master copy (measured: 24 MB more for a
    12.6M-parameter GPT, nothing saved).

    Peak memory of each knob setting is measured exactly once per episode (one real step under
    MemTracker, the highest rank's peak with ranks > 1, then cached: it is identical every time),
    and with one rank only after the memory model admitted it (module docstring); with ranks > 1
    the prediction is not used (the profile would need the 16-bit engine's modes) and every
    setting is measured as before. At reset, the reduced-precision speed and the recompute cost
    are measured at the largest micro-batch (same batch) the memory model admits under the budget.
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
        workloads: Sequence[str | Workload] = ("mlp-digits",),
        memory_budget: MemoryBudget | str | int | float = 1.0,
        steps_per_action: int = 4,
        horizon: int = TUNING.horizon,
        device: str | None = None,
        ranks: int = 1,
        adapt_batch: bool = False,
    ) -> None:
        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 1:
            raise ConfigError(f"ranks must be an int >= 1, but got {ranks!r}.")
        super().__init__(horizon=horizon, max_zero_stage=_MAX_ZERO_STAGE if ranks > 1 else 0, adapt_batch=adapt_batch)
        self.start_within_budget = True  # as an adaptive run starts (TuningEnv's Starting State)
        #: Gets one line per phase of a reset, with its seconds (``tune`` says them); None: silent.
        self.note: Callable[[str], None] | None = None
        if not workloads:
            raise ConfigError("TrainingEnv needs at least one workload reference, but got none.")
        if steps_per_action < 2:
            raise ConfigError(f"steps_per_action must be >= 2, but got {steps_per_action}.")
        if not isinstance(horizon, int) or isinstance(horizon, bool) or horizon < 1:
            raise ConfigError(f"horizon must be an int >= 1, but got {horizon!r}.")
        self.workload_refs = tuple(workloads)
        self.memory_budget = MemoryBudget.parse(memory_budget, fractions=True)
        self.steps_per_action = steps_per_action
        self.device = device
        self.ranks = ranks
        self.trainer: Trainer | None = None  # ranks == 1
        self.session: RankSession | None = None  # ranks > 1
        self.workload: Workload | None = None
        self._ranking: tuple[int, ...] = ()
        self._peaks: dict[Levels, int] = {}
        #: Knob settings the model could not run on this machine this episode, with the reason.
        self.infeasible: dict[Knobs, str] = {}
        self._workloads: dict[int, Workload] = {}
        self._memory: MemoryProfile | None = None  # the memory model's profile of this episode's model
        self._gate: BudgetGate | None = None  # this episode's admission (one rank)
        self._reduced_failure: str | None = None  # why reduced precision cannot even be profiled
        #: Whether the memory model predicted this episode's starting peak within 5% (verified).
        self.prediction_verified = False
        #: Every peak measured by a real step this episode (including reset's), in order.
        self.measured_peaks: list[tuple[Knobs, int]] = []

    def config_of(self, knobs: Knobs) -> TrainConfig:
        """The training configuration ``knobs`` stand for on the current workload (its blocks
        ranked by the activation bytes they save, hungriest first)."""
        return knobs.to_config(self._ranking)

    def _config(self, levels: Levels) -> TrainConfig:
        """The training configuration ``levels`` encode for the current workload."""
        return knobs_to_config(levels, self._ranking, ranks=self.ranks)

    def _levels_knobs(self, levels: Levels) -> Knobs:
        """``levels`` as Knobs (during reset too, before the episode's model descriptor is set)."""
        return levels.knobs(len(self._ranking), ranks=self.ranks)

    def _loop(self) -> Trainer | RankSession:
        loop = self.trainer if self.ranks == 1 else self.session
        assert loop is not None, "reset() starts the training loop"
        return loop

    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        i = int(self.np_random.integers(len(self.workload_refs)))
        if i not in self._workloads:
            ref = self.workload_refs[i]
            self._workloads[i] = ref if isinstance(ref, Workload) else load_workload(ref)
        wl = self.workload = self._workloads[i]
        self.micro_floor = wl.micro_batch_floor  # a BatchNorm model's micro-batch stays its batch
        start_s = time.perf_counter()
        profile = profile_blocks(wl, micro_batch_size=TUNING.profile_micro_batch)
        self._ranking = profile.ranked()
        self._say(phase_line("blocks ranked by the activation bytes they save", start_s, "one fake-tensor forward"))
        start_s = time.perf_counter()
        # Data parallelism splits the workload's batch over the ranks (so its LR applies as is).
        start = Levels.default_for(max(1, wl.batch_size // self.ranks))
        if self.ranks == 1:
            self.close()
            self.trainer = Trainer(wl, self._config(start), device=self.device)
        else:
            if self.session is None or self.session.closed:  # first episode, or a rank failed
                self.session = RankSession(ranks=self.ranks, device=self.device)
            self.session.start(wl, self._config(start))  # a fresh model, in the running ranks
        self._peaks = {}
        self.infeasible = {}
        self.measured_peaks = []
        self._ran: set[TrainConfig] = {self._config(start)}  # configurations that ran a step in this loop
        self._cursor = start
        # Adam (and ZeRO's optimizers) create their state in the first step, after the activation
        # peak: a first step's peak leaves it out (gpt-tiny: 34.0 MB vs 44.1 MB from then on).
        self._loop().step()
        default_peak = self._measured_peak(start)
        self._say(phase_line("training loop ready: the default configuration's first steps", start_s))
        budget = self._budget = self.memory_budget.resolve(lambda: default_peak)
        self._verify_memory_model(wl, start, default_peak)
        model = ModelDescriptor.describe(
            num_parameters=wl.num_parameters, block_bytes=profile.saved_bytes, samples=profile.micro_batch_size
        )
        start_s = time.perf_counter()
        speed, recompute = self._probe_machine(start)
        failure = self._reduced_failure
        bf16 = f"bf16 speed {speed:.2f}x fp32" if failure is None else f"no bf16 ({failure})"
        self._say(phase_line(f"machine probed: {bf16}, recompute {recompute:+.0%}", start_s))
        machine = MachineDescriptor(
            reduced_speed=speed, budget_ratio=budget / model_state_bytes(wl.model), recompute_cost=recompute
        )
        return start, model, machine, budget

    def _verify_memory_model(self, wl: Workload, start: Levels, measured: int) -> None:
        """Profile the model for the memory model (fake tensors, checked against real steps of a
        copy of it, as an adaptive run's gate does), build the episode's gate, and compare its
        prediction of the starting configuration with the peak just measured. A model whose reduced
        precision cannot even be profiled (a kernel this CPU lacks raises under fake tensors as it
        does for real), or whose parameters are 16-bit already, gets an fp32-only profile, and
        reduced precision is infeasible."""
        self._memory, self._gate, self.prediction_verified = None, None, False
        self._reduced_failure = wl.held_note  # loaded in 16 bits: no precision knob to move
        if self.ranks > 1:
            return
        # The checks run where the episode trains (on a GPU: milliseconds, never host steps).
        device = resolve_device(self.device).type
        with contextlib.suppress(PredictionError):  # no memory model for this model
            self._memory = profile_memory(wl, modes=("fp32",), checkpointed=True, device=device, note=self.note)
        if self._memory is not None and self._reduced_failure is None:  # grown by bf16: its passes and check
            try:
                self._memory = profile_memory(
                    wl, modes=("fp32", "bf16"), checkpointed=True, reuse=self._memory, device=device, note=self.note
                )
            except PredictionError as e:
                self._reduced_failure = one_line(e).rpartition("under fake tensors: ")[2]
        config = self._config(start)
        self._gate = BudgetGate(
            wl, self._budget, profile=self._memory, headroom=headroom_for(config), device_type=device
        )
        for levels, peak in self._peaks.items():
            self._gate.record(self._config(levels), peak)
        predicted = self._predicted_peak(start)
        self.prediction_verified = predicted is not None and abs(predicted - measured) <= TOLERANCE * measured

    def _predicted_peak(self, knobs: Levels) -> int | None:
        """The memory model's verified peak of ``knobs``, or None where it has none (no profile, a
        precision it could not profile, an unverified prediction: one of a per-block mix on blocks
        that are not a chain is never verified)."""
        predicted = self._prediction(knobs)
        return predicted[0] if predicted is not None and predicted[1] else None

    def _prediction(self, knobs: Levels) -> tuple[int, bool] | None:
        """The memory model's peak of ``knobs`` and whether it is verified; None without one."""
        if self._gate is None:
            return None
        try:
            return self._gate.predict(self._config(knobs))
        except ConfigError:  # the profile lacks the reduced-precision mode
            return None

    def _admitted(self, knobs: Levels) -> bool:
        """Whether ``knobs`` may run: the episode's gate admits it (measured within the budget, or
        predicted within it with the headroom by a verified memory model). One rank, after
        :meth:`_verify_memory_model` (on ranks every setting is measured, :meth:`_peak_bytes`)."""
        assert self._gate is not None, "one rank, after reset() built the episode's gate"
        try:
            return self._gate.admits(self._config(knobs)).admitted
        except ConfigError:  # the profile lacks the reduced-precision mode: unknown, not measured
            return False

    def _probe_machine(self, knobs: Levels) -> tuple[float, float]:
        """Step throughput with every block in reduced precision relative to fp32, and the extra
        time of recomputing every block (:func:`autotune.measurement.probe.probe_speeds`, two real
        steps each): the simulator's definitions (``SimulatedEnv``), so a policy sees the same
        quantities on both. With one rank the probes run at the largest micro-batch (same batch)
        whose probe configurations the memory model admits, two samples at least; if there is
        none, they are not run and the policy sees neutral values (speed 1, recompute cost 0.5).
        Reduced precision that cannot run here reads as speed 0 (and its setting is infeasible)."""
        full = FRACTION_LEVELS - 1
        probes = [(0, 0), (0, full)] + ([(full, 0)] if self._reduced_failure is None else [])
        if self._reduced_failure is not None:
            self.infeasible[self._levels_knobs(dataclasses.replace(knobs, precision=full))] = self._reduced_failure
        base = knobs
        while self.ranks == 1 and not all(
            self._admitted(dataclasses.replace(base, precision=p, checkpoint=c)) for p, c in probes
        ):
            # Never below two samples: a micro-batch of one is no batch a BatchNorm model trains on
            # ("Expected more than 1 value per channel when training", HF ResNet's last stage).
            if base.micro <= 1 or base.accum + 1 >= len(ACCUM_LEVELS):
                return (1.0 if self._reduced_failure is None else 0.0), 0.5
            base = dataclasses.replace(base, micro=base.micro - 1, accum=base.accum + 1)
        loop = self._loop()
        plain = dataclasses.replace(base, precision=0, checkpoint=0)
        # config_of's reduced precision (bf16); on ranks a failing rank ends the session: no recovery
        speeds = probe_speeds(
            loop,
            self._config(plain),
            reduced="bf16",
            probe_reduced=self._reduced_failure is None,
            recover=None if self.session is not None else self._discard_failed_step,
        )
        if base != knobs:  # back on the starting knobs (the probes ran at a smaller micro-batch)
            loop.reconfigure(self._config(knobs))
        if speeds.reduced_failure is not None:
            self.infeasible[self._levels_knobs(dataclasses.replace(plain, precision=full))] = speeds.reduced_failure
        return speeds.reduced_speed, speeds.recompute_cost

    def _say(self, line: str) -> None:
        if self.note is not None:
            self.note(line)

    def _discard_failed_step(self) -> None:
        """Drop what a step that raised half-way left behind: partial gradients of its micro-batches."""
        assert self.trainer is not None
        self.trainer.optimizer.zero_grad(set_to_none=True)

    def _peak_bytes(self, knobs: Levels) -> int:
        """The measured peak of ``knobs`` (one rank): measured if the memory model admits it, and
        also where its prediction is unverified (or there is none) but not over the budget, as an
        adaptive run measures the first step of a configuration it cannot trust (the study
        measures it in its trial). Only a prediction over the budget leaves ``knobs`` unmeasured:
        a model whose blocks share weights or skip across blocks (a UNet) has no verified
        prediction for a per-block mix, and refusing those would leave the policy nowhere to go."""
        if knobs in self._peaks or self.ranks > 1:
            return self._measured_peak(knobs)
        if self._reduced_failure is not None and (knobs.precision > 0 or knobs.outer):
            self.infeasible[self._levels_knobs(knobs)] = self._reduced_failure
            return INFEASIBLE_PEAK
        if not self._admitted(knobs):
            predicted = self._prediction(knobs)
            # Refused on a verified prediction, or on any prediction over the budget as it stands.
            if predicted is not None and (
                predicted[1]
                or not admission(budget=self._budget, headroom=0.0, predicted=predicted[0], verified=True).admitted
            ):
                return max(predicted[0], self._budget + 1)
        return self._measured_peak(knobs)

    def _measured_peak(self, knobs: Levels) -> int:
        """Measured once per knob setting (a real training step under MemTracker), then cached.

        With ranks > 1, measuring another ZeRO stage builds its engines and then the current ones
        again (state carried over both ways): the step that follows trains where the episode was.
        """
        if knobs not in self._peaks:
            loop = self._loop()
            loop.reconfigure(self._config(knobs))
            try:
                self._peaks[knobs] = self._tracked_step()
                self.measured_peaks.append((self._levels_knobs(knobs), self._peaks[knobs]))
            except Exception as e:
                # INFEASIBLE_PEAK bytes: certainly over any budget, so the env refuses the setting with the
                # over-budget penalty. A rank's out-of-memory ends its session with a SessionError
                # (raised here). The starting configuration already trained one step, so another
                # setting failing on one rank is a knob the model cannot take (a kernel this CPU
                # lacks), not a bug in the user's code.
                if is_out_of_memory(e):
                    self._peaks[knobs] = INFEASIBLE_PEAK
                elif self.session is None and knobs != self._cursor:
                    self._discard_failed_step()
                    self.infeasible[self._levels_knobs(knobs)] = one_line(e)
                    self._peaks[knobs] = INFEASIBLE_PEAK
                else:
                    raise
            finally:
                loop.reconfigure(self._config(self._cursor))
            if self._gate is not None:
                if self._peaks[knobs] == INFEASIBLE_PEAK:  # failed: no peak, nothing to learn of its kinds
                    self._gate.record_failure(
                        self._config(knobs), self.infeasible.get(self._levels_knobs(knobs), "out of memory")
                    )
                else:
                    self._gate.record(self._config(knobs), self._peaks[knobs])
        return self._peaks[knobs]

    def _tracked_step(self) -> int:
        """The peak bytes of one real step under exact memory tracking (the highest rank's)."""
        if self.session is not None:
            return self.session.tracked_step().peak_bytes
        assert self.trainer is not None
        return tracked_step(self.trainer).at_peak.total

    def _train(self, knobs: Levels) -> Interval:
        loop = self._loop()
        t0 = time.perf_counter()
        config = self._config(knobs)
        if config != loop.config:
            loop.reconfigure(config)  # with ranks > 1 a ZeRO stage change rebuilds the engines here
        reconfig = time.perf_counter() - t0
        results: list[StepResult | SessionStep] = []
        local = self.trainer
        if local is not None and local.noise_split == 2:
            results.append(local.step(split=2))  # the noise estimate's second batch size
        if config not in self._ran and self.steps_per_action - len(results) >= 2:
            # A configuration's first step in this loop pays one-time costs (oneDNN kernels per new
            # shape and dtype, cuDNN autotuning, allocator growth): trained, not timed.
            results.append(loop.step())
        self._ran.add(config)
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
