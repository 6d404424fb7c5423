"""Adaptive training inside ``lightning.Trainer.fit``: add one callback.

``AutotuneCallback`` adapts per-block bf16 precision and activation checkpointing while the module
fits, and the split of your batch into micro-batch x gradient accumulation at epoch boundaries:
for that, ``train_dataloader()`` reads ``self.batch_size`` (the attribute Lightning's own
``BatchSizeFinder`` scales). The effective batch (micro-batch x accumulation) stays yours.

Run: ``python examples/lightning_fit.py`` (a small residual MLP on generated data: seconds on a CPU).
Needs ``pip install "torch-autotune[lightning]"``.
"""

from __future__ import annotations

import warnings

import lightning as L
import torch
from torch import nn

from autotune.integrations.lightning import AutotuneCallback


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


class Classifier(L.LightningModule):
    """Its ``nn.ModuleList`` of blocks is what autotune tunes per block."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.embed = nn.Linear(16, 64)
        self.blocks = nn.ModuleList(Block(64) for _ in range(4))
        self.head = nn.Linear(64, 4)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, 16, generator=g)
        y = (x[:, :4].argmax(dim=1) + (x[:, 4] > 1).long()) % 4  # a learnable labelling
        self.data = torch.utils.data.TensorDataset(x, y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader[tuple[torch.Tensor, torch.Tensor]]:
        return torch.utils.data.DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def main() -> None:
    # Lightning's advice for long runs (DataLoader workers, logging intervals) is noise at this size.
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*smaller than the logging interval.*")
    L.seed_everything(0, verbose=False)
    module = Classifier(batch_size=32)
    callback = AutotuneCallback(decide_every=4)  # the shipped pretrained policy, within the default's own peak
    trainer = L.Trainer(
        max_epochs=3,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module)
    print(f"train_loss {float(trainer.callback_metrics['train_loss']):.3f} after {trainer.global_step} steps")
    print(f"micro-batch {module.batch_size} x accumulation {trainer.accumulate_grad_batches}")
    for change in callback.history:
        print(
            f"step {change.step}: {change.source}: {'applied' if change.applied else 'refused'}: "
            f"{change.after.describe()}"
        )


if __name__ == "__main__":
    main()
