"""What the user's own training flags already do to the model: a framework callback's start.

A framework's loop may already recompute blocks (Hugging Face's ``activation_checkpointing=True``,
alias ``gradient_checkpointing=True``, which calls the model's ``activation_checkpointing_enable()``;
or a model the user enabled by hand) and run the forward under its own autocast (``bf16=True`` /
``fp16=True``: accelerate's wrapper around the model's forward; Lightning's ``precision="bf16-mixed"``
/ ``"16-mixed"``: its precision plugin around ``training_step``). The callbacks start from that
configuration, so that what they report is what the model runs:

* **Checkpointing** (:class:`ModelCheckpointing`): transformers' per-layer flags (each module's
  boolean ``gradient_checkpointing``) are read per block and become the configuration's
  ``checkpoint``; autotune's per-block wrappers then recompute those blocks and the model's own
  flags are off for the run (as ``activation_checkpointing_disable()`` sets them: a block both
  recompute would run its forward three times), set back as they were at its end. Where a module
  the model checkpoints is not one of the blocks (nor inside or around one), autotune cannot take
  it over: it leaves the model's checkpointing on and never moves the checkpoint knob.
* **Precision** (:class:`LoopPrecision`): the loop owns its autocast, so the configuration's outer
  precision is the loop's: autotune never opens a second region around the forward and never
  moves it; its blocks run in it or as fp32 exceptions. A precision no ``TrainConfig`` expresses
  (16-bit weights: Lightning's ``"bf16-true"``) is left alone: no precision knob moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from autotune.config import Precision

__all__ = ["LoopPrecision", "ModelCheckpointing"]

_FLAG = "gradient_checkpointing"  # the attribute transformers sets on each module it may recompute


@dataclass(frozen=True, kw_only=True)
class LoopPrecision:
    """The precision a framework's loop runs the forward in, from the user's flags.

    Attributes:
        outer: The loop's own autocast dtype around the whole forward (``"fp32"``: none).
        flag: How the user set it, as the start line names it (``"bf16=True"``); empty: not set.
        fixed: Non-empty: why no precision knob may move (a precision the knobs cannot express),
            as the start line says it.
    """

    outer: Precision = "fp32"
    flag: str = ""
    fixed: str = ""

    @property
    def owned(self) -> bool:
        """Whether the loop opens the outer autocast region itself (autotune must not open another)."""
        return self.outer != "fp32"

    def describe(self) -> str:
        """The start line's part for precision (empty: nothing set)."""
        if self.fixed:
            return f"{self.flag} -> no precision knob moves ({self.fixed})"
        if self.owned:
            return f"{self.flag} -> outer precision {self.outer} (the loop's own autocast)"
        return ""


@dataclass
class ModelCheckpointing:
    """The model's own activation checkpointing (transformers' per-module flags) over autotune's blocks.

    Attributes:
        blocks: Per block position, whether the model's own flags recompute it.
        outside: Modules the model recomputes that are none of the blocks, nor inside or around
            one: autotune cannot take them over.
    """

    blocks: tuple[bool, ...]
    outside: tuple[str, ...]
    _found: list[tuple[torch.nn.Module, bool]] = field(default_factory=list, repr=False)
    _taken: bool = field(default=False, repr=False)

    @classmethod
    def read(cls, model: torch.nn.Module, block_names: Sequence[str]) -> ModelCheckpointing:
        """Read ``model``'s flags per block: a block's own flag (a transformers
        ``GradientCheckpointingLayer``), else any module inside it that recomputes, else the
        nearest module around it with the flag (an older stack that checkpoints each layer).

        Args:
            model: The model the loop trains.
            block_names: Autotune's blocks, in order.

        Returns:
            The flags found, nothing changed on the model.
        """
        flagged = {name: m for name, m in model.named_modules() if isinstance(getattr(m, _FLAG, None), bool)}
        on = {name for name, m in flagged.items() if getattr(m, _FLAG)}

        def inside(name: str, block: str) -> bool:
            return name == block or name.startswith(f"{block}.")

        def around(name: str, block: str) -> bool:
            return name == "" or block.startswith(f"{name}.")

        blocks = []
        for block in block_names:
            if block in flagged:
                blocks.append(block in on)
            elif any(inside(name, block) for name in on):
                blocks.append(True)
            else:
                outer = [name for name in flagged if around(name, block)]
                blocks.append(max(outer, key=len, default=None) in on)
        outside = tuple(sorted(n for n in on if not any(inside(n, b) or around(n, b) for b in block_names) and n != ""))
        return cls(blocks=tuple(blocks), outside=outside, _found=[(flagged[n], n in on) for n in flagged])

    @property
    def on(self) -> bool:
        """Whether the model recomputes anything by its own flags."""
        return any(self.blocks) or bool(self.outside)

    @property
    def taken_over(self) -> bool:
        """Whether autotune turned the model's flags off for the run (:meth:`take_over`)."""
        return self._taken

    def take_over(self) -> bool:
        """Turn the model's own flags off (as ``activation_checkpointing_disable()`` sets them, without
        its PEFT input-gradient hook: autotune's non-reentrant recompute does not need it, and
        :meth:`give_back` then restores exactly what was there). Nothing where a module outside
        the blocks recomputes (``outside``).

        Returns:
            Whether they are off now.
        """
        if self.outside or not self.on:
            return False
        for module, _ in self._found:
            setattr(module, _FLAG, False)
        self._taken = True
        return True

    def give_back(self) -> None:
        """Set every flag :meth:`take_over` turned off back as it was."""
        if not self._taken:
            return
        for module, value in self._found:
            setattr(module, _FLAG, value)
        self._taken = False

    def describe(self, flag: str) -> str:
        """The start line's part for checkpointing (empty: none); ``flag``: how the user turned it on."""
        if not self.on:
            return ""
        if self.outside:
            return (
                f"{flag} -> recompute left to the model: it checkpoints {', '.join(self.outside)}, which are not "
                "autotune's blocks, so the checkpoint knob does not move"
            )
        n, which = len(self.blocks), [str(i) for i, c in enumerate(self.blocks) if c]
        blocks = "every block" if len(which) == n else f"blocks {', '.join(which)} of {n}"
        return f"{flag} -> {blocks} recomputed (by autotune's wrappers; the model's own flags off until training ends)"
