"""What the framework callbacks share: per-block knobs on a model another loop trains.

A framework's loop owns the micro-batch (its DataLoader) and the accumulation. What lives on the
model changes at once: per-block precision (bf16 autocast islands; fp16 would need the loop's
loss scaler) and per-block activation checkpointing. The split of the user's effective batch into
micro-batch x accumulation changes only where the loop can rebuild its DataLoader and honour a new
accumulation, at an epoch boundary (Lightning; not Hugging Face's Trainer): such a change is
*pending* from the decision until the framework says it took effect (:meth:`LiveKnobs.take_split`).
The effective batch never changes. Every proposal passes the budget gate
(:mod:`autotune.adapt.gate`) first; no step is tracked inside the framework's loop, so only
verified predictions admit.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch

from autotune.adapt.adaptive import PolicyArg, decision_source
from autotune.adapt.gate import BudgetGate, as_budget
from autotune.adapt.records import Change
from autotune.adapt.sources import Observation, RunContext
from autotune.config import TrainConfig
from autotune.errors import AutotuneWarning, ConfigError
from autotune.train.wrappers import BlockWrappers, apply_block_knobs
from autotune.units import MemoryBudget
from autotune.workload import Workload

__all__ = ["LiveKnobs"]


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
        self.history: list[Change] = []
        self.config: TrainConfig | None = None
        self.gate: BudgetGate | None = None
        self._model: torch.nn.Module | None = None
        self._wrappers: BlockWrappers | None = None
        self._names: tuple[str, ...] = ()
        self._seconds: list[float] = []
        self._losses: list[float] = []
        self._started: float | None = None
        self._refused: set[TrainConfig] = set()
        self.split = False  # whether the loop lets the micro-batch x accumulation split change
        self.pending: Change | None = None  # an admitted split change waiting for the loop's epoch boundary

    def begin(self, model: torch.nn.Module, dataset: Any, loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor], *,
              micro_batch_size: int, accum: int, name: str, split: bool = False) -> None:  # fmt: skip
        """Profile the model (a copy of it), resolve the budget, start the decision source.

        ``split``: the loop can take a new micro-batch x accumulation at its next epoch boundary."""
        self.split = split
        from autotune.memory.blocks import profile_blocks

        workload = Workload(name=name, model=model, dataset=dataset, loss_fn=loss_fn, blocks=self.blocks,
                            batch_size=micro_batch_size * accum)  # fmt: skip
        self.config = TrainConfig(micro_batch_size=micro_batch_size, grad_accum_steps=accum, grad_clip=None)
        self.gate = BudgetGate.build(workload, self.budget, self.config, reduced_precision=self.source is not None)
        default = self.config
        self._model, self._names = model, workload.block_names()
        self._fit_budget(default)
        if self.source is not None:
            device = next((p.device.type for p in model.parameters()), "cpu")
            blocks = profile_blocks(workload, micro_batch_size=2)
            gate = self.gate
            self.source.start(RunContext(workload=workload, start=default, budget_bytes=gate.budget, blocks=blocks,
                                         device_type=device, admits=lambda c: gate.check(c).admitted))  # fmt: skip

    def _fit_budget(self, default: TrainConfig) -> None:
        """A default over the budget starts recomputing every block, if that fits; the loop itself
        cannot be stopped from a callback, so if nothing fits it says so and trains as it is."""
        assert self.gate is not None
        verdict = self.gate.check(default)
        if verdict.admitted or (self.budget.fraction is not None and self.budget.fraction >= 1.0):
            return
        target = dataclasses.replace(default, checkpoint=True)
        fits = self.gate.check(target)
        reason = f"the default is over the budget ({verdict.reason}); every block recomputed: {fits.reason}"
        self.history.append(Change(step=0, source="budget", before=default, after=target, applied=fits.admitted,
                                   reason=reason, predicted_bytes=fits.predicted))  # fmt: skip
        if fits.admitted:
            self.apply(target)
        else:
            warnings.warn(AutotuneWarning(f"nothing this callback may change fits the memory budget: {reason}"),
                          stacklevel=4)  # fmt: skip

    def step_begin(self) -> None:
        self._started = time.perf_counter()

    def step_end(self, step: int, loss: float | None) -> None:
        """Optimizer step ``step`` (1-based, the framework's global step) ended."""
        if self._started is not None:
            self._seconds.append(time.perf_counter() - self._started)
            self._started = None
        if loss is not None:
            self._losses.append(loss)
        if step % self.decide_every == 0:
            self._decide(step)

    def _decide(self, step: int) -> None:
        assert self.config is not None and self.gate is not None, "begin() first"
        if self.source is None or self.pending is not None:  # a change still waits for its epoch boundary
            return
        samples = self.config.effective_batch_size
        predicted = self.gate.predict(self.config)
        obs = Observation(step=step, config=self.config, peak_bytes=predicted[0] if predicted else self.gate.budget,
                          throughput=statistics.median(samples / s for s in self._seconds) if self._seconds else 0.0,
                          b_noise=None, losses=tuple(self._losses))  # fmt: skip
        proposal = self.source.propose(obs)
        if proposal is None:
            return
        # What lives on the model, and the split where the loop can take one (same effective batch).
        target = dataclasses.replace(self.config, precision=proposal.config.precision,
                                     checkpoint=proposal.config.checkpoint)  # fmt: skip
        if self.split and proposal.config.effective_batch_size == self.config.effective_batch_size:
            target = dataclasses.replace(target, micro_batch_size=proposal.config.micro_batch_size,
                                         grad_accum_steps=proposal.config.grad_accum_steps)  # fmt: skip
        if target == self.config or "fp16" in target.block_precisions(len(self._names)):
            return
        verdict = self.gate.check(target)
        change = Change(step=step, source=self.source.name, before=self.config, after=target, applied=verdict.admitted,
                        reason=f"{proposal.reason}; {verdict.reason}", predicted_bytes=verdict.predicted)  # fmt: skip
        if not verdict.admitted:
            if target not in self._refused:
                self._refused.add(target)
                self.history.append(change)
            return
        if target.micro_batch_size != self.config.micro_batch_size:
            self.pending = change  # applied when the loop has rebuilt its DataLoader (take_split)
            return
        start = time.perf_counter()
        self.apply(target)
        self.history.append(dataclasses.replace(change, seconds=time.perf_counter() - start))
        self._seconds = []

    def take_split(self, step: int, micro_batch_size: int | None) -> None:
        """The loop reached the epoch boundary a pending split change waited for, and its new
        DataLoader has ``micro_batch_size`` (None: the run ended first). The model's knobs follow
        only if the loop took the micro-batch; otherwise the change is refused and the split stays
        fixed for the rest of the run."""
        change, self.pending = self.pending, None
        if change is None:
            return
        if micro_batch_size != change.after.micro_batch_size:
            self.split = False
            why = (
                "the run ended before the next epoch boundary"
                if micro_batch_size is None
                else f"the loop's DataLoader kept micro-batch {micro_batch_size}, so the split stays as it is"
            )
            self.history.append(dataclasses.replace(change, step=step, applied=False, reason=f"{change.reason}; {why}"))
            return
        start = time.perf_counter()
        self.apply(change.after)
        self.history.append(dataclasses.replace(change, step=step, seconds=time.perf_counter() - start))
        self._seconds = []

    def apply(self, config: TrainConfig) -> None:
        """Put ``config``'s per-block precision and checkpointing on the model (replacing the last)."""
        assert self._model is not None, "begin() first"
        self.remove()
        n = len(self._names)
        device = next((p.device.type for p in self._model.parameters()), "cpu")
        self._wrappers = apply_block_knobs(self._model, self._names, config.block_precisions(n),
                                           config.block_checkpoints(n), device_type=device)  # fmt: skip
        self.config = config

    def remove(self) -> None:
        """Take the wrappers off: the model is exactly as the loop gave it."""
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None
