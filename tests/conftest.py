"""Shared fixtures: small workloads that train in milliseconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune import Workload
from tests.profile_memo import ProfileMemo, install

# One intra-op thread: with two threads per process, any other process on a 2-core machine makes
# OpenMP spin-waits cost 10-30x (measured: gpt-tiny step 0.1 s -> 3.2 s). Tests never assert on
# time, and exact memory bytes do not depend on the thread count.
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Commands read the load average to warn of a busy machine (autotune.measurement.busy): in
    tests, the commands they start in subprocesses included, the machine is quiet unless a test
    scripts a load, so other processes on these cores do not add a line to outputs compared exactly."""
    monkeypatch.setenv("AUTOTUNE_LOAD_AVERAGE", "0")


_MEMO = ProfileMemo()


@pytest.fixture(autouse=True)
def shared_profiles(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake-tensor profiles of an identical input are computed once per worker (tests/profile_memo.py):
    they were nearly half of the suite's time. The profile's own tests (tests/memory/) run it every time."""
    if request.path.relative_to(Path(__file__).parent).parts[0] != "memory":
        install(_MEMO, monkeypatch)


class Block(nn.Module):
    """Pre-norm residual MLP block: saves enough activations for checkpointing to matter."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.ln(x))))


class ResMLP(nn.Module):
    def __init__(self, d_in: int = 16, d: int = 64, depth: int = 4, classes: int = 4) -> None:
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.out = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.out(h)


def _ce(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def make_resmlp(*, depth: int = 4, d: int = 64, n: int = 1024, seq: int = 32) -> Workload:
    """A residual MLP over (seq, 16) inputs; a sequence axis makes activations dominate memory."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, seq, 16, generator=g)
    y = x[:, :, :4].argmax(-1)
    torch.manual_seed(0)
    model = ResMLP(d=d, depth=depth)
    data = torch.utils.data.TensorDataset(x, y)

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(m(xb).flatten(0, 1), yb.flatten())

    return Workload(name="resmlp", model=model, dataset=data, loss_fn=loss_fn, batch_size=32)


def trained_step(workload: Workload, **knobs: Any) -> tuple[float, dict[str, torch.Tensor]]:
    """(loss, state dict) after one optimizer step of ``workload`` at micro-batch 4 x 2 under
    ``knobs``, with the same dropout masks whatever the knobs (seed 0, the RNG state restored)."""
    from autotune import TrainConfig
    from autotune.train import Trainer

    trainer = Trainer(workload, TrainConfig(micro_batch_size=4, grad_accum_steps=2, **knobs))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        loss = trainer.step().loss
    state = trainer.model.state_dict()
    trainer.close()
    return loss, state


@pytest.fixture
def resmlp() -> Workload:
    return make_resmlp()
