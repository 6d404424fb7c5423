"""Workloads whose data comes as users' own pipelines bring it: padded variable-length sequences,
and a stream (an ``IterableDataset``).

``varlen-lm``: token sequences whose lengths vary 8x (``min_len`` to ``max_len``), padded per batch
by a collate that also returns an attention mask (what a tokenizer's padding collate yields), and
ordered so that the longest batch is the *last* of the epoch in dataset order: a configuration
chosen on the first batches runs out of memory there (:mod:`autotune.worst_case`).
``stream-lm``: fixed-length token sequences from an ``IterableDataset`` (no ``len()``, no
sampler, read in its own order). Both train the GPT of :mod:`autotune.zoo.gpt` on the Markov
language of :mod:`autotune.zoo.data`.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, IterableDataset

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import markov_corpus, seeded_init
from autotune.zoo.gpt import GPT, GPTShape, lm_loss

__all__ = [
    "TokenStream",
    "VarLenSequences",
    "build_stream_lm",
    "build_varlen_lm",
    "masked_lm_loss",
    "masked_lm_targets",
    "pad_collate",
]


class VarLenSequences(Dataset[torch.Tensor]):
    """Token sequences of different lengths: item ``i`` is ``tokens[i, :lengths[i]]``."""

    def __init__(self, tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        self.tokens, self.lengths = tokens, lengths.tolist()

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index, : self.lengths[index]]


def pad_collate(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Right-pad the sequences to the longest of the batch (with token 0): ``input_ids`` and an
    ``attention_mask`` (1 on tokens, 0 on padding), as a tokenizer's padding collate does."""
    longest = max(s.numel() for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, : s.numel()] = s
        mask[row, : s.numel()] = 1
    return {"input_ids": ids, "attention_mask": mask}


def masked_lm_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Next-token cross-entropy over the real tokens only: a target that is padding is ignored
    (causal attention never lets a real token see the padding after it)."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    logits = model(ids[:, :-1])
    targets = torch.where(mask[:, 1:].bool(), ids[:, 1:], -100)
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)


def masked_lm_targets(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """What :func:`masked_lm_loss` averages over: the targets that are real tokens."""
    return torch.count_nonzero(batch["attention_mask"][:, 1:])


def _lengths(num_samples: int, min_len: int, max_len: int, seed: int) -> torch.Tensor:
    """Lengths in ``[min_len, max_len / 2]`` for every batch but the last, which holds one sequence
    of ``max_len`` (and the shortest, ``min_len``, first): the longest batch comes last."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max(min_len, max_len // 2) + 1, (num_samples,), generator=g)
    lengths[0] = min_len
    lengths[-1] = max_len  # in the last batch, whatever the batch size
    return lengths


def build_varlen_lm(
    *,
    layers: int,
    width: int,
    heads: int,
    min_len: int,
    max_len: int,
    vocab: int,
    num_samples: int,
    batch_size: int,
    seed: int = 2101,
) -> Workload:
    """``varlen-lm``: a GPT on sequences of ``min_len`` to ``max_len`` tokens, padded per batch."""
    if not 2 <= min_len <= max_len:
        raise WorkloadError(
            f"varlen-lm: 2 <= min_len <= max_len must hold, but got (min_len={min_len}, max_len={max_len})."
        )
    if num_samples < 2:
        raise WorkloadError(f"varlen-lm: num_samples must be >= 2, but got {num_samples}.")
    shape = GPTShape(vocab_size=vocab, seq_len=max_len - 1, n_layer=layers, n_head=heads, d_model=width)
    with seeded_init(seed):
        model = GPT(shape)
    tokens = markov_corpus(
        num_sequences=num_samples, length=max_len, vocab_size=vocab, num_topics=4, branching=8, seed=seed + 1
    )
    lengths = _lengths(num_samples, min_len, max_len, seed + 2)
    return Workload(
        name="varlen-lm",
        model=model,
        dataset=VarLenSequences(tokens, lengths),
        loss_fn=masked_lm_loss,
        collate_fn=pad_collate,
        batch_size=batch_size,
        loss_items=masked_lm_targets,  # its loss is a mean over real target tokens, not samples
    )


class TokenStream(IterableDataset[torch.Tensor]):
    """Token sequences as a stream: each pass yields the rows of ``tokens`` in order."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __iter__(self) -> Iterator[torch.Tensor]:
        yield from self.tokens


def build_stream_lm(
    *,
    layers: int,
    width: int,
    heads: int,
    seq_len: int,
    vocab: int,
    num_samples: int,
    batch_size: int,
    seed: int = 2201,
) -> Workload:
    """``stream-lm``: a GPT on ``num_samples`` sequences of ``seq_len + 1`` tokens read from an
    ``IterableDataset``."""
    shape = GPTShape(vocab_size=vocab, seq_len=seq_len, n_layer=layers, n_head=heads, d_model=width)
    with seeded_init(seed):
        model = GPT(shape)
    tokens = markov_corpus(
        num_sequences=num_samples, length=seq_len + 1, vocab_size=vocab, num_topics=4, branching=8, seed=seed + 1
    )
    return Workload(name="stream-lm", model=model, dataset=TokenStream(tokens), loss_fn=lm_loss, batch_size=batch_size)
