from __future__ import annotations

import math
from typing import Any

import pytest
import torch

pytest.importorskip("lightning")

import lightning as L

from autotune import TrainConfig
from autotune.integrations.lightning import AutotuneCallback
from autotune.workload import find_blocks
from autotune.zoo import CORPUS


class LitLM(L.LightningModule):  # type: ignore[misc]
    def __init__(self, net: torch.nn.Module, loss_fn: Any) -> None:
        super().__init__()
        self.net, self.loss_fn = net, loss_fn

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.loss_fn(self.net, batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Spy(L.Callback):  # type: ignore[misc]
    def __init__(self, blocks: list[str]) -> None:
        self.blocks, self.wrapped = blocks, []

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.wrapped.append(sum("forward" in module.get_submodule(b).__dict__ for b in self.blocks))


# Lightning's advice for real runs (DataLoader workers, logging intervals), irrelevant to a tiny fit.
@pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")
# Lightning 2.6's own pytree code on torch 2.13 (torch deprecated LeafSpec): not ours to fix.
@pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning")
def test_the_callback_applies_checkpointing_inside_a_real_fit() -> None:
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module = LitLM(wl.model, wl.loss_fn)
    blocks = list(find_blocks(module))
    # accumulation 2 x micro-batch 4: the fixed config's effective batch is the fit's
    callback = AutotuneCallback(policy=TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=True),
                                decide_every=2)  # fmt: skip
    spy = Spy(blocks)
    trainer = L.Trainer(max_steps=4, accelerator="cpu", devices=1, accumulate_grad_batches=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[callback, spy])  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader(wl.dataset, batch_size=4))
    assert trainer.lightning_module is module
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))
    [change] = callback.history
    assert (change.step, change.applied, change.after.checkpoint) == (2, True, True)
    # 8 micro-batches: the first two optimizer steps plain, the last two recomputed
    assert spy.wrapped == [0, 0, 0, 0, len(blocks), len(blocks), len(blocks), len(blocks)]
    assert all("forward" not in m.__dict__ for m in module.modules())
