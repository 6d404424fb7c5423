"""Version 2 of the random architectures: the structures users write beyond a chain (issue 19).

``random2:SEED`` draws what ``random:SEED`` draws (block type, depth, width, ...) and then, from a
stream of its own (so version 1 stays as it was: the shipped simulator profiles and the transfer
check's held-out seeds are version 1), each of these with some probability:

============ ====================================================================== ======
feature      what is drawn                                                          chance
============ ====================================================================== ======
shared       block position ``j`` is the module of an earlier position ``i`` (one   0.4
             module object under two block names, ALBERT-style)
tied         a second output (below) whose head is the input embedding's weight,   0.5 of
             transposed                                                             two
skip         UNet-like (block ``i``'s output into block ``depth - 1 - i``'s input)  0.5
             or DenseNet-like (block ``j - 2``'s into block ``j``'s), added or
             concatenated (then projected back to the width)
batchnorm    a BatchNorm1d on every block's input (running statistics)             0.4
running      a :class:`RunningCenter` on every block's output: running state of a  0.3
             user's own (an EMA and a counter its forward updates)
dropout      dropout 0.1 or 0.2 on every block's output                             0.4
dict_batch   dict batches ``{"x", "mask", "labels"}``: sequences of random length  0.4
             (at least half the positions), masked pooling
two_outputs  the model returns ``{"logits", "recon"}``: the classes and a           0.4
             reconstruction of the inputs, the loss their sum
============ ====================================================================== ======

The blocks are declared to the workload (``blocks.0`` .. ``blocks.{depth - 1}``); a shared module
appears under two of those names.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from autotune.errors import WorkloadError

__all__ = [
    "Merge",
    "RunningCenter",
    "Structure",
    "StructuredBlock",
    "StructuredNet",
    "draw_structure",
    "structured_loss",
    "FEATURES",
]

Merge = Literal["add", "concat"]
#: Every feature a :class:`Structure` may have (see the module docstring).
FEATURES = frozenset({"shared", "tied", "skip", "batchnorm", "running", "dropout", "dict_batch", "two_outputs"})


@dataclass(frozen=True, kw_only=True)
class Structure:
    """What a version-2 architecture adds to the chain of blocks.

    Args:
        shared: ``(j, i)``: block position ``j`` reuses position ``i``'s module (``i < j``).
        skips: ``(i, j)`` pairs: block ``i``'s output joins block ``j``'s input (``i < j - 1``).
        merge: How a skip joins: ``add``, or ``concat`` then a linear projection to the width.
        batchnorm: A BatchNorm1d on each block's input.
        running: A :class:`RunningCenter` on each block's output.
        dropout: Dropout probability on each block's output (0: none).
        dict_batch: Dict batches with a padding mask.
        two_outputs: A reconstruction of the inputs as a second output.
        tied: The reconstruction head is the embedding's weight, transposed (needs ``two_outputs``).
    """

    shared: tuple[int, int] | None = None
    skips: tuple[tuple[int, int], ...] = ()
    merge: Merge = "add"
    batchnorm: bool = False
    running: bool = False
    dropout: float = 0.0
    dict_batch: bool = False
    two_outputs: bool = False
    tied: bool = False

    def __post_init__(self) -> None:
        if self.shared is not None and not 0 <= self.shared[1] < self.shared[0]:
            raise WorkloadError(f"Structure.shared must be (j, i) with 0 <= i < j, but got {self.shared!r}.")
        bad = [s for s in self.skips if not 0 <= s[0] < s[1] - 1]
        if bad:
            raise WorkloadError(f"Structure.skips must be (i, j) pairs with 0 <= i < j - 1, but got {bad!r}.")
        if self.merge not in get_args(Merge):
            raise WorkloadError(f"Structure.merge must be one of {list(get_args(Merge))}, but got {self.merge!r}.")
        if not 0.0 <= self.dropout < 1.0:
            raise WorkloadError(f"Structure.dropout must be in [0, 1), but got {self.dropout!r}.")
        if self.tied and not self.two_outputs:
            raise WorkloadError("Structure.tied needs two_outputs (the tied head is the second output's).")

    def check_depth(self, depth: int) -> None:
        """Raise :class:`WorkloadError` if a position is not a block of a ``depth``-block chain."""
        positions = [p for pair in (*self.skips, *([self.shared] if self.shared else [])) for p in pair]
        if any(p >= depth for p in positions):
            raise WorkloadError(f"Structure positions must be < depth={depth}, but got {self!r}.")

    @property
    def features(self) -> frozenset[str]:
        """The features drawn, a subset of :data:`FEATURES`."""
        flags = {
            "shared": self.shared is not None,
            "tied": self.tied,
            "skip": bool(self.skips),
            "batchnorm": self.batchnorm,
            "running": self.running,
            "dropout": self.dropout > 0,
            "dict_batch": self.dict_batch,
            "two_outputs": self.two_outputs,
        }
        return frozenset(name for name, on in flags.items() if on)


def draw_structure(rng: random.Random, depth: int) -> Structure:
    """Draw a :class:`Structure` for a ``depth``-block chain (chances in the module docstring)."""
    shared = None
    if depth >= 2 and rng.random() < 0.4:
        j = rng.randrange(1, depth)
        shared = (j, rng.randrange(j))
    skips: tuple[tuple[int, int], ...] = ()
    merge: Merge = "add"
    if depth >= 3 and rng.random() < 0.5:
        if rng.random() < 0.5:  # UNet-like: encoder block i feeds decoder block depth - 1 - i
            skips = tuple((i, depth - 1 - i) for i in range(depth // 2) if depth - 1 - 2 * i >= 2)
        else:  # DenseNet-like: each block also sees the output two blocks back
            skips = tuple((j - 2, j) for j in range(2, depth))
        merge = rng.choice(get_args(Merge))
    batchnorm = rng.random() < 0.4
    running = rng.random() < 0.3
    dropout = rng.choice((0.1, 0.2)) if rng.random() < 0.4 else 0.0
    dict_batch = rng.random() < 0.4
    two_outputs = rng.random() < 0.4
    tied = two_outputs and rng.random() < 0.5
    return Structure(
        shared=shared,
        skips=skips,
        merge=merge,
        batchnorm=batchnorm,
        running=running,
        dropout=dropout,
        dict_batch=dict_batch,
        two_outputs=two_outputs,
        tied=tied,
    )


class RunningCenter(nn.Module):
    """Subtracts a running mean of its input's features (an EMA it updates in train mode, as
    BatchNorm does, but not BatchNorm: what a checkpointed block's recompute must not update twice)
    and counts the batches it saw."""

    mean: torch.Tensor
    batches: torch.Tensor

    def __init__(self, width: int, *, momentum: float = 0.1) -> None:
        super().__init__()
        self.momentum = momentum
        self.register_buffer("mean", torch.zeros(width))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x - self.mean  # the mean before this batch: the output depends on the running state
        if self.training:
            with torch.no_grad():
                self.mean.lerp_(x.mean(dim=tuple(range(x.dim() - 1))), self.momentum)
                self.batches.add_(1)
        return out


class StructuredBlock(nn.Module):
    """A chain block with the structure's running state and dropout: ``drop(center(block(bn(x))))``."""

    def __init__(self, inner: nn.Module, *, width: int, batchnorm: bool, running: bool, dropout: float) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(width) if batchnorm else nn.Identity()
        self.inner = inner
        self.center = RunningCenter(width) if running else nn.Identity()
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x.transpose(1, 2)).transpose(1, 2)  # BatchNorm1d wants channels before length
        out: torch.Tensor = self.drop(self.center(self.inner(h)))
        return out


