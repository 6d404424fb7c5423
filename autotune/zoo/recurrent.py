"""Recurrent language models over PyTorch's fused ``nn.LSTM`` / ``nn.GRU`` kernels.

The model embeds tokens, runs ``layers`` residual recurrent blocks (``x + RNN(LayerNorm(x))``, one
single-layer ``nn.LSTM`` or ``nn.GRU`` each, so per-block knobs act on one recurrent layer), a
final LayerNorm and an output head tied to the embedding, on the synthetic Markov text of the
``gpt-*`` workloads. Fused RNN kernels matter to autotune: bf16 autocast around ``nn.LSTM`` fails
on AVX2 CPUs (oneDNN: "could not create a primitive descriptor for the LSTM forward propagation
primitive") and fake-tensor memory profiles miss their activations (a 4-block LSTM LM: ~6 KiB
seen where the real step held ~21 MB).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from autotune.workload import Workload
from autotune.zoo.data import TokenSequences, markov_corpus, seeded_init
from autotune.zoo.gpt import lm_loss

__all__ = ["RecurrentBlock", "RecurrentLM", "build_lstm_lm", "build_gru_lm"]

Cell = Literal["lstm", "gru"]


class RecurrentBlock(nn.Module):
    """``x + RNN(LayerNorm(x))`` with one single-layer, batch-first ``nn.LSTM`` or ``nn.GRU``."""

    def __init__(self, *, cell: Cell, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        rnn = nn.LSTM if cell == "lstm" else nn.GRU
        self.rnn = rnn(width, width, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.norm(x))
        y: torch.Tensor = x + out
        return y


class RecurrentLM(nn.Module):
    """Token ids ``(B, T)`` -> next-token logits ``(B, T, vocab)``."""

    def __init__(self, *, cell: Cell, vocab: int, width: int, layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.blocks = nn.ModuleList(RecurrentBlock(cell=cell, width=width) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied (Press & Wolf 2017), as the transformer LMs
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def _build(
    cell: Cell, *, layers: int, width: int, seq_len: int, vocab: int, num_samples: int, batch_size: int, seed: int
) -> Workload:
    with seeded_init(seed):
        model = RecurrentLM(cell=cell, vocab=vocab, width=width, layers=layers)
    tokens = markov_corpus(
        num_sequences=num_samples, length=seq_len + 1, vocab_size=vocab, num_topics=4, branching=8, seed=seed + 1
    )
    return Workload(
        name=f"{cell}-lm",
        model=model,
        dataset=TokenSequences(tokens),
        loss_fn=lm_loss,
        blocks=None,  # auto-detected: the `blocks` ModuleList
        batch_size=batch_size,
    )


def build_lstm_lm(*, layers: int, width: int, seq_len: int, vocab: int, num_samples: int, batch_size: int) -> Workload:
    """``layers`` residual ``nn.LSTM`` blocks of ``width``, context ``seq_len``."""
    sizes = {"layers": layers, "width": width, "seq_len": seq_len, "vocab": vocab, "num_samples": num_samples}
    return _build("lstm", **sizes, batch_size=batch_size, seed=5001)


def build_gru_lm(*, layers: int, width: int, seq_len: int, vocab: int, num_samples: int, batch_size: int) -> Workload:
    """``layers`` residual ``nn.GRU`` blocks of ``width``, context ``seq_len``."""
    sizes = {"layers": layers, "width": width, "seq_len": seq_len, "vocab": vocab, "num_samples": num_samples}
    return _build("gru", **sizes, batch_size=batch_size, seed=5011)
