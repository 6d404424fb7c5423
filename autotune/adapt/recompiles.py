"""A user's compiled model under an adaptive run: what a change of block knobs costs it, counted.

Compile is the user's choice (``torch.compile(model)`` or ``model.compile()``). autotune's block
knobs install new wrapper functions on the blocks, which Dynamo's guards see as a new forward: the
first compiled step after a change of per-block precision or recompute recompiles (tens of
seconds on a small model on 2 CPU cores). And Dynamo recompiles a frame at most
``torch._dynamo.config.recompile_limit`` times (8 by default): past it, it runs the model eagerly
for the rest of the process, silently.

So on a compiled model (:func:`user_compiled`) :class:`Recompiles`

* measures each recompile: the first untracked step after a change of block knobs (the step
  that compiles; a tracked step runs eagerly, under the tracker's dispatch mode) against the
  median of the next :data:`STEADY_STEPS` steps, and that first step is not timed as the
  configuration's speed;
* caps the distinct block-knob sets the run tries below the limit (:meth:`Recompiles.refusal`);
* counts the measured recompile in a move to a configuration measured before: it is made only if
  the seconds it saves per step, over the ``horizon`` steps to the next decision, exceed the
  recompile seconds measured so far (their median).

Changes that keep the block knobs (the micro-batch, the accumulation) keep the wrappers: no
recompile, not counted.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from autotune.config import TrainConfig

__all__ = ["STEADY_STEPS", "Recompiles", "loop_compiled", "recompile_limit", "user_compiled"]

STEADY_STEPS = 2  # steps after the recompiling one whose median is the steady step

BlockKnobs = tuple[object, ...]


def user_compiled(model: torch.nn.Module) -> bool:
    """Whether ``model`` is compiled: a ``torch.compile`` wrapper (``OptimizedModule``), or a module
    whose ``compile()`` was called (it then calls its compiled forward)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(model, OptimizedModule) or getattr(model, "_compiled_call_impl", None) is not None


def loop_compiled(model: torch.nn.Module, *, flag: bool = False) -> bool:
    """Whether a framework's loop runs ``model`` compiled, though the callback is handed it eager.

    Hugging Face's ``TrainingArguments(torch_compile=True)`` (``flag``) has accelerate wrap the
    model in ``torch.compile`` while the callbacks get the unwrapped model; Lightning unwraps a
    ``torch.compile``-d LightningModule and keeps its compile in ``_compiler_ctx``; a user may
    compile a submodule (``self.backbone = torch.compile(backbone)``, ``backbone.compile()``).
    Any of them puts the blocks under Dynamo, whose guards see each change of block knobs.

    Args:
        model: The model (or LightningModule) the loop trains.
        flag: The loop's own compile flag (Hugging Face's ``args.torch_compile``).

    Returns:
        True if the loop compiles it, it was compiled, or any of its submodules is.
    """
    if flag or getattr(model, "_compiler_ctx", None) is not None:
        return True
    return any(user_compiled(module) for module in model.modules())


def recompile_limit() -> int:
    """Dynamo's recompile limit: ``recompile_limit`` (``cache_size_limit`` in older torch)."""
    import torch._dynamo.config as dynamo

    return int(getattr(dynamo, "recompile_limit", getattr(dynamo, "cache_size_limit", 8)))


