"""A next-token model over sequences of 4-12 tokens, batched by a padding collate: ``build`` reads
them from an ``IterableDataset``, ``build_map_style`` from a list. Self-contained: loaded by path."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from autotune import Workload

VOCAB, N = 50, 64


def _sequences() -> Iterator[torch.Tensor]:
    """N seeded sequences of 4-12 token ids in 1..VOCAB-1 (0 is padding), always in this order."""
    g = torch.Generator().manual_seed(0)
    for _ in range(N):
        n = int(torch.randint(4, 13, (1,), generator=g))
        yield torch.randint(1, VOCAB, (n,), generator=g)


class Sequences(torch.utils.data.IterableDataset[torch.Tensor]):
    def __iter__(self) -> Iterator[torch.Tensor]:
        return _sequences()


def pad(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch's sequences right-padded with 0 to its longest one."""
    return {"input_ids": nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=0)}


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.ln(x))))


class TokenMLP(nn.Module):
    def __init__(self, *, d: int = 32, depth: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def _loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    ids = batch["input_ids"]
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), ignore_index=0)


def build() -> Workload:
    """The sequences from an IterableDataset, padded per batch."""
    torch.manual_seed(0)
    return Workload(name="padded", model=TokenMLP(), dataset=Sequences(), loss_fn=_loss, collate_fn=pad, batch_size=8)


def build_map_style() -> Workload:
    """The same sequences as a list (map-style: shuffled each epoch), padded per batch."""
    torch.manual_seed(0)
    data = list(_sequences())
    return Workload(name="padded", model=TokenMLP(), dataset=data, loss_fn=_loss, collate_fn=pad, batch_size=8)  # type: ignore[arg-type]


def pad_labels(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Hugging Face's convention: ``labels`` beside the ids, -100 where the batch is padding."""
    ids = pad(samples)["input_ids"]
    labels = nn.utils.rnn.pad_sequence(samples, batch_first=True, padding_value=-100)
    return {"input_ids": ids, "labels": labels}


def _shifted_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A causal language model's loss as transformers computes it: the logits at each position
    predict the next label, whose mean is over the labels that are not -100."""
    logits = model(batch["input_ids"])[:, :-1]
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten())


def build_labels() -> Workload:
    """The sequences as a list with Hugging Face labels (-100 on padding) and a next-token loss."""
    torch.manual_seed(0)
    data = list(_sequences())
    return Workload(
        name="padded-labels",
        model=TokenMLP(),
        dataset=data,  # type: ignore[arg-type]
        loss_fn=_shifted_loss,
        collate_fn=pad_labels,
        batch_size=8,
    )
