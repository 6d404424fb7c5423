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

**Evaluation** is part of the peak the budget protects, but not of any training configuration:
its peak is measured and kept apart from the training steps' (:mod:`autotune.integrations._evaluation`).

The class is the loop's front-end and its steps; its evaluations (``_evaluation.py``), what of a
configuration it runs (``_knobs.py``: the flags' start and pins, the wrappers) and its saved state
(``_resume.py``) are mixins in their own modules, each over the loop's own attributes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from autotune.adapt.controller import Controller
from autotune.adapt.recompiles import Recompiles
from autotune.adapt.records import Change
from autotune.adapt.saved import model_record
from autotune.adapt.sources import outer_in_play, reduced_in_play, selective_in_play
from autotune.config import TrainConfig
from autotune.integrations._evaluation import Evaluations
from autotune.integrations._flags import LoopPrecision, ModelCheckpointing
from autotune.integrations._resume import Resume
from autotune.measurement.cuda_memory import (
    allocator_source,
)
from autotune.memory.gate import BudgetGate
from autotune.memory.predict import fixed_split_sizes
from autotune.optimizers import is_over
from autotune.train.base import finite_gradients
from autotune.workload import Workload

__all__ = ["FrameworkLoop"]


class FrameworkLoop(Resume, Evaluations):
    """A framework's loop as the controller's front-end (:class:`autotune.adapt.frontend.FrontEnd`):
    decisions every ``decide_every`` optimizer steps, applied to the model as block wrappers, a
    split change pending until the loop takes it."""

    paired = False  # see the module's docstring: no side-by-side trials in a framework's loop
    splits_now = False  # the loop's first DataLoader is built before the callback starts

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
        optimizer: torch.optim.Optimizer | None = None,
        equal_accumulation: str | None = None,
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
        ``optimizer``: the loop's, so the memory model counts its state (Adafactor's, SGD's), not
        AdamW's; one with parameters outside ``model`` is not (AdamW stands in).
        ``equal_accumulation``: the loop, in words, where it weighs accumulated micro-batches
        equally (Lightning divides each loss by ``accumulate_grad_batches``): a loss that is a mean
        over counted items (:mod:`autotune.loss_items`: label tokens over padded batches) then
        keeps its split, since another would train another gradient (:attr:`split_why` says so).

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
            optimizer=optimizer if optimizer is not None and is_over(optimizer, model) else None,
        )
        self.split_why = None
        if split and equal_accumulation is not None and workload.loss_weighting.count is not None:
            self.split = False
            self.split_why = (
                f"{equal_accumulation} weighs accumulated micro-batches equally, and the loss is a mean over its "
                f"{workload.loss_weighting.name}: another split would train another gradient"
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
        # The user's flags pin the outer precision where the loop opens its own autocast (or no
        # precision knob moves): no proposal moves it then (``takes``), so no other one is profiled.
        pinned = self.precision.owned or bool(self.precision.fixed)
        reduced = reduced_in_play(self.source, workload)
        outers = (
            (default.outer_precision,)
            if pinned
            else outer_in_play(self.source, default, held=workload.held_in_16_bits is not None)
        )
        gate = BudgetGate.build(
            workload,
            self.budget,
            default,
            reduced_precision=reduced,
            device_type=device,
            selective=selective,
            outers=outers[1:],
            note=self.note,
            # A split that never changes: the profile runs at its micro-batch, where every
            # prediction of the run is made.
            micro_batch_sizes=None if self.split else fixed_split_sizes(default.micro_batch_size),
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
            note=self.note,
        )
        say()
        self.controller.begin(workload, device_type=device)
        if self._wrappers is None:  # the run starts at the default, which the flags may have given knobs
            self.put(self.controller.config)
        if self._resume is not None:
            state, self._resume = self._resume, None
            self._restore(state)

    # ---- the front-end's hooks ------------------------------------------------------------------------

    def apply(self, change: Change) -> Change | None:
        """The knobs on the model now; a change of split waits for :meth:`take_split` (None)."""
        assert self.controller is not None
        if change.after.micro_batch_size != self.controller.config.micro_batch_size:
            return None
        self.put(change.after)
        return change

    def b_noise(self) -> float | None:
        return None  # the framework's backward: no per-micro-batch gradients to estimate it from

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
