"""Adaptive training in your own loop: your model, optimizer, DataLoader and padding collate.

``Adaptive.step(batch)`` trains one batch from your DataLoader: it splits the batch into the
current configuration's micro-batches (gradient accumulation), applies per-block precision and
activation checkpointing, and every ``decide_every`` steps lets the pretrained policy propose a
change, which the memory model admits only if it fits the budget. The effective batch stays yours.

Run: ``python examples/plain_loop.py`` (seconds on a CPU; nothing is downloaded).
"""

from __future__ import annotations

import torch
from torch import nn

from autotune import Adaptive

VOCAB = 100


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.ln(x))))


class TinyLM(nn.Module):
    """A next-token model: the blocks in an ``nn.ModuleList`` are what autotune tunes per block."""

    def __init__(self, d: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def pad(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pad the batch's sequences with 0 (the padding id) to its longest one."""
    return {"input_ids": nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=0)}


def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``loss_fn(model, batch) -> scalar``: autotune calls it on each micro-batch of your batch."""
    ids = batch["input_ids"]
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), ignore_index=0)


def main() -> None:
    torch.manual_seed(0)
    # Generated data: 256 sequences of 8-32 token ids (1..VOCAB-1; 0 is padding).
    lengths = torch.randint(8, 33, (256,)).tolist()
    sequences = [torch.randint(1, VOCAB, (n,)) for n in lengths]
    loader = torch.utils.data.DataLoader(sequences, batch_size=16, shuffle=True, collate_fn=pad)

    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # The dataset and collate let autotune profile the model's memory before the first step;
    # memory_budget "80%": never more than 80% of the default configuration's predicted peak.
    tuner = Adaptive(
        model, optimizer, loss_fn, sequences, batch_size=16, collate_fn=pad, memory_budget="80%", decide_every=4
    )
    with tuner:
        for epoch in range(2):
            for batch in loader:
                record = tuner.step(batch)
            print(f"epoch {epoch}: loss {record.loss:.3f}, config {tuner.config.describe()}")
    for change in tuner.history:
        print(
            f"step {change.step}: {change.source}: {'applied' if change.applied else 'refused'}: "
            f"{change.after.describe()} ({change.reason})"
        )
    print(
        f"trained {sum(s.samples for s in tuner.steps)} samples in {len(tuner.steps)} steps "
        f"within a budget of {tuner.budget_bytes} bytes"
    )


if __name__ == "__main__":
    main()
