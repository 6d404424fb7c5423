"""A user's plain MLP, as people write it: four repeated ``nn.Sequential(Linear, GELU, Linear)``
units and a head in one ``nn.Sequential``, trained at batch 512 on random data with cross-entropy.
Block 0 takes the batch itself (no stem before it). Loadable by reference
(``path/to/plain_mlp.py:build``); self-contained, without the tests package."""

from __future__ import annotations

import torch
from torch import nn

from autotune import Workload


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _model() -> nn.Module:
    units = (nn.Sequential(nn.Linear(64, 2048), nn.GELU(), nn.Linear(2048, 64)) for _ in range(4))
    return nn.Sequential(*units, nn.Linear(64, 10))


def _data(samples: int) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 64, generator=g)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 10, (samples,), generator=g))


def build() -> Workload:
    torch.manual_seed(0)
    return Workload(name="plain-mlp", model=_model(), dataset=_data(1024), loss_fn=_loss, batch_size=512)


def build_empty() -> Workload:
    """A user mistake: the dataset holds no sample."""
    torch.manual_seed(0)
    return Workload(name="plain-mlp", model=_model(), dataset=_data(0), loss_fn=_loss, batch_size=512)


def build_small() -> Workload:
    """A user mistake: a batch of 512 from 100 samples."""
    torch.manual_seed(0)
    return Workload(name="plain-mlp", model=_model(), dataset=_data(100), loss_fn=_loss, batch_size=512)


def build_float_targets() -> Workload:
    """A user mistake: class indices given to cross-entropy as floats (its meta kernel, like the
    real one, refuses them: torch logs the error with its traceback before raising it)."""
    torch.manual_seed(0)

    def loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(model(x), y.float())

    return Workload(name="plain-mlp", model=_model(), dataset=_data(1024), loss_fn=loss, batch_size=512)
