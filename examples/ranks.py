"""The ZeRO stage as a live knob: adaptive training on 2 DeepSpeed ranks (CPU processes, gloo).

``Adaptive.on_ranks`` starts the ranks, each rebuilding the model from this file's ``build()``
(the model lives in the rank processes), and trains it there. The memory budget is per rank: here
85% of the default configuration's predicted peak (ZeRO stage 0), which the default misses; ZeRO
stages 1-3 partition Adam's state (then the gradients, then the parameters) over the ranks, so the
run starts at the lowest stage that fits, and a later change of stage builds new DeepSpeed engines
with the training state carried over.

Run: ``python examples/ranks.py`` (tens of seconds on 2 CPU cores: the ranks start in ~10 s).
Needs ``pip install "torch-autotune[zero]"`` (DeepSpeed).
"""

from __future__ import annotations

import torch
from torch import nn

from autotune import Adaptive, Workload


def build() -> Workload:
    """Wide blocks and a small batch: Adam's state, which ZeRO partitions, is most of the memory."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 64, generator=g)
    y = (x.sum(dim=1) > 0).long()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 256), *(nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(3)), nn.Linear(256, 2)
    )

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb), yb)

    data = torch.utils.data.TensorDataset(x, y)
    # batch 16: the effective batch over both ranks (8 per rank)
    return Workload(name="wide-mlp", model=model, dataset=data, loss_fn=loss_fn, batch_size=16)


def main() -> None:
    # A reference the rank processes can import: this file and its build function.
    with Adaptive.on_ranks(f"{__file__}:build", ranks=2, memory_budget="85%", decide_every=4) as tuner:
        losses = [tuner.step().loss for _ in range(12)]
    print(f"12 steps on 2 ranks: loss {losses[0]:.3f} -> {losses[-1]:.3f}, budget {tuner.budget_bytes} B per rank")
    for change in tuner.history:
        print(
            f"step {change.step}: {change.source}: {'applied' if change.applied else 'refused'}: "
            f"{change.after.describe()}"
        )


if __name__ == "__main__":
    main()
