"""``AutotuneCallback`` for ``lightning.Trainer.fit``.

What it changes mid-fit, and what it cannot (as the Hugging Face callback, :mod:`autotune.integrations.hf`):

* **Per-block precision** (bf16 autocast islands) and **per-block activation checkpointing** on
  the ``LightningModule``'s blocks: they live on the model, so the next forward honours them.
* **Not the micro-batch**: the DataLoader's ``batch_size`` is fixed when the fit starts.
* **Not the accumulation**: Lightning's own ``GradientAccumulationScheduler`` shows how it can
  change mid-fit (``trainer.accumulate_grad_batches``, at an epoch start), but with the
  micro-batch fixed any change changes the user's effective batch, which this callback keeps.
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
    """Adapt per-block precision and checkpointing of the ``LightningModule`` while it fits.

    Args: as :class:`autotune.integrations.hf.AutotuneCallback`.
    """

    def __init__(self, *, policy: PolicyArg = "pretrained", memory_budget: MemoryBudget | str | int | None = None,
                 decide_every: int = 50, blocks: list[str] | None = None) -> None:  # fmt: skip
        self.live = LiveKnobs(policy=policy, memory_budget=memory_budget, decide_every=decide_every, blocks=blocks)
        self._step = 0

    @property
    def history(self) -> list[Any]:
        return self.live.history

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loader = trainer.train_dataloader
        self._step = trainer.global_step
        self.live.begin(pl_module, loader.dataset, _step_loss, micro_batch_size=loader.batch_size,
                        accum=trainer.accumulate_grad_batches, name=type(pl_module).__name__)  # fmt: skip

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
        self.live.remove()
