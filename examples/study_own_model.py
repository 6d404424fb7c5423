"""A study of your own model: which micro-batch, accumulation, per-block precision and activation
checkpointing give the most samples/s per GiB of peak memory, within a memory budget.

Your file defines a ``build()`` that returns an ``autotune.Workload`` (model, dataset, loss); the
study measures each configuration it tries on real training steps in a separate process, starting
with two baselines (the PyTorch default and a seed recipe), and prints the Pareto front and the
recommended configuration. The same study from a shell::

    autotune study examples/study_own_model.py:build --trials 3 --memory-budget 80%

Run: ``python examples/study_own_model.py`` (seconds to a minute on a CPU). It writes the study to
``studies/autotune.db`` under the working directory (resumable: run it again for more trials).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from autotune import Workload


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln(x))))


class Net(nn.Module):
    """The repeated blocks (here an ``nn.ModuleList``) are what gets per-block precision and checkpointing."""

    def __init__(self, d: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def build() -> Workload:
    """What ``autotune study FILE.py:build`` calls (in each measuring process): a fresh workload."""
    # 512 sequences of 32 vectors, a class per position: activations (which grow with the
    # micro-batch) outweigh the weights, so the budget leaves room to trade memory for speed.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 32, 16, generator=g)
    y = x[..., :4].argmax(dim=-1)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(x, y)
    return Workload(name="my-net", model=Net(), dataset=data, loss_fn=loss_fn, batch_size=64)


def main() -> int:
    from autotune.cli import main as autotune

    # 3 trials: the two baselines, then one the sampler picks (run it again for more: the study
    # resumes); the pretrained policy's proposal and the side-by-side re-timing of the best three
    # are left out to keep this example short.
    return autotune(
        [
            "study",
            f"{__file__}:build",
            "--trials",
            "3",
            "--memory-budget",
            "80%",
            "--no-policy-proposal",
            "--no-retime",
            "--steps",
            "2",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
