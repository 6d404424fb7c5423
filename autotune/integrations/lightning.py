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
  optimization, or runs under the DeepSpeed strategy (which refuses an accumulation change); a
  reload that does not take the new batch size refuses the change and fixes the split for the run.
  A change decided in the middle of an epoch waits for its end (long epochs: a long wait).
* **Not fp16 blocks** (they need the precision plugin's loss scaler).

The loss the memory model profiles is ``training_step(batch, 0)`` (its ``"loss"`` if it returns a
dict), run on copies of the module, where ``self.log`` has no trainer: its warning is silenced there.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from autotune.adapt.adaptive import PolicyArg
from autotune.errors import MissingDependencyError
from autotune.integrations._live import LiveKnobs
from autotune.units import MemoryBudget

try:
    from lightning.pytorch import Callback
    from lightning.pytorch.strategies import DeepSpeedStrategy
    from lightning.pytorch.utilities.parsing import lightning_getattr, lightning_hasattr, lightning_setattr
except ImportError as e:  # optional dependency: name it
    raise MissingDependencyError(
        f"autotune.integrations.lightning needs lightning: pip install 'autotune[lightning]' ({e})."
    ) from None

__all__ = ["AutotuneCallback"]


def _step_loss(module: Any, batch: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*self\.log\(\).*")
        out = module.training_step(batch, 0)
    loss: torch.Tensor = out["loss"] if isinstance(out, dict) else out
    return loss


class AutotuneCallback(Callback):
    """Adapt per-block precision and checkpointing of the ``LightningModule`` while it fits, and the
    micro-batch x accumulation split at epoch boundaries (see the module's docstring).

    Args: as :class:`autotune.integrations.hf.AutotuneCallback`.
    """

    def __init__(self, *, policy: PolicyArg = "pretrained", memory_budget: MemoryBudget | str | int | None = None,
                 decide_every: int = 50, blocks: list[str] | None = None) -> None:  # fmt: skip
        self.live = LiveKnobs(policy=policy, memory_budget=memory_budget, decide_every=decide_every, blocks=blocks)
        self._step = 0
        self._reload: int | None = None  # the user's reload_dataloaders_every_n_epochs while a reload is asked
        self._batch_size: Any = None  # the module's batch_size before a pending change set it

    @property
    def history(self) -> list[Any]:
        return self.live.history

    @property
    def state_key(self) -> str:
        """Stable across runs and arguments: a checkpoint's state finds the callback that resumes it."""
        return "autotune.AutotuneCallback"

    def state_dict(self) -> dict[str, Any]:
        """The adaptive state (see :meth:`LiveKnobs.state_dict`), saved in Lightning's checkpoints."""
        return self.live.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restored by ``trainer.fit(ckpt_path=...)`` before the fit starts; applied at ``on_train_start``."""
        if state_dict:
            self.live.load_state_dict(state_dict)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loader = trainer.train_dataloader
        self._step = trainer.global_step
        split = (lightning_hasattr(pl_module, "batch_size") and pl_module.automatic_optimization
                 and not isinstance(trainer.strategy, DeepSpeedStrategy))  # fmt: skip
        self.live.begin(pl_module, loader.dataset, _step_loss, micro_batch_size=loader.batch_size,
                        accum=trainer.accumulate_grad_batches, name=type(pl_module).__name__, split=split,
                        collate_fn=loader.collate_fn)  # fmt: skip

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        pending = self.live.pending
        if pending is None or self._reload is not None:
            return
        # BatchSizeFinder's way: the attribute the dataloader hook reads, then one reload.
        self._batch_size = lightning_getattr(pl_module, "batch_size")
        lightning_setattr(pl_module, "batch_size", pending.after.micro_batch_size)
        self._reload = trainer.reload_dataloaders_every_n_epochs
        trainer.reload_dataloaders_every_n_epochs = 1

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        pending = self.live.pending
        if pending is None or self._reload is None:
            return
        trainer.reload_dataloaders_every_n_epochs, self._reload = self._reload, None
        micro = getattr(trainer.train_dataloader, "batch_size", None)
        if micro == pending.after.micro_batch_size:
            trainer.accumulate_grad_batches = pending.after.grad_accum_steps  # GradientAccumulationScheduler's hook
        else:
            lightning_setattr(pl_module, "batch_size", self._batch_size)
        self.live.take_split(trainer.global_step, micro)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx % trainer.accumulate_grad_batches == 0:
            self.live.step_begin()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._step:  # a micro-batch inside an accumulation: no optimizer step yet
            return
        self._step = step
        k = self.live.decide_every
        loss = None
        if k - step % k <= 3 or step % k == 0:  # the last steps before a decision: .item() syncs
            value = outputs["loss"] if isinstance(outputs, dict) else outputs
            loss = float(value.detach()) if isinstance(value, torch.Tensor) else None
        self.live.step_end(step, loss)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self._reload is not None:  # a reload was asked for an epoch that never came
            trainer.reload_dataloaders_every_n_epochs, self._reload = self._reload, None
            lightning_setattr(pl_module, "batch_size", self._batch_size)
        self.live.take_split(trainer.global_step, None)  # a change still pending is refused, logged
        self.live.remove()
