"""The per-step guard: a user's batch larger than any seen is checked before it runs.

The budget gate admits configurations on a prediction at the workload's worst case
(:mod:`autotune.worst_case`): declared, scanned, or only the first batch (an
``IterableDataset``). A batch the user hands to :meth:`autotune.Adaptive.step` with more bytes per
sample than that worst case (a longer padded sequence, by its shape) was never predicted. Before
it runs, :class:`ShapeGuard` profiles the memory model at its shape (fake tensors, verified on a
real step of a copy of the model at that shape), makes it the gate's new worst case, and, if the
current configuration no longer fits the budget, moves the run to the first configuration of the
same effective batch that does: smaller micro-batches (more accumulation), then every block
recomputed. So the run never exceeds the budget on a long batch, and the split is a
:class:`~autotune.adapt.records.Change` in the run's history. The run stays split: the long
batch may come again, and decisions from then on are gated at its shape.

A resumed run keeps what the guard saw (:meth:`ShapeGuard.state_dict`, in
:meth:`autotune.Adaptive.state_dict`): the largest bytes per sample and the batch at that shape;
its gate is profiled at that shape once when the state is loaded (a fresh gate's profile is of the
workload's worst case, which the saved run had outgrown), and a batch no larger is not profiled again.

Cost: one profile per new largest shape (a few seconds of fake-tensor passes and two real
check steps per kind of configuration); a batch no larger than the largest seen costs one pass
over its tensors' sizes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from autotune.adapt.records import Change
from autotune.batches import map_tensors
from autotune.config import TrainConfig
from autotune.knobs import smallest_micro_batch
from autotune.worst_case import sample_bytes

if TYPE_CHECKING:
    from autotune.adapt.decider import Decider
    from autotune.adapt.loop import AdaptLoop
    from autotune.config import Precision
    from autotune.memory.gate import BudgetGate
    from autotune.workload import Workload

__all__ = ["ShapeGuard", "splits"]

SOURCE = "shape guard"


class ShapeGuard:
    """Checks each user batch against the largest shape the gate's profile covers.

    Args:
        workload: The run's workload (its model is profiled, never trained, here).
        gate: The run's budget gate; a longer batch replaces its profile.
        reduced_precision: Whether the gate's profile holds bf16 blocks (a decision source's run).
        selective: Whether it holds the selective recompute runs
            (:func:`autotune.adapt.sources.selective_in_play`).
        outers: The outer precisions whose modes it holds
            (:func:`autotune.adapt.sources.outer_in_play`).
    """

    def __init__(
        self,
        workload: Workload,
        gate: BudgetGate,
        *,
        reduced_precision: bool,
        selective: bool = False,
        outers: tuple[Precision, ...] = ("fp32",),
    ) -> None:
        self.workload, self.gate, self.reduced_precision = workload, gate, reduced_precision
        # The gate's profile holds the selective runs and these outer precisions' modes: so must a new one.
        self.selective, self.outers = selective, outers
        self.largest: int | None = None  # bytes per sample the gate's profile covers (found lazily)
        self.batch: Any = None  # the batch at that shape (host copies), once one outgrew the worst case

    def apply(self, batch: Any, loop: AdaptLoop, decider: Decider) -> Change | None:
        """:meth:`before` for ``loop``'s next step: the change made (``loop`` reconfigured) and
        logged in ``decider``'s history, or None."""
        change = self.before(batch, loop.config, loop.step_count)
        if change is not None:
            if change.applied:
                loop.reconfigure(change.after)
            decider.guarded(change)
        return change

    def before(self, batch: Any, config: TrainConfig, step: int) -> Change | None:
        """The change to make before ``batch`` runs under ``config`` at ``step``, or None (it fits
        as is, or it is no larger than a batch seen). A refused change (``applied=False``): no
        configuration of the same effective batch fits, the step runs as it is."""
        if self.largest is None:
            self.largest = self.workload.worst_case.sample_bytes
        size = sample_bytes(batch)
        if size <= self.largest:
            return None
        seen, self.largest = self.largest, size
        self._reprofile(batch)
        what = f"the batch of step {step} has {size} B per sample, more than any predicted before ({seen} B)"
        verdict = self.gate.admits(config)
        if verdict.admitted:
            return None
        for candidate in splits(config, min_micro_batch=self.workload.micro_batch_floor):
            fits = self.gate.admits(candidate)
            if fits.admitted:
                reason = f"{what}: {config.describe()} at its shape: {verdict.reason}; split: {fits.reason}"
                return Change(
                    step=step,
                    source=SOURCE,
                    before=config,
                    after=candidate,
                    applied=True,
                    reason=reason,
                    predicted_bytes=fits.predicted,
                )
        reason = f"{what}: {verdict.reason}, and no split of the batch fits: it runs as it is"
        return Change(
            step=step,
            source=SOURCE,
            before=config,
            after=config,
            applied=False,
            reason=reason,
            predicted_bytes=verdict.predicted,
        )

    def _reprofile(self, batch: Any) -> None:
        """The gate's profile, taken again at ``batch``'s shape (declared as the worst case)."""
        from autotune.memory.gate import profile_or_reason

        self.batch = map_tensors(lambda t: t.detach().cpu(), batch)
        at_shape = dataclasses.replace(self.workload, worst_case_batch=self.batch)
        profile, why = profile_or_reason(
            at_shape,
            reduced_precision=self.reduced_precision,
            outer=self.outers[0],
            device_type=self.gate.device_type,
            stacklevel=4,
            selective=self.selective,
            outers=self.outers[1:],
        )
        self.gate.replace_profile(profile, unprofiled=why)

    def state_dict(self) -> dict[str, Any]:
        """The largest bytes per sample seen (None: not looked up yet) and the batch at that shape
        (None: none outgrew the workload's worst case): tensors and plain values."""
        return {"largest": self.largest, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the gate is profiled at the saved batch's shape (once,
        here; what it measured at a smaller shape no longer stands, as after any new shape), so a
        batch no larger than the saved largest is not profiled again."""
        if state.get("batch") is not None:
            self._reprofile(state["batch"])
        self.largest = state.get("largest")


def splits(config: TrainConfig, *, min_micro_batch: int | None = 1) -> Iterator[TrainConfig]:
    """Configurations of ``config``'s effective batch with less activation memory, in the order
    tried: each smaller micro-batch that divides the batch (more accumulation) down to
    ``min_micro_batch`` (:func:`autotune.knobs.smallest_micro_batch`), then the same with every
    block recomputed."""
    total = config.micro_batch_size * config.grad_accum_steps
    floor = min(config.micro_batch_size, smallest_micro_batch(total, min_micro_batch))
    for checkpoint in dict.fromkeys((config.checkpoint, True)):
        for micro in range(config.micro_batch_size, floor - 1, -1):
            if total % micro == 0 and (micro, checkpoint) != (config.micro_batch_size, config.checkpoint):
                yield dataclasses.replace(
                    config, micro_batch_size=micro, grad_accum_steps=total // micro, checkpoint=checkpoint
                )
