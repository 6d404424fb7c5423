"""Corpus models trained as fine-tuning recipes train them: frozen parameters (issue 44).

* ``frozen-backbone``: a pretrained-style GPT backbone (token and position embeddings, pre-LayerNorm
  blocks) read out by a trainable classification head (a final LayerNorm and a Linear over the
  mean-pooled states), its embeddings and first ``frozen`` blocks frozen with
  ``requires_grad_(False)``: a linear probe when every block is frozen (the built-in size), partial
  fine-tuning otherwise. Each class's texts come from their own Markov language.
* ``lora-lm``: a GPT language model fine-tuned with LoRA adapters (Hu et al. 2021, "LoRA:
  Low-Rank Adaptation of Large Language Models"), written in plain torch as PEFT writes them:
  every projection of attention and MLP is a frozen base ``nn.Linear`` plus a trainable low-rank
  update ``B @ A`` of rank ``rank`` scaled by ``alpha / rank`` (``B`` starts at zero, so the
  adapted model starts as the base one); embeddings, LayerNorms and the tied head are frozen.
  Its optimizer is AdamW with weight decay over the trainable parameters only, as a PEFT recipe
  builds it.

Frozen parameters have no gradient and no optimizer state, and a frozen block whose input needs
no gradient saves nothing for backward: what the memory model must count
(:mod:`autotune.memory.model`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import TokenSequences, language_classes, markov_corpus, seeded_init
from autotune.zoo.gpt import GPT, Block, GPTShape, lm_loss

__all__ = [
    "FrozenBackboneClassifier",
    "LoRALinear",
    "add_lora",
    "build_frozen_backbone",
    "build_lora_lm",
    "trainable_adamw",
]


class FrozenBackboneClassifier(nn.Module):
    """Token ids ``(B, T)`` -> class logits ``(B, num_classes)``: a GPT backbone, then a head."""

    def __init__(self, *, vocab: int, width: int, heads: int, layers: int, seq_len: int, num_classes: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(d_model=width, n_head=heads, causal=False) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.size(1), device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x).mean(dim=1))
        return logits

    def freeze(self, blocks: int) -> None:
        """Freeze the embeddings and the first ``blocks`` blocks (their weights stay as built)."""
        for module in (self.tok_emb, self.pos_emb, *self.blocks[:blocks]):
            module.requires_grad_(False)


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * x @ A.T @ B.T``: a frozen ``nn.Linear`` and its low-rank update.

    ``A`` is initialised as PEFT does (Kaiming-uniform), ``B`` at zero: the update starts at zero.
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: int) -> None:
        super().__init__()
        self.base = base.requires_grad_(False)
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.base(x) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scaling
        return out


def add_lora(model: nn.Module, *, rank: int, alpha: int) -> None:
    """Freeze every parameter of ``model``, then put a :class:`LoRALinear` around each ``nn.Linear``
    of its GPT blocks (attention's ``qkv`` and ``proj``, the MLP's ``fc`` and ``proj``)."""
    model.requires_grad_(False)
    for block in (m for m in model.modules() if isinstance(m, Block)):
        for parent in (block.attn, block.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, LoRALinear(child, rank=rank, alpha=alpha))


def trainable_adamw(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """AdamW (weight decay 0.01) over the parameters that require gradients, as a PEFT recipe
    builds it (``filter(lambda p: p.requires_grad, model.parameters())``)."""
    return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-3, weight_decay=0.01)


def _text_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["tokens"]).float(), batch["labels"])


def build_frozen_backbone(
    *,
    layers: int,
    frozen: int,
    width: int,
    heads: int,
    seq_len: int,
    vocab: int,
    classes: int,
    num_samples: int,
    batch_size: int,
) -> Workload:
    """``layers`` blocks of ``width``, the embeddings and the first ``frozen`` blocks frozen, a
    trainable head over ``classes`` Markov languages; the default optimizer (AdamW over every
    parameter: torch's optimizers skip a parameter without a gradient)."""
    if frozen > layers:
        raise WorkloadError(
            f"workload 'frozen-backbone': frozen must be <= layers, but got (frozen={frozen}, layers={layers})"
        )
    if width % heads:
        raise WorkloadError(
            f"workload 'frozen-backbone': width must be divisible by heads, but got (width={width}, heads={heads})"
        )
    with seeded_init(6201):
        model = FrozenBackboneClassifier(
            vocab=vocab, width=width, heads=heads, layers=layers, seq_len=seq_len, num_classes=classes
        )
    model.freeze(frozen)
    return Workload(
        name="frozen-backbone",
        model=model,
        dataset=language_classes(classes=classes, num_samples=num_samples, seq_len=seq_len, vocab=vocab, seed=6200),
        loss_fn=_text_loss,
        batch_size=batch_size,
    )


def build_lora_lm(
    *,
    layers: int,
    width: int,
    heads: int,
    seq_len: int,
    vocab: int,
    rank: int,
    alpha: int,
    num_samples: int,
    batch_size: int,
) -> Workload:
    """A GPT LM of ``layers`` x ``width`` with rank-``rank`` LoRA adapters on every projection."""
    if width % heads:
        raise WorkloadError(
            f"workload 'lora-lm': width must be divisible by heads, but got (width={width}, heads={heads})"
        )
    shape = GPTShape(vocab_size=vocab, seq_len=seq_len, n_layer=layers, n_head=heads, d_model=width)
    with seeded_init(6301):
        model = GPT(shape)
        add_lora(model, rank=rank, alpha=alpha)
    tokens = markov_corpus(
        num_sequences=num_samples, length=seq_len + 1, vocab_size=vocab, num_topics=4, branching=8, seed=6302
    )
    return Workload(
        name="lora-lm",
        model=model,
        dataset=TokenSequences(tokens),
        loss_fn=lm_loss,
        optimizer=trainable_adamw,
        batch_size=batch_size,
    )
