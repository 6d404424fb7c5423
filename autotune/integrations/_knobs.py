"""What of a configuration a framework loop runs: the user's flags as the start and as pins, and
the knobs put on the model as block wrappers (see :mod:`autotune.integrations._flags`)."""

from __future__ import annotations

import dataclasses
import warnings

from autotune.adapt.records import Change
from autotune.config import TrainConfig
from autotune.errors import AutotuneWarning
from autotune.integrations._flags import ModelCheckpointing
from autotune.integrations._loop_state import LoopState
from autotune.train.wrappers import apply_block_knobs, apply_config

__all__ = ["LoopKnobs"]


class LoopKnobs(LoopState):
    """:class:`~autotune.integrations._framework.FrameworkLoop`'s start from the user's flags,
    ``takes`` and ``put`` (a mixin over :class:`~autotune.integrations._loop_state.LoopState`)."""

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
            self._wrappers = apply_config(
                self._model, self._names, config, device_type=device, outer_around=self.outer_around
            )
        self._warm = False

    def _unwrap(self) -> None:
        """Take the wrappers off (and a tracker an evaluation that failed left)."""
        if self._tracker is not None:
            tracker, self._tracker, self._evaluating = self._tracker, None, False
            tracker.__exit__(None, None, None)
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None