class Recompiles:
    """The recompiles of a compiled model's run: measured, capped, counted in the decisions.

    Args:
        num_blocks: The model's blocks (to compare block knobs however a configuration spells them).
        horizon: Steps a move must pay its recompile back in (the controller's ``decide_every``).
        limit: Dynamo's recompile limit (None: :func:`recompile_limit`).
    """

    def __init__(self, *, num_blocks: int, horizon: int, limit: int | None = None) -> None:
        self.num_blocks, self.horizon = num_blocks, horizon
        self.limit = recompile_limit() if limit is None else limit
        self.seen: list[BlockKnobs] = []  # distinct block-knob sets the run went to, the start's first
        self.costs: list[float] = []  # measured recompile seconds
        self._waiting: tuple[int, BlockKnobs] | None = None  # (history index, knobs) of the change to measure
        self._first: float | None = None
        self._steady: list[float] = []

    @property
    def cap(self) -> int:
        """Distinct block-knob sets a run tries: below the limit (the start's own compile is one)."""
        return max(1, self.limit - 1)

    def knobs(self, config: TrainConfig) -> BlockKnobs:
        n = self.num_blocks
        return (config.block_precisions(n), config.checkpoint_levels(n), config.outer_precision)

    def recompiles(self, current: TrainConfig, target: TrainConfig) -> bool:
        """Whether going from ``current`` to ``target`` changes the block knobs (a recompile)."""
        return self.knobs(current) != self.knobs(target)

    @property
    def cost(self) -> float | None:
        """The median measured recompile seconds, or None before one is measured."""
        return statistics.median(self.costs) if self.costs else None

    def refusal(self, current: TrainConfig, target: TrainConfig, *, saved: float | None) -> str | None:
        """Why the run must not go from ``current`` to ``target``, or None.

        Args:
            current: The configuration the run is on.
            target: The proposed one.
            saved: Seconds per step ``target`` saves over ``current`` where both were measured, else None.
        """
        if not self.recompiles(current, target):
            return None
        new = self.knobs(target) not in self.seen
        if new and len(self.seen) >= self.cap:
            return (
                f"the model is compiled: {len(self.seen)} block-knob sets tried, the most below Dynamo's "
                f"recompile limit ({self.limit}), past which it runs the model eagerly"
            )
        cost = self.cost
        if saved is None or cost is None or saved * self.horizon > cost:
            return None
        return (
            f"the model is compiled: the move recompiles (~{cost:.1f} s measured) and saves {saved * 1e3:.1f} ms "
            f"a step, {saved * self.horizon:.1f} s over the {self.horizon} steps to the next decision"
        )

    def started(self, config: TrainConfig) -> None:
        """The run starts at ``config`` (the user's own compile)."""
        self._seen(self.knobs(config))

    def moved(self, before: TrainConfig, after: TrainConfig, index: int) -> None:
        """The run went from ``before`` to ``after``, logged at ``history[index]``: a change of
        block knobs is measured at its first untracked step."""
        if not self.recompiles(before, after):
            return
        knobs = self.knobs(after)
        self._seen(knobs)
        self._waiting, self._first, self._steady = (index, knobs), None, []

    def stepped(self, config: TrainConfig, seconds: float, *, tracked: bool) -> tuple[bool, tuple[int, float] | None]:
        """One step of ``config`` took ``seconds``.

        Returns:
            Whether the step recompiled (not to be timed as the configuration's speed), and where
            a recompile was just measured, (history index of its change, recompile seconds).
        """
        waiting = self._waiting
        if waiting is None or waiting[1] != self.knobs(config) or tracked:
            return False, None  # a tracked step runs eagerly: the recompile comes at the next one
        if self._first is None:
            self._first = seconds
            return True, None
        self._steady.append(seconds)
        if len(self._steady) < STEADY_STEPS:
            return False, None
        cost = max(0.0, self._first - statistics.median(self._steady))
        self.costs.append(cost)
        self._waiting = None
        return False, (waiting[0], cost)

    def describe(self) -> str:
        """One line: what the run's recompiles cost so far, and how many block-knob sets it tried.

        Example:
            >>> r = Recompiles(num_blocks=2, horizon=50, limit=8)
            >>> r.costs += [11.5, 12.5]
            >>> print(r.describe())  # doctest: +NORMALIZE_WHITESPACE
            the model is compiled: 2 recompiles measured, 24.0 s in all (median 12.0 s), each move's
            counted against the seconds it saves; 0 of at most 7 block-knob sets tried (Dynamo's
            recompile limit 8)
        """
        tried = f"{len(self.seen)} of at most {self.cap} block-knob sets tried (Dynamo's recompile limit {self.limit})"
        if not self.costs:
            return f"the model is compiled: no recompile measured; {tried}"
        n = len(self.costs)
        return (
            f"the model is compiled: {n} recompile{'s' if n > 1 else ''} measured, {sum(self.costs):.1f} s in all "
            f"(median {statistics.median(self.costs):.1f} s), each move's counted against the seconds it saves; {tried}"
        )

    def _seen(self, knobs: BlockKnobs) -> None:
        if knobs not in self.seen:
            self.seen.append(knobs)
