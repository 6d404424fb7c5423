"""GPT-2-style decoder-only language models on a synthetic Markov language.

The architecture follows GPT-2 (Radford et al. 2019) as nanoGPT writes it: pre-LayerNorm blocks,
causal self-attention, a GELU MLP with 4x expansion, learned positional embeddings and an output
head tied to the token embedding. Dropout is omitted (0) so a training step is deterministic.
Only the shape is scaled down from GPT-2 small (12 layers, 12 heads, width 768).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import TokenSequences, markov_corpus, seeded_init

__all__ = ["GPTShape", "GPT", "Block", "CausalSelfAttention", "lm_loss", "build_gpt_tiny", "build_gpt_small"]


@dataclass(frozen=True, kw_only=True)
class GPTShape:
    """The size of a GPT: vocabulary, context length, depth, heads and width."""

    vocab_size: int
    seq_len: int
    n_layer: int
    n_head: int
    d_model: int

    def __post_init__(self) -> None:
        for field in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise WorkloadError(f"GPTShape.{field} must be an int >= 1, but got {value!r}.")
        if self.d_model % self.n_head != 0:
            raise WorkloadError(
                "GPTShape.d_model must be divisible by GPTShape.n_head, but got "
                f"(d_model={self.d_model}, n_head={self.n_head})."
            )


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention through ``scaled_dot_product_attention`` (fused on CPU)."""

    def __init__(self, *, d_model: int, n_head: int, causal: bool = True) -> None:
        super().__init__()
        self.n_head = n_head
        self.causal = causal
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(b, t, c))
        return out


class MLP(nn.Module):
    """The transformer feed-forward layer: Linear (4x) -> GELU -> Linear."""

    def __init__(self, *, d_model: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # GPT-2 uses the tanh approximation of GELU.
        out: torch.Tensor = self.proj(F.gelu(self.fc(x), approximate="tanh"))
        return out


class Block(nn.Module):
    """A pre-LayerNorm transformer block; the residual additions happen inside the block, so a
    block maps the residual stream to the residual stream (what per-block wrappers need)."""

    def __init__(self, *, d_model: int, n_head: int, causal: bool = True) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model=d_model, n_head=n_head, causal=causal)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model=d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


class GPT(nn.Module):
    """Token ids ``(B, T)`` -> next-token logits ``(B, T, vocab_size)``."""

    def __init__(self, shape: GPTShape) -> None:
        super().__init__()
        self.shape = shape
        self.tok_emb = nn.Embedding(shape.vocab_size, shape.d_model)
        self.pos_emb = nn.Embedding(shape.seq_len, shape.d_model)
        self.blocks = nn.ModuleList(Block(d_model=shape.d_model, n_head=shape.n_head) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.d_model)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # weight tying (Press & Wolf 2017), as GPT-2
        self.apply(_init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer): each block adds two
        # branches to the residual stream, whose variance would otherwise grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * shape.n_layer))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy: positions ``0..T-1`` predict ``1..T`` of a ``(B, T+1)`` batch."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


def build_gpt(*, name: str, shape: GPTShape, num_sequences: int, batch_size: int, seed: int) -> Workload:
    """A GPT of ``shape`` on ``num_sequences`` sequences of ``shape.seq_len + 1`` tokens."""
    with seeded_init(seed):
        model = GPT(shape)
    tokens = markov_corpus(
        num_sequences=num_sequences,
        length=shape.seq_len + 1,
        vocab_size=shape.vocab_size,
        num_topics=4,
        branching=8,
        seed=seed + 1,
    )
    return Workload(
        name=name,
        model=model,
        dataset=TokenSequences(tokens),
        loss_fn=lm_loss,
        blocks=None,  # auto-detected: the `blocks` ModuleList
        batch_size=batch_size,
    )


def build_gpt_tiny() -> Workload:
    """~1.3M parameters: 6 layers, 4 heads, width 128, context 64, vocabulary 512."""
    shape = GPTShape(vocab_size=512, seq_len=64, n_layer=6, n_head=4, d_model=128)
    return build_gpt(name="gpt-tiny", shape=shape, num_sequences=8192, batch_size=32, seed=1001)


def build_gpt_small() -> Workload:
    """~10.9M parameters: 6 layers, 6 heads, width 384, context 128, vocabulary 512."""
    shape = GPTShape(vocab_size=512, seq_len=128, n_layer=6, n_head=6, d_model=384)
    return build_gpt(name="gpt-small", shape=shape, num_sequences=4096, batch_size=16, seed=1002)
