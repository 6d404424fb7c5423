"""The framework callbacks' front-end: per-block knobs on a model another loop trains.

A framework's loop owns the micro-batch (its DataLoader) and the accumulation. What lives on the
model changes at once: per-block precision (bf16 autocast islands; fp16 would need the loop's
loss scaler) and per-block activation checkpointing. The split of the user's effective batch into
micro-batch x accumulation changes only where the loop can rebuild its DataLoader and honour a new
accumulation, at an epoch boundary (Lightning; not Hugging Face's Trainer): such a change is
*pending* from the decision until the framework says it took effect (:meth:`FrameworkLoop.take_split`).
The effective batch never changes, and the split never changes before the first step: a budget
below the default's peak starts recomputing every block, or, where that does not fit either, the
callback raises :class:`~autotune.errors.ConfigError` from the framework's train-begin hook (as
``Adaptive(...)`` does: training on over the budget the user gave is not what was asked for).

The decisions are :class:`autotune.adapt.controller.Controller`'s, the same as
:class:`autotune.adapt.Adaptive`'s: the start within the budget, the source's plan, the budget
gate, measurement overruling the source, the revert on a step measured over the budget, the same
rule on a non-finite loss. A non-finite gradient is found in the framework's own hook before its
optimizer step (:meth:`FrameworkLoop.before_optimizer_step`: every gradient set to None, so the
optimizer changes no parameter and no state), except under fp16 loss scaling, whose scaler skips
such a step itself. What differs, and why (the framework's rules, not a choice):

* **No side-by-side trials**: a framework's loop cannot switch the micro-batch every step, and a
  trial alternating only the wrappers would time the loop's own per-step work (logging, its
  DataLoader) at random into either side: a proposal is judged against the best configuration
  measured so far, one stint after the other.
* **No tracked step**: the step is the framework's, so a configuration's peak is its verified
  prediction (only verified predictions admit, and they are what it is judged by), checked on
  CUDA against the caching allocator's run-wide statistics at each decision. A loop that can
  measure a step's peak hands it in with :attr:`FrameworkLoop.measure_peak`; one measured over
  the budget is then left at once, as in ``Adaptive``.

**The user's own flags** are the start (:mod:`autotune.integrations._flags`): blocks the model
already recomputes (Hugging Face's ``activation_checkpointing=True``) are the default's
``checkpoint``, recomputed by autotune's wrappers with the model's own flags off for the run; a loop
that autocasts the forward itself (``bf16=True``, ``precision="bf16-mixed"``) owns the outer
precision, which autotune then neither wraps a second time nor moves. What runs is what the history
and :attr:`FrameworkLoop.config` say, and the percentage budget is of that configuration's peak.
One line says it at the start (an :class:`~autotune.errors.AutotuneWarning`, and the history's
first change, source ``"flags"``).

**Evaluation** (the Trainer's ``evaluate()`` every N steps, Lightning's validation) is part of
the peak the budget protects, but not of any training configuration: the callbacks bracket it
with :meth:`FrameworkLoop.evaluation_begin` and :meth:`FrameworkLoop.evaluation_end`. The first
evaluation's peak is measured (:attr:`FrameworkLoop.evaluation_peak`): on the CPU exactly, by
tracking every storage on the model's device over it (the model, the optimizer's state and what
the evaluation allocates); on CUDA as the caching allocator's reserved peak over it. Around
every evaluation on CUDA the allocator's peak statistics are read (the training window's, kept)
and reset, so the training steps' peaks, the run's statistics the gate reads at decisions and a
step's measured peak never include an evaluation: an evaluation over the budget never reverts
or shrinks the training configuration (transformers#32215: ``auto_find_batch_size`` halved the
training batch when evaluation ran out of memory). It is said once, with what to lower instead.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from autotune.adapt.controller import Controller
from autotune.adapt.decider import Decider
from autotune.adapt.recompiles import Recompiles
from autotune.adapt.records import Change
from autotune.adapt.saved import check_saved_batch, check_saved_model, model_record
from autotune.adapt.source_choice import PolicyArg, decision_source, selective_in_play
from autotune.config import TrainConfig
from autotune.errors import AutotuneWarning, ConfigError, OverBudgetWarning
from autotune.integrations._flags import LoopPrecision, ModelCheckpointing
from autotune.knobs import check_min_micro_batch
from autotune.measurement.cuda_memory import (
    AllocatorStats,
    StatsSource,
    allocator_source,
)
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective
from autotune.measurement.tracker import breakdown, tracker_class
from autotune.memory.gate import BudgetGate, admission
from autotune.train.base import finite_gradients
from autotune.train.wrappers import BlockWrappers, apply_block_knobs, apply_config
from autotune.units import DEFAULT_PEAK, MemoryBudget
from autotune.workload import Workload

__all__ = ["FrameworkLoop"]

# Of FrameworkLoop.state_dict(): a change to its keys bumps it (2: evaluation_peak; 3: the model's
# fingerprint, so a state is never applied to another model).
_STATE_VERSION = 3


class FrameworkLoop:
    """A framework's loop as the controller's front-end (:class:`autotune.adapt.frontend.FrontEnd`):
    decisions every ``decide_every`` optimizer steps, applied to the model as block wrappers, a
    split change pending until the loop takes it."""

    paired = False  # see the module's docstring: no side-by-side trials in a framework's loop
    splits_now = False  # the loop's first DataLoader is built before the callback starts

    def __init__(
        self,
        *,
        policy: PolicyArg,
        memory_budget: MemoryBudget | str | int | None,
        decide_every: int,
        blocks: list[str] | None,
        min_micro_batch: int | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
    ) -> None:
        if not isinstance(decide_every, int) or isinstance(decide_every, bool) or decide_every < 2:
            raise ConfigError(f"decide_every must be an int >= 2, but got {decide_every!r}.")
        self.objective = check_objective(objective)
        self.source = decision_source(policy)
        self.budget = MemoryBudget.parse(memory_budget, default=DEFAULT_PEAK)
        self.decide_every = decide_every
        self.blocks = blocks
        self.min_micro_batch = check_min_micro_batch(min_micro_batch)
        self.controller: Controller | None = None
        self._model: torch.nn.Module | None = None
        self._wrappers: BlockWrappers | None = None
        self._names: tuple[str, ...] = ()
        # The model's parameter layout (Workload.fingerprint) and size, saved with the state.
        self._model_id: dict[str, Any] = {}
        self._started: float | None = None
        self._warm = False  # whether the step under way is timed: not the first after a change
        self.split = False  # whether the loop lets the micro-batch x accumulation split change
        # The CUDA caching allocator of the model's device (None on the CPU): its reserved/allocated
        # ratio scales the gate's predictions (the framework's steps are not tracked one by one).
        self.allocator: StatsSource | None = None
        self._device: torch.device | None = None
        #: The measured peak bytes of the step that just ran under a configuration, where the loop
        #: can measure one (None: no measurement, the default: see the module's docstring).
        self.measure_peak: Callable[[TrainConfig], int | None] | None = None
        self._resume: dict[str, Any] | None = None  # a saved state, restored at begin()
        #: The first evaluation's measured peak bytes (on CUDA: the allocator's reserved peak), None
        #: before one ran under the callback (see the module's docstring).
        self.evaluation_peak: int | None = None
        self._evaluating = False
        self._tracker: Any = None  # the CPU's exact tracker over the first evaluation
        # CUDA: the training windows' peaks so far (an evaluation's left out), kept across resets.
        self._trained: AllocatorStats | None = None
        #: The loop's own precision, from the user's flags (set at :meth:`begin`).
        self.precision = LoopPrecision()
        #: The model's own checkpointing flags, taken over at :meth:`begin` (None before).
        self.checkpointing: ModelCheckpointing | None = None
        #: How the loop compiles the model (``"torch_compile=True"``; set at :meth:`begin`), None: eager.
        self.compiled: str | None = None

    # ---- what the callbacks read ----------------------------------------------------------------------

    @property
    def history(self) -> list[Change]:
        """Every decision so far (empty before :meth:`begin`)."""
        return self.controller.history if self.controller is not None else []

    @property
    def config(self) -> TrainConfig | None:
        """The configuration on the model (None before :meth:`begin`)."""
        return self.controller.config if self.controller is not None else None

    @property
    def gate(self) -> BudgetGate | None:
        return self.controller.gate if self.controller is not None else None

    @property
    def decider(self) -> Decider | None:
        return self.controller.decider if self.controller is not None else None

    @property
    def pending(self) -> Change | None:
        """An admitted split change waiting for the loop's epoch boundary."""
        return self.controller.pending if self.controller is not None else None

    def begin(
        self,
        model: torch.nn.Module,
        dataset: Any,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        *,
        micro_batch_size: int,
        accum: int,
        name: str,
        split: bool = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        precision: LoopPrecision | None = None,
        checkpoint_flag: str = "the model's own activation checkpointing",
        compiled: str | None = None,
    ) -> None:
        """Read the user's flags, profile the model (a copy of it), resolve the budget, and put the
        run where the budget and the source's plan say (a split in the plan waits for the next
        epoch boundary, as any split change).

        ``split``: the loop can take a new micro-batch x accumulation at its next epoch boundary.
        ``collate_fn``: the framework's DataLoader's, so the profile runs on batches as it trains on.
        ``precision``: the loop's own autocast, from the user's flags (None: none).
        ``checkpoint_flag``: how the user turned the model's checkpointing on, for the start line.
        ``compiled``: how the loop compiles the model (:func:`autotune.adapt.recompiles.loop_compiled`),
        in words for the start line; None: eager. Each change of block knobs then recompiles: the
        controller measures it from the steps' wall seconds and counts it in its decisions.

        Raises:
            ConfigError: nothing this loop can take fits the memory budget (the controller's rule).
        """
        self.split, self.compiled = split, compiled
        self.precision = precision if precision is not None else LoopPrecision()
        workload = Workload(
            name=name,
            model=model,
            dataset=dataset,
            loss_fn=loss_fn,
            blocks=self.blocks,
            batch_size=micro_batch_size * accum,
            collate_fn=collate_fn,
            min_micro_batch=self.min_micro_batch,
        )
        names = workload.block_names()
        self.checkpointing = ModelCheckpointing.read(model, names)
        plain = TrainConfig(micro_batch_size=micro_batch_size, grad_accum_steps=accum, grad_clip=None)
        default = self._flags_config(plain, self.checkpointing)
        # Off before the profile too: its copies of the model recompute by autotune's wrappers only.
        self.checkpointing.take_over()
        try:
            self._start(model, workload, default, lambda: self._say_flags(plain, default, checkpoint_flag))
        except BaseException:
            self.remove()  # the model as the loop gave it (its own checkpointing back on) when the run cannot start
            raise

    def _start(self, model: torch.nn.Module, workload: Workload, default: TrainConfig, say: Callable[[], None]) -> None:
        """The gate, the controller and the start (:meth:`begin`'s, once the flags are read)."""
        first = next(model.parameters(), None)
        device = "cpu" if first is None else first.device.type
        self._device = None if first is None else first.device
        self.allocator = None if first is None else allocator_source(first.device)
        selective = selective_in_play(self.source, default, len(workload.block_names()))
        gate = BudgetGate.build(
            workload,
            self.budget,
            default,
            reduced_precision=self.source is not None,
            device_type=device,
            selective=selective,
        )
        self._model, self._names = model, workload.block_names()
        self._model_id = model_record(workload)
        self.controller = Controller(
            frontend=self,
            source=self.source,
            gate=gate,
            default=default,
            fraction=self.budget.fraction,
            decide_every=self.decide_every,
            min_micro_batch=workload.micro_batch_floor,
            micro_why=workload.micro_batch_reason,
            objective=self.objective,
            recompiles=(
                Recompiles(num_blocks=len(self._names), horizon=self.decide_every)
                if self.compiled is not None
                else None
            ),
        )
        say()
        self.controller.begin(workload, device_type=device)
        if self._wrappers is None:  # the run starts at the default, which the flags may have given knobs
            self.put(self.controller.config)
        if self._resume is not None:
            state, self._resume = self._resume, None
            self._restore(state)

    def _flags_config(self, plain: TrainConfig, checkpointing: ModelCheckpointing) -> TrainConfig:
        """``plain`` (the loop's split, fp32, no recompute) with what the user's flags already run:
        the blocks the model recomputes, the loop's own outer precision (its blocks in it, as
        Hugging Face's ``bf16=True`` runs them)."""
        blocks = checkpointing.blocks
        checkpoint: bool | tuple[bool, ...] = blocks[0] if len(set(blocks)) == 1 else (blocks or False)
        outer = "fp32" if self.precision.fixed else self.precision.outer
        return dataclasses.replace(plain, precision=outer, outer_precision=outer, checkpoint=checkpoint)

    def _say_flags(self, plain: TrainConfig, default: TrainConfig, checkpoint_flag: str) -> None:
        """One line, in the history (source ``"flags"``) and as a warning: the flags taken over."""
        assert self.controller is not None and self.checkpointing is not None
        parts = [self.checkpointing.describe(checkpoint_flag), self.precision.describe()]
        if self.compiled is not None:
            parts.append(
                f"the model is compiled ({self.compiled}): each change of per-block knobs recompiles, measured "
                "(its first step over the steady ones) and counted in each decision"
            )
        said = "; ".join(p for p in parts if p)
        if not said:
            return
        reason = f"starting from your flags: {said}"
        self.controller.decider.note(
            Change(step=0, source="flags", before=plain, after=default, applied=True, reason=reason)
        )
        warnings.warn(AutotuneWarning(f"autotune: {reason}: {default.describe()}"), stacklevel=4)

    # ---- resume ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs, as plain values: the configuration on the model, every decision
        and measurement, the source's state and the recent losses (a split change still waiting
        for its epoch boundary is decided again). Before :meth:`begin`: the state it will restore."""
        if self.controller is None:
            return dict(self._resume or {})
        return {
            "version": _STATE_VERSION,
            "config": self.controller.config.to_dict(),
            "evaluation_peak": self.evaluation_peak,
            "model": dict(self._model_id),
            **self.controller.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` at :meth:`begin` (the framework restores callbacks before the
        model and its loop are known to them)."""
        if state.get("version") not in (1, 2, _STATE_VERSION):  # 1: no evaluation peak; 2: no model's
            raise ConfigError(
                f"AutotuneCallback state must be version 1, 2 or {_STATE_VERSION}, but got {state.get('version')!r}."
            )
        self._resume = dict(state)
        self.evaluation_peak = state.get("evaluation_peak")

    def _restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: its per-block knobs on the model (the split is the loop's, as it
        restarted), if this run's budget gate admits them; nothing measured is explored again."""
        assert self.controller is not None
        check_saved_model(
            state.get("model"),
            self._model_id,
            state="AutotuneCallback",
            run="fit",
            fix="resume it with the model it was saved from",
        )
        here = self.controller.config
        saved = TrainConfig.from_dict(state["config"])
        check_saved_batch(
            saved,
            here,
            adapt_batch=False,
            state="AutotuneCallback",
            run="fit",
            fix="resume it with the batch size and gradient accumulation it was saved at",
        )
        self.controller.load_state_dict(state)
        # Its per-block knobs as this loop takes them (the flags' pins too); the split is the loop's.
        knobs = self.takes(here, saved)
        target = dataclasses.replace(
            knobs, micro_batch_size=here.micro_batch_size, grad_accum_steps=here.grad_accum_steps
        )
        self.controller.restore(target, step=0, run="fit")

    # ---- the front-end's hooks ------------------------------------------------------------------------

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        """What of ``proposed`` this loop can run from ``current``: the per-block knobs and the outer
        precision, the split where the loop can change it (same effective batch); no fp16 anywhere
        (the loop's scaler) unless the loop's own precision is fp16 (it scales the loss then). The
        user's flags pin what autotune cannot change: the loop's own outer precision (and block
        precisions other than it or fp32), every precision where the flags are not a
        ``TrainConfig`` precision, the recompute the model keeps doing itself."""
        loop = self.precision
        precision, outer = proposed.precision, proposed.outer_precision
        if loop.fixed:
            precision, outer = current.precision, current.outer_precision
        elif loop.owned:
            outer = loop.outer
            blocks = proposed.precision if isinstance(proposed.precision, tuple) else (proposed.precision,)
            if any(p not in ("fp32", outer) for p in blocks):
                precision = current.precision
        kept = self.checkpointing is not None and self.checkpointing.outside
        target = dataclasses.replace(
            current,
            precision=precision,
            outer_precision=outer,
            checkpoint=current.checkpoint if kept else proposed.checkpoint,
        )
        if self.split and proposed.effective_batch_size == current.effective_batch_size:
            target = dataclasses.replace(
                target, micro_batch_size=proposed.micro_batch_size, grad_accum_steps=proposed.grad_accum_steps
            )
        return current if target.uses_fp16 and loop.outer != "fp16" else target

    def apply(self, change: Change) -> Change | None:
        """The knobs on the model now; a change of split waits for :meth:`take_split` (None)."""
        assert self.controller is not None
        if change.after.micro_batch_size != self.controller.config.micro_batch_size:
            return None
        self.put(change.after)
        return change

    def b_noise(self) -> float | None:
        return None  # the framework's backward: no per-micro-batch gradients to estimate it from

    def run_stats(self) -> AllocatorStats | None:
        if self.allocator is None or self._device is None:
            return None
        # Reset only around evaluations (the user's statistics too): the training windows' peaks.
        return _peaks(self._trained, AllocatorStats.read(self.allocator, self._device))

    # ---- the loop's steps -----------------------------------------------------------------------------

    def step_begin(self) -> None:
        self._started = time.perf_counter()

    def step_end(self, step: int, loss: float | None) -> None:
        """Optimizer step ``step`` (1-based, the framework's global step) ended."""
        assert self.controller is not None, "begin() first"
        config, throughput, seconds = self.controller.config, None, None
        if self._started is not None:
            seconds, self._started = time.perf_counter() - self._started, None
            if self._warm and seconds > 0:
                throughput = config.effective_batch_size / seconds
            self._warm = True
        peak = self.measure_peak(config) if self.measure_peak is not None else None
        # The wall seconds: on a compiled model the first step after a change of block knobs is its recompile.
        self.controller.after_step(
            step - 1, config=config, loss=loss, throughput=throughput, peak=peak, seconds=seconds
        )

    def before_optimizer_step(self, step: int, parameters: Iterable[torch.nn.Parameter]) -> None:
        """The framework's optimizer step ``step`` (1-based) is about to run: a NaN or infinite
        gradient must not reach the weights.

        If one is not finite, every gradient is set to None, so the optimizer steps over every
        parameter (torch's optimizers skip a parameter without a gradient: no update, no weight
        decay, no state such as AdamW's moments or step count), then the NaN rule
        (:meth:`Controller.diverged`): a run that decides raises here, before the optimizer and
        the LR scheduler step; one that does not warns once and the framework's step goes on
        without an update (its scheduler and step count advance).

        Cost: one reduction over the gradients and a device->host sync per optimizer step.

        Args:
            step: The optimizer step about to run, 1-based (the framework's global step + 1).
            parameters: The parameters the optimizer steps.

        Raises:
            NonFiniteLossError: a gradient is not finite and the run decides.
        """
        assert self.controller is not None, "begin() first"
        params = [p for p in parameters if p.grad is not None]
        if bool(finite_gradients([p.grad for p in params if p.grad is not None])):  # the sync point
            return
        for p in params:
            p.grad = None
        self.controller.diverged(step - 1, config=self.controller.config, loss=None, skipped=True)

    # ---- evaluation ----------------------------------------------------------------------------------

    def evaluation_begin(self, *optimizers: torch.optim.Optimizer) -> None:
        """An evaluation starts (between optimizer steps). On CUDA the training window's peaks are
        kept and the allocator's peak statistics reset; on the CPU the first evaluation is tracked
        (the model and the ``optimizers``' state count: they are on the device throughout). Before
        :meth:`begin` (Lightning's sanity check) nothing is done."""
        if self.controller is None or self._evaluating:
            return
        self._evaluating = True
        if self.allocator is not None and self._device is not None:
            self._trained = _peaks(self._trained, AllocatorStats.read(self.allocator, self._device))
            self.allocator.reset_peak_memory_stats(self._device)
        elif self.evaluation_peak is None and self._model is not None:
            self._tracker = tracker_class()(device=self._device)
            self._tracker.track_external(self._model, *optimizers)
            self._tracker.__enter__()

    def evaluation_batch(self) -> None:
        """Before each evaluation batch: the tracker's per-module statistics start again (it
        refuses a module's second forward otherwise; its totals are kept)."""
        if self._tracker is not None:
            self._tracker.reset_mod_stats()

    def evaluation_end(self, step: int, *, lower: str) -> None:
        """The evaluation :meth:`evaluation_begin` opened ended at optimizer step ``step``: the
        first one's peak is kept and noted in the history (source ``"evaluation"``, nothing
        applied) and, if over the budget, said once (:class:`~autotune.errors.OverBudgetWarning`;
        ``lower``: what the user lowers instead). The training configuration stays as it is."""
        if not self._evaluating:
            return
        self._evaluating = False
        assert self.controller is not None
        peak = reserved = None
        if self.allocator is not None and self._device is not None:
            stats = AllocatorStats.read(self.allocator, self._device)
            self.allocator.reset_peak_memory_stats(self._device)  # the next training window starts here
            if self.evaluation_peak is None:
                # As the gate judges a measured peak on CUDA: reserved memory, with its headroom.
                peak = reserved = stats.reserved_peak
        elif self._tracker is not None:
            tracker, self._tracker = self._tracker, None
            tracker.__exit__(None, None, None)
            peak = breakdown(tracker.device_snapshot("peak")).total
        if peak is None:
            return
        self.evaluation_peak = peak
        budget, config = self.controller.gate.budget, self.controller.config
        verdict = admission(budget=budget, headroom=0.0, measured=peak, reserved=reserved)
        fits = verdict.admitted
        reason = (
            f"the evaluation {verdict.reason}; the training configuration stays: evaluation is not what the budget "
            "adapts"
        )
        if not fits:
            reason += f" (lower {lower})"
        self.controller.decider.note(
            Change(
                step=step,
                source="evaluation",
                before=config,
                after=config,
                applied=False,
                reason=reason,
                measured_bytes=peak,
            )
        )
        if not fits:
            warnings.warn(OverBudgetWarning(f"step {step}: {reason}"), stacklevel=3)

    def take_split(self, step: int, micro_batch_size: int | None) -> None:
        """The loop reached the epoch boundary a pending split change waited for, and its new
        DataLoader has ``micro_batch_size`` (None: the run ended first). The model's knobs follow
        only if the loop took the micro-batch; otherwise the change is refused and the split stays
        fixed for the rest of the run."""
        change = self.pending
        if change is None:
            return
        assert self.controller is not None
        if micro_batch_size != change.after.micro_batch_size:
            self.split = False
            why = (
                "the run ended before the next epoch boundary"
                if micro_batch_size is None
                else f"the loop's DataLoader kept micro-batch {micro_batch_size}, so the split stays as it is"
            )
            self.controller.made(step, taken=False, why=why)
            return
        self.put(change.after)
        self.controller.made(step, taken=True)

    def put(self, config: TrainConfig) -> None:
        """Put ``config``'s outer precision, per-block precision and checkpointing on the model
        (replacing the last): not the outer region where the loop opens its own, not a recompute
        the model keeps doing itself."""
        assert self._model is not None, "begin() first"
        self._unwrap()
        device = next((p.device.type for p in self._model.parameters()), "cpu")
        if self.checkpointing is not None and self.checkpointing.outside:  # the model's own recompute, left on
            config = dataclasses.replace(config, checkpoint=False)
        if self.precision.owned:  # the loop's autocast is the outer region: never a second one around it
            n = len(self._names)
            self._wrappers = apply_block_knobs(
                self._model,
                self._names,
                config.block_precisions(n),
                config.checkpoint_levels(n),
                device_type=device,
                outer=config.outer_precision,
            )
        else:
            self._wrappers = apply_config(self._model, self._names, config, device_type=device)
        self._warm = False

    def finish(self, step: int) -> None:
        """The loop's training ended at optimizer step ``step``: on a compiled model, what its
        recompiles cost is noted last in the history (source ``"compile"``, nothing applied)."""
        controller = self.controller
        if controller is None or controller.recompiles is None:
            return
        config = controller.config
        controller.decider.note(
            Change(
                step=step,
                source="compile",
                before=config,
                after=config,
                applied=False,
                reason=controller.recompiles.describe(),
            )
        )

    def remove(self) -> None:
        """Take the wrappers off (and a tracker an evaluation that failed left) and set the model's
        own checkpointing flags back: the model is exactly as the loop gave it."""
        self._unwrap()
        if self.checkpointing is not None:
            self.checkpointing.give_back()

    def _unwrap(self) -> None:
        """Take the wrappers off (and a tracker an evaluation that failed left)."""
        if self._tracker is not None:
            tracker, self._tracker, self._evaluating = self._tracker, None, False
            tracker.__exit__(None, None, None)
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None


def _peaks(kept: AllocatorStats | None, now: AllocatorStats) -> AllocatorStats:
    """The peaks of two windows of the allocator's statistics together (its counters of retries
    and out-of-memory errors are since the process started: the later ones)."""
    if kept is None:
        return now
    return dataclasses.replace(
        now,
        allocated_peak=max(kept.allocated_peak, now.allocated_peak),
        reserved_peak=max(kept.reserved_peak, now.reserved_peak),
    )
