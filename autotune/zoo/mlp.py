"""A residual MLP on scikit-learn's bundled 8x8 digits (1797 images, 10 classes).

The digits ship inside scikit-learn (``sklearn.datasets.load_digits`` reads a file from the
package), so the workload is real data with no download. scikit-learn is imported only when the
workload is built.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from autotune.workload import Workload
from autotune.zoo.data import classification_loss, seeded_init

__all__ = ["ResidualMLPBlock", "ResidualMLP", "load_digits_standardized", "build_mlp_digits"]


class ResidualMLPBlock(nn.Module):
    """``x + Linear(GELU(Linear(LayerNorm(x))))``: a pre-norm residual block of constant width."""

    def __init__(self, *, width: int, hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(F.gelu(self.fc1(self.norm(x))))
        return out


class ResidualMLP(nn.Module):
    """Features ``(B, in_features)`` -> logits ``(B, num_classes)`` through residual blocks."""

    def __init__(self, *, in_features: int, width: int, depth: int, num_classes: int) -> None:
        super().__init__()
        self.embed = nn.Linear(in_features, width)
        self.blocks = nn.ModuleList(ResidualMLPBlock(width=width, hidden=width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.norm(x))
        return logits


def load_digits_standardized() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as ``(features, labels)``: float32 features standardized per pixel, in the
    order scikit-learn stores them."""
    from sklearn.datasets import load_digits  # lazy: importing scikit-learn takes ~1 s

    digits = load_digits()
    x = digits.data
    std = x.std(axis=0)
    std[std == 0] = 1.0  # border pixels are always 0 in every image: leave them at 0
    x = (x - x.mean(axis=0)) / std
    return torch.tensor(x, dtype=torch.float32), torch.tensor(digits.target, dtype=torch.long)


def build_mlp_digits() -> Workload:
    """~0.55M parameters: width 256, 4 residual blocks, on the 1797 standardized digits."""
    with seeded_init(3001):
        model = ResidualMLP(in_features=64, width=256, depth=4, num_classes=10)
    features, labels = load_digits_standardized()
    return Workload(
        name="mlp-digits",
        model=model,
        dataset=TensorDataset(features, labels),
        loss_fn=classification_loss,
        blocks=None,  # auto-detected: the `blocks` ModuleList
        batch_size=32,
    )