class StructuredNet(nn.Module):
    """Inputs ``(B, L, in_features)`` (and a ``(B, L)`` mask) -> logits ``(B, num_classes)``, or
    ``{"logits", "recon"}`` with two outputs. The chain of :class:`autotune.zoo.random_arch.RandomNet`
    with the structure's shared module, skips, running state, dropout and outputs."""

    def __init__(
        self,
        structure: Structure,
        *,
        make_block: Callable[[], nn.Module],
        depth: int,
        width: int,
        in_features: int,
        num_classes: int,
    ) -> None:
        super().__init__()
        structure.check_depth(depth)
        self.structure = structure
        self.embed = nn.Linear(in_features, width)
        s = structure
        blocks = [
            StructuredBlock(make_block(), width=width, batchnorm=s.batchnorm, running=s.running, dropout=s.dropout)
            for _ in range(depth)
        ]
        if s.shared is not None:
            blocks[s.shared[0]] = blocks[s.shared[1]]
        self.blocks = nn.ModuleList(blocks)
        self.sources: dict[int, list[int]] = {}
        for i, j in s.skips:
            self.sources.setdefault(j, []).append(i)
        # Concatenated skips are projected back to the width outside the blocks: the blocks stay
        # one chain of equal-width units, as per-block knobs and the memory model expect.
        self.merges = nn.ModuleDict(
            {str(j): nn.Linear((1 + len(src)) * width, width) for j, src in self.sources.items()}
            if s.merge == "concat"
            else {}
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)
        self.recon = nn.Linear(width, in_features) if s.two_outputs and not s.tied else None

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> Any:
        h = self.embed(x)
        if mask is not None:
            h = h * mask.unsqueeze(-1)
        outs: list[torch.Tensor] = []
        for j, block in enumerate(self.blocks):
            skipped = [outs[i] for i in self.sources.get(j, [])]
            if skipped and str(j) in self.merges:
                h = self.merges[str(j)](torch.cat([h, *skipped], dim=-1))
            elif skipped:
                h = h + sum(skipped)
            h = block(h)
            outs.append(h)
        pooled = h.mean(dim=1) if mask is None else (h * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        logits = self.head(self.norm(pooled))
        if not self.structure.two_outputs:
            return logits
        # Tied: the reconstruction head is the embedding's own weight, transposed.
        recon = F.linear(h, self.embed.weight.t()) if self.recon is None else self.recon(h)
        return {"logits": logits, "recon": recon}


def structured_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Cross-entropy of the logits, plus the reconstruction's mean squared error (over the
    unmasked positions) when the model has two outputs; tuple or dict batches."""
    if isinstance(batch, dict):
        x, mask, labels = batch["x"], batch["mask"], batch["labels"]
        out = model(x, mask=mask)
    else:
        (x, labels), mask = batch, None
        out = model(x)
    if not isinstance(out, dict):
        return F.cross_entropy(out.float(), labels)
    error = (out["recon"].float() - x).square().mean(dim=-1)
    recon: torch.Tensor = error.mean() if mask is None else (error * mask).sum() / mask.sum()
    return F.cross_entropy(out["logits"].float(), labels) + recon
