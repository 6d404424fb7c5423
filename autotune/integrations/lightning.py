"""``AutotuneCallback`` for ``lightning.Trainer.fit``.

What it changes mid-fit, and what it cannot (as the Hugging Face callback, :mod:`autotune.integrations.hf`):

* **Per-block precision** (bf16 autocast islands) and **per-block activation checkpointing** on
  the ``LightningModule``'s blocks: they live on the model, so the next forward honours them.
* **The split** of the effective batch into micro-batch x accumulation, at the next epoch
  boundary, through Lightning's own mechanisms: the ``batch_size`` attribute its
  ``BatchSizeFinder`` scales (on the module, its ``hparams`` or the datamodule; the
  ``train_dataloader()`` hook must read it), one DataLoader reload
  (``reload_dataloaders_every_n_epochs`` for that epoch, then the user's value again) and
  ``trainer.accumulate_grad_batches`` set at the epoch start, as ``GradientAccumulationScheduler``
  does. Their product, the user's effective batch, never changes. Not when the module has no
  ``batch_size`` attribute (a DataLoader handed to ``fit`` has its batch size fixed), uses manual
  optimization (Lightning's accumulation does not apply to it), or runs under the DeepSpeed
  strategy (which refuses an accumulation change): then, where the run makes decisions, one
  :class:`~autotune.errors.AutotuneWarning` at the start of the fit and one refused change in the
  history say which; a reload that does not take the new batch size refuses the change and fixes
  the split for the run.
  A change decided in the middle of an epoch waits for its end (long epochs: a long wait).
* **Not fp16 blocks** (they need the precision plugin's loss scaler), except under
  ``precision="16-mixed"``, whose plugin scales the loss.

**Your flags are its start** (:mod:`autotune.integrations._flags`), said in one line (an
``AutotuneWarning``, and the history's first change, source ``"flags"``): ``trainer.precision``
``"bf16-mixed"`` / ``"16-mixed"`` is the outer precision (the plugin's autocast around
``training_step``; autotune never opens another and never moves it); ``"32-true"`` is fp32; any
other (``"bf16-true"``: 16-bit weights, which no ``TrainConfig`` expresses) leaves every precision
knob where it is. A model inside the module whose checkpointing you enabled
(``activation_checkpointing_enable()``) starts with those blocks recomputed, by autotune's wrappers
(the model's own flags are off until ``on_train_end``). A compiled module
(``trainer.fit(torch.compile(module))``, or a submodule you compiled): each change of per-block knobs
recompiles; the callback measures it from the steps' wall seconds, counts it in each decision as
:class:`autotune.Adaptive` does (:mod:`autotune.adapt.recompiles`), and notes what the recompiles cost
last in the history (source ``"compile"``).

The loss the memory model profiles is ``training_step(batch, 0)`` (its ``"loss"`` if it returns a
dict), run on copies of the module, where ``self.log`` has no trainer: its warning is silenced there.
A manual-optimization ``training_step`` steps its optimizers itself, which no copy outside the fit
can: its profile fails, and the callback raises ``ConfigError`` at the start of the fit (the
budget gate has no prediction to admit anything by).

Validation during the fit is part of the peak the budget protects, never of the training
configuration (transformers#32215): ``on_validation_start`` to ``on_validation_end`` is bracketed
(see :mod:`autotune.integrations._framework`). The first validation's peak is measured
(:attr:`AutotuneCallback.evaluation_peak`: exact tracked bytes on the CPU, the allocator's
reserved peak on CUDA), noted in the history and kept in the callback's state; one over the
budget is said once (lower the val DataLoader's batch size) and changes nothing in training.
The sanity check runs before the callback starts: it is not measured.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from typing_extensions import override  # typing.override from Python 3.12 (typing_extensions: a torch dependency)

from autotune.adapt.recompiles import loop_compiled
from autotune.adapt.source_choice import PolicyArg
from autotune.config import Precision
from autotune.errors import AutotuneWarning, MissingDependencyError
from autotune.integrations._flags import LoopPrecision
from autotune.integrations._framework import FrameworkLoop
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.progress import Note
from autotune.units import MemoryBudget

try:
    from lightning.pytorch import Callback, LightningModule, Trainer
    from lightning.pytorch.strategies import DeepSpeedStrategy
    from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
    from lightning.pytorch.utilities.types import STEP_OUTPUT
except ImportError as e:  # optional dependency: name it
    raise MissingDependencyError(
        f"autotune.integrations.lightning needs lightning: pip install 'torch-autotune[lightning]' ({e})."
    ) from None

__all__ = ["AutotuneCallback"]


def _step_loss(module: torch.nn.Module, batch: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
        if getattr(module, "_compiler_ctx", None) is not None:
            # trainer.fit(torch.compile(module)): Lightning set the compiled steps as attributes bound to
            # the fitted module, which a copy keeps; the profile's copies run their own eager step.
            out = type(module).training_step(module, batch, 0)  # type: ignore[attr-defined]  # a LightningModule's
        else:
            out = module.training_step(batch, 0)  # type: ignore[operator]  # a LightningModule's
    loss: torch.Tensor = out["loss"] if isinstance(out, dict) else out
    return loss


class AutotuneCallback(Callback):
    """Adapt per-block precision and checkpointing of the ``LightningModule`` while it fits.

    Pass it in ``lightning.Trainer(callbacks=[...])``. It also changes the micro-batch x
    accumulation split at epoch boundaries, where the module has a ``batch_size`` attribute its
    ``train_dataloader()`` reads (see the module's docstring); the effective batch never changes.
    Every decision, applied or refused, is in :attr:`history`; its state is saved in Lightning's
    checkpoints and restored by ``trainer.fit(ckpt_path=...)``.

    Args:
        policy: ``"pretrained"`` (default: the shipped policy), a policy directory, a
            ``TrainConfig`` (fixed) or a ``DecisionSource`` (see
            :func:`autotune.adapt.decision_source`).
        memory_budget: Peak tensor bytes allowed, as for :class:`autotune.Adaptive`: ``"8GiB"``,
            bytes, ``"75%"``, or None (default: the default configuration's own peak).
        decide_every: Optimizer steps between decisions (>= 2).
        blocks: Block module names (default: auto-detected, see
            :func:`autotune.block_detection.find_blocks`).
        min_micro_batch: The smallest micro-batch a split may take (``Workload.min_micro_batch``);
            None: any, except for a model with BatchNorm layers in training (their statistics
            are the micro-batch's): then the loop's own.
        objective: Which measured configuration within the budget the run keeps: ``"per-gib"``
            (default), the most samples/s per GiB of peak, or ``"throughput"``, the most samples/s
            (as for :class:`autotune.Adaptive`).
        progress: The setup's lines at the start of the fit, one per phase with its seconds (as
            for :class:`autotune.Adaptive`: True on stderr, False none, or a callable).

    Raises:
        ConfigError: ``decide_every`` out of range; at the start of the fit, nothing this loop
            can take fits ``memory_budget``, or the module cannot be profiled (a manual
            optimization ``training_step``).

    Example:
        >>> from autotune.integrations.lightning import AutotuneCallback
        >>> callback = AutotuneCallback(memory_budget="90%", decide_every=50)
        >>> callback.history  # every change considered, once training has begun
        []

        What a user writes (a full fit, so it runs in CI as ``examples/lightning_fit.py``, in
        ``make examples``, not as a doctest)::

            from autotune.integrations.lightning import AutotuneCallback

            callback = AutotuneCallback(memory_budget="90%", decide_every=50)
            trainer = lightning.Trainer(max_epochs=3, callbacks=[callback])
            trainer.fit(module)  # module.batch_size: the split the callback may change
            for change in callback.history:
                print(change.describe())
    """

    def __init__(
        self,
        *,
        policy: PolicyArg = "pretrained",
        memory_budget: MemoryBudget | str | int | None = None,
        decide_every: int = 50,
        blocks: list[str] | None = None,
        min_micro_batch: int | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        progress: bool | Note = True,
    ) -> None:
        self.loop = FrameworkLoop(
            policy=policy,
            memory_budget=memory_budget,
            decide_every=decide_every,
            blocks=blocks,
            min_micro_batch=min_micro_batch,
            objective=objective,
            progress=progress,
        )
        # Under "32-true" a reduced outer precision is autotune's autocast around training_step,
        # the loss the memory model profiles: a training_step that does not call forward (one that
        # calls its blocks itself) would otherwise run the outer parts in fp32 while the blocks
        # expect the region: a recomputed bf16 block then handed its bf16 output to an
        # unwrapped one ("mat1 and mat2 must have the same dtype").
        self.loop.outer_around = "training_step"
        self._step = 0
        self._reload: int | None = None  # the user's reload_dataloaders_every_n_epochs while a reload is asked
        self._batch_size: Any = None  # the module's batch_size before a pending change set it

    @property
    def history(self) -> list[Any]:
        """Every change considered so far, applied or not, oldest first (:class:`~autotune.adapt.records.Change`)."""
        return self.loop.history

    @property
    def evaluation_peak(self) -> int | None:
        """The first validation's measured peak bytes (None: none ran under the callback yet)."""
        return self.loop.evaluation_peak

    @property
    @override
    def state_key(self) -> str:
        """Stable across runs and arguments: a checkpoint's state finds the callback that resumes it."""
        return "autotune.AutotuneCallback"

    @override
    def state_dict(self) -> dict[str, Any]:
        """The adaptive state (see :meth:`FrameworkLoop.state_dict`), saved in Lightning's checkpoints."""
        return self.loop.state_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored by ``trainer.fit(ckpt_path=...)`` before the fit starts; applied at ``on_train_start``."""
        if state_dict:
            self.loop.load_state_dict(state_dict)

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Profile the module, resolve the budget, put the fit at its start; say (once) if the split
        cannot change in this fit.

        Raises:
            ConfigError: nothing this fit can take before its first step (per-block recompute at
                its split) fits the memory budget: raised here, rather than fitting on over the
                budget the user gave.
        """
        loader = trainer.train_dataloader
        assert loader is not None, "Lightning builds the train DataLoader before on_train_start"
        self._step = trainer.global_step
        why = _fixed_split(trainer, pl_module)
        self.loop.begin(
            pl_module,
            loader.dataset,
            _step_loss,
            micro_batch_size=loader.batch_size,
            accum=trainer.accumulate_grad_batches,
            name=type(pl_module).__name__,
            split=why is None,
            collate_fn=loader.collate_fn,
            precision=loop_precision(str(trainer.precision)),
            # trainer.fit(torch.compile(module)) hands the callbacks the module, its compile in _compiler_ctx.
            compiled="your torch.compile" if loop_compiled(pl_module) else None,
            # Automatic optimization steps one optimizer (configure_optimizers' first).
            optimizer=trainer.optimizers[0] if len(trainer.optimizers) == 1 else None,
            equal_accumulation="Lightning",
        )
        why = why or self.loop.split_why
        controller = self.loop.controller
        assert controller is not None
        if why is None or controller.source is None:  # no decisions: no split to refuse
            return
        reason = f"the split cannot change in this fit: {why}"
        if controller.refused(trainer.global_step, "lightning", reason):  # a resumed fit said it before: once
            warnings.warn(
                AutotuneWarning(f"AutotuneCallback: {reason}; only per-block knobs will change"), stacklevel=2
            )

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Stage a split the controller chose: the module's ``batch_size`` for the DataLoader hook and
        one reload of the train DataLoader at the next epoch (BatchSizeFinder's way)."""
        pending = self.loop.pending
        if pending is None or self._reload is not None:
            return
        # BatchSizeFinder's way: the attribute the dataloader hook reads, then one reload.
        self._batch_size = lightning_getattr(pl_module, "batch_size")
        lightning_setattr(pl_module, "batch_size", pending.after.micro_batch_size)
        self._reload = trainer.reload_dataloaders_every_n_epochs  # type: ignore[attr-defined]  # set by its DataConnector
        trainer.reload_dataloaders_every_n_epochs = 1  # type: ignore[attr-defined]  # set by its DataConnector

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Take a staged split once the reloaded DataLoader has its micro-batch (the accumulation
        keeps the effective batch); a DataLoader that did not take it is logged as refused."""
        pending = self.loop.pending
        if pending is None or self._reload is None:
            return
        trainer.reload_dataloaders_every_n_epochs, self._reload = self._reload, None  # type: ignore[attr-defined]  # set by its DataConnector
        micro = getattr(trainer.train_dataloader, "batch_size", None)
        if micro == pending.after.micro_batch_size:
            trainer.accumulate_grad_batches = pending.after.grad_accum_steps  # GradientAccumulationScheduler's hook
        else:
            lightning_setattr(pl_module, "batch_size", self._batch_size)
        self.loop.take_split(trainer.global_step, micro)

    @override
    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Start the step's measurement window (the CUDA allocator's peaks; a tracked step on the CPU)."""
        if batch_idx % trainer.accumulate_grad_batches == 0:
            self.loop.step_begin()

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: torch.optim.Optimizer
    ) -> None:
        """Before the optimizer steps (the closure's backward done, before clipping): a NaN or
        infinite gradient is dropped, every gradient set to None, so the weights and the
        optimizer's state stay the step before's; then the NaN rule
        (:meth:`FrameworkLoop.before_optimizer_step`). Not under fp16 loss scaling
        (``precision="16-mixed"``): its GradScaler skips such a step itself.

        Raises:
            NonFiniteLossError: a gradient is not finite and the run decides: out of
                ``trainer.fit()``, before the optimizer and the LR scheduler step.
        """
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            return
        self.loop.before_optimizer_step(trainer.global_step + 1, pl_module.parameters())

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        """Close the step at an optimizer step: its loss, its peak, a decision every ``decide_every`` steps."""
        step = trainer.global_step
        if step == self._step:  # a micro-batch inside an accumulation: no optimizer step yet
            return
        self._step = step
        k = self.loop.decide_every
        loss = None
        if k - step % k <= 3 or step % k == 0:  # the last steps before a decision: .item() syncs
            value = outputs["loss"] if isinstance(outputs, dict) else outputs
            loss = float(value.detach()) if isinstance(value, torch.Tensor) else None
        self.loop.step_end(step, loss)

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the validation window (Lightning's sanity check runs before the callback starts)."""
        self.loop.evaluation_begin(*trainer.optimizers)

    @override
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        """Count one validation batch (the first validation is measured, once)."""
        self.loop.evaluation_batch()

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the validation window: its peak is kept, and said once if over the budget; the
        training configuration stays."""
        self.loop.evaluation_end(trainer.global_step, lower="the val DataLoader's batch size")

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Refuse a split still pending, undo a staged reload, note what recompiles cost on a compiled
        module, and take the per-block wrappers off the model: it is left as it was given."""
        if self._reload is not None:  # a reload was asked for an epoch that never came
            trainer.reload_dataloaders_every_n_epochs, self._reload = self._reload, None  # type: ignore[attr-defined]  # set by its DataConnector
            lightning_setattr(pl_module, "batch_size", self._batch_size)
        self.loop.take_split(trainer.global_step, None)  # a change still pending is refused, logged
        self.loop.finish(trainer.global_step)
        self.loop.remove()


#: Lightning's mixed precisions: its plugin's autocast dtype around ``training_step``.
_MIXED: dict[str, Precision] = {"bf16-mixed": "bf16", "16-mixed": "fp16"}
_FULL = ("32-true", "32")


def loop_precision(precision: str) -> LoopPrecision:
    """The fit's own autocast, from ``trainer.precision``.

    Args:
        precision: Lightning's precision string (``"bf16-mixed"``, ``"32-true"``...).

    Returns:
        A mixed precision: the outer precision; ``"32-true"``: none; any other: fixed, with why.
    """
    if precision in _FULL:
        return LoopPrecision()
    flag = f"precision={precision!r}"
    if precision in _MIXED:
        return LoopPrecision(outer=_MIXED[precision], flag=flag)
    return LoopPrecision(flag=flag, fixed="not a TrainConfig precision: the weights' own dtype is not a knob")


def _fixed_split(trainer: Trainer, pl_module: LightningModule) -> str | None:
    """Why this fit's micro-batch x accumulation cannot change (None: it can, at epoch boundaries)."""
    if not lightning_hasattr(pl_module, "batch_size"):
        return (
            "the LightningModule (its hparams, its datamodule) has no batch_size attribute for train_dataloader() "
            "to read"
        )
    if not pl_module.automatic_optimization:
        return "manual optimization (Lightning's gradient accumulation does not apply to it)"
    if isinstance(trainer.strategy, DeepSpeedStrategy):
        return "the DeepSpeed strategy (its engine fixes the gradient accumulation)"
    return None
