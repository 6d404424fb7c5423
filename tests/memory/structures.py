"""Two models written for the memory-model tests, shaped the way users write them and the memory
model's chain composition does not assume: ``build_shared`` (a Transformer text model whose
encoder layer 3 *is* layer 0, ALBERT-style, and whose output head is tied to the embedding) and
``build_unet`` (a small UNet: encoder, middle and decoder blocks as separate attributes, joined
by skip connections). Loadable as ``tests/memory/structures.py:build_shared`` / ``:build_unet``."""

from __future__ import annotations

import torch
from torch import nn

from autotune import Workload

VOCAB, WIDTH, SEQ, LAYERS = 96, 32, 16, 4


class SharedEncoderLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.encoder.layers[3] = self.encoder.layers[0]  # weight sharing across depth (ALBERT)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied output embedding

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.encoder(self.embed(tokens)))
        return logits


def _lm_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())


def build_shared() -> Workload:
    torch.manual_seed(0)
    tokens = torch.randint(0, VOCAB, (64, SEQ + 1), generator=torch.Generator().manual_seed(0))
    return Workload(
        name="shared-encoder-test",
        model=SharedEncoderLM(),
        dataset=torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:]),
        loss_fn=_lm_loss,
        blocks=[f"encoder.layers.{i}" for i in range(LAYERS)],
        batch_size=8,
    )


def _conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.GELU(), nn.Conv2d(cout, cout, 3, padding=1), nn.GELU())


class TinyUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc0, self.enc1 = _conv(3, 8), _conv(8, 16)
        self.mid = _conv(16, 16)
        self.dec1, self.dec0 = _conv(32, 8), _conv(16, 8)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2)
        self.out = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e0 = self.enc0(x)
        e1 = self.enc1(self.pool(e0))
        m = self.mid(self.pool(e1))
        d1 = self.dec1(torch.cat([self.up(m), e1], dim=1))
        d0 = self.dec0(torch.cat([self.up(d1), e0], dim=1))
        out: torch.Tensor = self.out(d0)
        return out


def _segmentation_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def build_unet() -> Workload:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    images = torch.randn(32, 3, 16, 16, generator=g)
    masks = torch.randint(0, 2, (32, 16, 16), generator=g)
    return Workload(
        name="unet-test",
        model=TinyUNet(),
        dataset=torch.utils.data.TensorDataset(images, masks),
        loss_fn=_segmentation_loss,
        blocks=["enc0", "enc1", "mid", "dec1", "dec0"],
        batch_size=8,
    )
