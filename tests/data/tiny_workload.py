"""A residual MLP that trains in milliseconds, loadable by reference (``path/to/tiny_workload.py:build``)
so the study's measurement child process can rebuild it. Self-contained: the child imports this file
by path, without the tests package."""

from __future__ import annotations

import torch
from torch import nn

from autotune import Workload


class Block(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.ln(x))))


class ResMLP(nn.Module):
    def __init__(self, *, d: int, depth: int) -> None:
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.out = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def _loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())


def build() -> Workload:
    """4 blocks of width 32 over (seq 16, 16) inputs: activations dominate memory."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, 16, generator=g)
    y = x[:, :, :4].argmax(-1)
    torch.manual_seed(0)
    return Workload(
        name="tiny",
        model=ResMLP(d=32, depth=4),
        dataset=torch.utils.data.TensorDataset(x, y),
        loss_fn=_loss,
        batch_size=16,
    )


def build_hanging() -> Workload:
    """Like :func:`build`, but a forward pass with a micro-batch of 1 never returns (a time-limit
    test). Its floor is 4: the measuring child's warm-up step runs there (its gradient-noise
    estimate splits it in two)."""
    wl = build()

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if batch[0].shape[0] == 1:
            import time

            while True:
                time.sleep(1)
        return _loss(m, batch)

    return Workload(name="hanging", model=wl.model, dataset=wl.dataset, loss_fn=loss, batch_size=16, min_micro_batch=4)


def build_holdable() -> Workload:
    """Like :func:`build`, but while the file named by ``$AUTOTUNE_TEST_HOLD`` exists, a forward
    pass writes ``<that file>.held`` and waits: a test can stop a study exactly mid-trial."""
    import os
    import time
    from pathlib import Path

    wl = build()
    hold = Path(os.environ["AUTOTUNE_TEST_HOLD"])

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        if hold.exists():
            Path(f"{hold}.held").write_text(str(os.getpid()))
            while hold.exists():
                time.sleep(0.05)
        return _loss(m, batch)

    return Workload(name="tiny", model=wl.model, dataset=wl.dataset, loss_fn=loss, batch_size=16)


def build_bad_loss() -> Workload:
    """Like :func:`build`, but loss_fn returns the per-token losses, (batch, 16): a user mistake."""
    wl = build()

    def loss(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten(), reduction="none").view(x.shape[0], -1)

    return Workload(name="tiny", model=wl.model, dataset=wl.dataset, loss_fn=loss, batch_size=16)


def build_float_loss() -> Workload:
    """Like :func:`build`, but loss_fn returns a Python float: a user mistake."""
    wl = build()
    return Workload(
        name="tiny", model=wl.model, dataset=wl.dataset, loss_fn=lambda m, b: _loss(m, b).item(), batch_size=16
    )
