"""What the framework callbacks share: per-block knobs on a model another loop trains.

A framework's loop owns the micro-batch (its DataLoader) and the accumulation. What lives on the
model changes at once: per-block precision (bf16 autocast islands; fp16 would need the loop's
loss scaler) and per-block activation checkpointing. The split of the user's effective batch into
micro-batch x accumulation changes only where the loop can rebuild its DataLoader and honour a new
accumulation, at an epoch boundary (Lightning; not Hugging Face's Trainer): such a change is
*pending* from the decision until the framework says it took effect (:meth:`LiveKnobs.take_split`).
The effective batch never changes.

The decisions are :class:`autotune.adapt.Adaptive`'s own (:class:`autotune.adapt.decider.Decider`):
the source's start plan (where the loop can take it: on the CPU, the pretrained policy's
calibrated simulator picks the per-block knobs at the loop's split before the first step), the
budget gate first, and measurement overruling the source (a trial that times no better than the
best configuration measured is left for it). No step is tracked inside the framework's loop, so
a configuration's peak is its verified prediction: only verified predictions admit, and they are
what it is judged by (with the median time of its optimizer steps, the first after each change
left out).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch

from autotune.adapt.adaptive import PolicyArg, decision_source
from autotune.adapt.decider import Decider
from autotune.adapt.gate import BudgetGate, as_budget
from autotune.adapt.records import Change
from autotune.adapt.sources import RunContext
from autotune.config import TrainConfig
from autotune.errors import AutotuneWarning, ConfigError
from autotune.measurement.cuda_memory import AllocatorStats, StatsSource, allocator_source
from autotune.settings import TUNING
from autotune.train.wrappers import BlockWrappers, apply_block_knobs
from autotune.units import MemoryBudget
from autotune.workload import Workload

__all__ = ["LiveKnobs"]

_STATE_VERSION = 1  # of LiveKnobs.state_dict(): a change to its keys bumps it


class LiveKnobs:
    """Decisions every ``decide_every`` optimizer steps, applied to a model as block wrappers."""

    def __init__(self, *, policy: PolicyArg, memory_budget: MemoryBudget | str | int | None, decide_every: int,
                 blocks: list[str] | None) -> None:  # fmt: skip
        if not isinstance(decide_every, int) or isinstance(decide_every, bool) or decide_every < 2:
            raise ConfigError(f"decide_every must be an int >= 2, but got {decide_every!r}.")
        self.source = decision_source(policy)
        self.budget = as_budget(memory_budget)
        self.decide_every = decide_every
        self.blocks = blocks
        self.config: TrainConfig | None = None
        self.gate: BudgetGate | None = None
        self.decider: Decider | None = None
        self._model: torch.nn.Module | None = None
        self._wrappers: BlockWrappers | None = None
        self._names: tuple[str, ...] = ()
        self._losses: list[float] = []
        self._started: float | None = None
        self._warm = False  # whether the step under way is timed: not the first after a change
        self.split = False  # whether the loop lets the micro-batch x accumulation split change
        self.pending: Change | None = None  # an admitted split change waiting for the loop's epoch boundary
        # The CUDA caching allocator of the model's device (None on the CPU): its reserved/allocated
        # ratio scales the gate's predictions (the framework's steps are not tracked one by one).
        self.allocator: StatsSource | None = None
        self._device: torch.device | None = None
        self._resume: dict[str, Any] | None = None  # a saved state, restored at begin()

    @property
    def history(self) -> list[Change]:
        """Every decision so far (empty before :meth:`begin`)."""
        return self.decider.history if self.decider is not None else []

    def begin(self, model: torch.nn.Module, dataset: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *,
              micro_batch_size: int, accum: int, name: str, split: bool = False,
              collate_fn: Callable[[list[Any]], Any] | None = None) -> None:  # fmt: skip
        """Profile the model (a copy of it), resolve the budget, start the decision source and
        make its plan (a split in it waits for the next epoch boundary, as any split change).

        ``split``: the loop can take a new micro-batch x accumulation at its next epoch boundary.
        ``collate_fn``: the framework's DataLoader's, so the profile runs on batches as it trains on."""
        self.split = split
        from autotune.memory.blocks import profile_blocks

        workload = Workload(name=name, model=model, dataset=dataset, loss_fn=loss_fn, blocks=self.blocks,
                            batch_size=micro_batch_size * accum, collate_fn=collate_fn)  # fmt: skip
        default = self.config = TrainConfig(micro_batch_size=micro_batch_size, grad_accum_steps=accum, grad_clip=None)
        first = next(model.parameters(), None)
        device = "cpu" if first is None else first.device.type
        self._device = None if first is None else first.device
        self.allocator = None if first is None else allocator_source(first.device)
        gate = self.gate = BudgetGate.build(workload, self.budget, default, reduced_precision=self.source is not None,
                                            device_type=device)  # fmt: skip
        self.decider = Decider(source=self.source, gate=gate, base_batch_size=default.effective_batch_size,
                               takes=self._takes)  # fmt: skip
        self._model, self._names = model, workload.block_names()
        start = self._fit_budget(default)
        context = None
        if self.source is not None:
            blocks = profile_blocks(workload, micro_batch_size=TUNING.profile_micro_batch)
            context = RunContext(workload=workload, start=start, budget_bytes=gate.budget, blocks=blocks,
                                 device_type=device, admits=self._admits)  # fmt: skip
        change = self.decider.begin(start=start, default=start, context=context)
        if change is not None:
            self._make(change, begin=True)
        if self._resume is not None:
            state, self._resume = self._resume, None
            self._restore(state)

    # ---- resume ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs, as plain values: the configuration on the model, every decision
        and measurement, the source's state and the recent losses (a split change still waiting
        for its epoch boundary is decided again). Before :meth:`begin`: the state it will restore."""
        if self.decider is None or self.config is None:
            return dict(self._resume or {})
        return {"version": _STATE_VERSION, "config": self.config.to_dict(), "decider": self.decider.state_dict(),
                "source": self.source.state_dict() if self.source is not None else {},
                "losses": self._losses[-TUNING.observed_losses :]}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` at :meth:`begin` (the framework restores callbacks before the
        model and its loop are known to them)."""
        if state.get("version") != _STATE_VERSION:
            raise ConfigError(
                f"AutotuneCallback state must be version {_STATE_VERSION}, but got {state.get('version')!r}."
            )
        self._resume = dict(state)

    def _restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: its per-block knobs on the model (the split is the loop's, as it
        restarted), if this run's budget gate admits them; nothing measured is explored again."""
        assert self.config is not None and self.decider is not None and self.gate is not None
        saved = TrainConfig.from_dict(state["config"])
        if saved.effective_batch_size != self.config.effective_batch_size:
            raise ConfigError(
                f"the saved fit's effective batch must be this fit's ({self.config.effective_batch_size}), but got "
                f"{saved.effective_batch_size}."
            )
        self.decider.load_state_dict(state["decider"])
        if self.source is not None:
            self.source.load_state_dict(state["source"])
        self._losses = list(state["losses"])
        target = dataclasses.replace(self.config, precision=saved.precision, checkpoint=saved.checkpoint)
        verdict = self.gate.check(target)
        if not verdict.admitted:
            reason = f"resumed under a budget it is over ({verdict.reason}): back to where this fit starts"
            self.decider.history.append(Change(step=0, source="budget", before=target, after=self.config,
                                               applied=True, reason=reason))  # fmt: skip
            self.decider.previous, self.decider.trial = self.config, None
        elif target != self.config:
            self.apply(target)

    def _takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        """What of ``proposed`` this loop can run from ``current``: the per-block knobs, the split
        where the loop can change it (same effective batch); no fp16 block (the loop's scaler)."""
        target = dataclasses.replace(current, precision=proposed.precision, checkpoint=proposed.checkpoint)
        if self.split and proposed.effective_batch_size == current.effective_batch_size:
            target = dataclasses.replace(target, micro_batch_size=proposed.micro_batch_size,
                                         grad_accum_steps=proposed.grad_accum_steps)  # fmt: skip
        return current if "fp16" in target.block_precisions(len(self._names)) else target

    def _admits(self, config: TrainConfig) -> bool:
        """What a source's plan may pick: a configuration this loop can take whole, that the gate admits."""
        assert self.config is not None and self.gate is not None
        return self._takes(self.config, config) == config and self.gate.check(config).admitted

    def _fit_budget(self, default: TrainConfig) -> TrainConfig:
        """A default over the budget starts recomputing every block, if that fits; the loop itself
        cannot be stopped from a callback, so if nothing fits it says so and trains as it is."""
        assert self.gate is not None and self.decider is not None
        verdict = self.gate.check(default)
        if verdict.admitted or (self.budget.fraction is not None and self.budget.fraction >= 1.0):
            return default
        target = dataclasses.replace(default, checkpoint=True)
        fits = self.gate.check(target)
        reason = f"the default is over the budget ({verdict.reason}); every block recomputed: {fits.reason}"
        self.decider.history.append(Change(step=0, source="budget", before=default, after=target,
                                           applied=fits.admitted, reason=reason,
                                           predicted_bytes=fits.predicted))  # fmt: skip
        if not fits.admitted:
            warnings.warn(AutotuneWarning(f"nothing this callback may change fits the memory budget: {reason}"),
                          stacklevel=4)  # fmt: skip
            return default
        self.apply(target)
        return target

    def step_begin(self) -> None:
        self._started = time.perf_counter()

    def step_end(self, step: int, loss: float | None) -> None:
        """Optimizer step ``step`` (1-based, the framework's global step) ended."""
        assert self.config is not None and self.decider is not None, "begin() first"
        if self._started is not None:
            seconds, self._started = time.perf_counter() - self._started, None
            if self._warm and seconds > 0:
                self.decider.timed(self.config, self.config.effective_batch_size / seconds)
            self._warm = True
        if loss is not None:
            self._losses.append(loss)
        if step % self.decide_every == 0 and self.pending is None:  # none while a split waits for its epoch
            if self.allocator is not None and self.gate is not None and self._device is not None:
                # The run's peaks so far (never reset here: they are the user's statistics too).
                self.gate.observe(AllocatorStats.read(self.allocator, self._device))
            obs = self.decider.observation(
                step=step, config=self.config, b_noise=None, losses=tuple(self._losses[-TUNING.observed_losses :])
            )
            change = self.decider.decide(obs)
            if change is not None:
                self._make(change)

    def _make(self, change: Change, *, begin: bool = False) -> None:
        """Make an admitted change now, or, if its split differs, when the loop takes it (:meth:`take_split`)."""
        assert self.config is not None and self.decider is not None
        if change.after.micro_batch_size != self.config.micro_batch_size:
            self.pending = change
            return
        start = time.perf_counter()
        self.apply(change.after)
        if begin:
            self.decider.started(change, seconds=time.perf_counter() - start)
        else:
            self.decider.moved(change, seconds=time.perf_counter() - start)

    def take_split(self, step: int, micro_batch_size: int | None) -> None:
        """The loop reached the epoch boundary a pending split change waited for, and its new
        DataLoader has ``micro_batch_size`` (None: the run ended first). The model's knobs follow
        only if the loop took the micro-batch; otherwise the change is refused and the split stays
        fixed for the rest of the run."""
        change, self.pending = self.pending, None
        if change is None:
            return
        assert self.decider is not None
        if micro_batch_size != change.after.micro_batch_size:
            self.split = False
            why = (
                "the run ended before the next epoch boundary"
                if micro_batch_size is None
                else f"the loop's DataLoader kept micro-batch {micro_batch_size}, so the split stays as it is"
            )
            self.decider.refuse(dataclasses.replace(change, step=step, reason=f"{change.reason}; {why}"))
            return
        start = time.perf_counter()
        self.apply(change.after)
        self.decider.moved(dataclasses.replace(change, step=step), seconds=time.perf_counter() - start)

    def apply(self, config: TrainConfig) -> None:
        """Put ``config``'s per-block precision and checkpointing on the model (replacing the last)."""
        assert self._model is not None, "begin() first"
        self.remove()
        n = len(self._names)
        device = next((p.device.type for p in self._model.parameters()), "cpu")
        self._wrappers = apply_block_knobs(self._model, self._names, config.block_precisions(n),
                                           config.block_checkpoints(n), device_type=device)  # fmt: skip
        self.config = config
        self._warm = False

    def remove(self) -> None:
        """Take the wrappers off: the model is exactly as the loop gave it."""
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None
