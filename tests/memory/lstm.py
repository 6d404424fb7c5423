"""A 4-block LSTM language model (embedding -> 4 x residual nn.LSTM -> linear head), written here
for the memory-model tests (the zoo's ``lstm-lm`` is someone else's). ``build`` is loadable as
``tests/memory/lstm.py:build``; ``build_gru`` is the same with ``nn.GRU``."""

from __future__ import annotations

import torch
from torch import nn

from autotune import Workload

VOCAB, HIDDEN, BLOCKS, SEQ = 200, 64, 4, 32


class RecurrentBlock(nn.Module):
    def __init__(self, cell: type[nn.LSTM] | type[nn.GRU]) -> None:
        super().__init__()
        self.rnn = cell(HIDDEN, HIDDEN, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.rnn(x)[0]
        return x + out


class RecurrentLM(nn.Module):
    def __init__(self, cell: type[nn.LSTM] | type[nn.GRU]) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(RecurrentBlock(cell) for _ in range(BLOCKS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(x)
        return logits


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def _build(name: str, cell: type[nn.LSTM] | type[nn.GRU]) -> Workload:
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (64, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return Workload(
        name=name,
        model=RecurrentLM(cell),
        dataset=torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]),
        loss_fn=_loss,
        blocks=[f"blocks.{i}" for i in range(BLOCKS)],
    )


def build() -> Workload:
    return _build("lstm-test", nn.LSTM)


def build_gru() -> Workload:
    return _build("gru-test", nn.GRU)
