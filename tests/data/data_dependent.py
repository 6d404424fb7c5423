"""A workload whose forward branches on a tensor's value: FakeTensorMode cannot run it."""

import torch
from torch import nn

from autotune import Workload


class Gated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h if h.sum().item() > 0 else -h  # .item(): data-dependent


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(Gated(), Gated())
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def build() -> Workload:
    torch.manual_seed(0)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    y = (x[:, 0] > 0).long()

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    return Workload(
        name="data-dependent",
        model=Net(),
        dataset=torch.utils.data.TensorDataset(x, y),
        loss_fn=loss_fn,
        blocks=["blocks.0", "blocks.1"],
    )
