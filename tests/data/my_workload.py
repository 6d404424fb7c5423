"""A user workload as users write them: the contract from the README, in one file."""

import torch
from torch import nn

from autotune import Workload


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3)])
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x))


def build() -> Workload:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    y = (x.sum(dim=1) > 0).long()
    torch.manual_seed(0)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb), yb)

    return Workload(name="my-net", model=Net(), dataset=torch.utils.data.TensorDataset(x, y), loss_fn=loss_fn)


def not_a_workload() -> int:
    return 3


def explodes() -> Workload:
    raise ValueError("bad hyperparameter")


NOT_CALLABLE = 5
