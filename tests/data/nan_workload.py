"""A workload whose loss is not finite, loadable by reference (``path/to/nan_workload.py:build``)
so a study's measurement child process can rebuild it. Self-contained, as ``tiny_workload.py``."""

from __future__ import annotations

import torch
from torch import nn

from autotune import Workload


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(2)])
        self.head = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def _data() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 16, generator=g)
    return torch.utils.data.TensorDataset(x, (x.sum(dim=1) > 0).long())


def _nan_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y) * float("nan")


def build() -> Workload:
    """A 2-block MLP whose loss (and so every gradient) is NaN at every step."""
    torch.manual_seed(0)
    return Workload(name="nan-net", model=Net(), dataset=_data(), loss_fn=_nan_loss, batch_size=16)
