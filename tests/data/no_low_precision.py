"""A workload whose blocks have no reduced-precision kernel, on every CPU.

It stands in for a real case that depends on the CPU (bf16 autocast around ``nn.LSTM`` on an AVX2
machine: oneDNN has no primitive for it), so the tests behave the same on every machine.
"""

import torch
from torch import nn

from autotune import Workload


class NoLowPrecision(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled("cpu"):
            raise RuntimeError("could not create a primitive descriptor for this op in reduced precision")
        return torch.tanh(self.linear(x))


def build() -> Workload:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=g)
    y = (x.sum(dim=1) > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(*[NoLowPrecision() for _ in range(3)], nn.Linear(32, 2))

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb), yb)

    return Workload(
        name="no-low-precision",
        model=model,
        dataset=torch.utils.data.TensorDataset(x, y),
        loss_fn=loss_fn,
        blocks=["0", "1", "2"],
    )
