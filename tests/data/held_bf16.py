"""A user's model loaded in bf16 (``torch_dtype=torch.bfloat16``): every parameter 16-bit."""

import torch
from torch import nn

from autotune import Workload


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh()) for _ in range(3)])
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(x.to(self.head.weight.dtype)))


def build() -> Workload:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    y = (x.sum(dim=1) > 0).long()
    torch.manual_seed(0)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb).float(), yb)

    model = Net().to(torch.bfloat16)
    return Workload(name="held-net", model=model, dataset=torch.utils.data.TensorDataset(x, y), loss_fn=loss_fn)
