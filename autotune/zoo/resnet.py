"""A CIFAR-style ResNet on synthetic 32x32 images.

The network is the CIFAR ResNet of He et al. 2016 (Sec. 4.2) with two BasicBlocks per stage
(ResNet-14): a 3x3 stem of 16 channels, stages of 16, 32 and 64 channels (the last two halve the
resolution), global average pooling and a linear classifier. Downsampling blocks use a 1x1
projection shortcut (option B), which keeps every block a plain module with parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from autotune.workload import Workload
from autotune.zoo.data import classification_loss, prototype_images, seeded_init

__all__ = ["BasicBlock", "ResNet", "build_resnet_tiny"]


class BasicBlock(nn.Module):
    """Two 3x3 conv-BN layers and a shortcut: ``relu(bn(conv(relu(bn(conv(x))))) + shortcut(x))``."""

    def __init__(self, *, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """Images ``(B, 3, H, W)`` -> class logits ``(B, num_classes)``.

    Three stages named ``layer1``..``layer3`` as in torchvision, so block names read "layer2.0".
    """

    def __init__(self, *, widths: tuple[int, int, int], blocks_per_stage: int, num_classes: int) -> None:
        super().__init__()
        w1, w2, w3 = widths
        self.stem = nn.Sequential(nn.Conv2d(3, w1, 3, padding=1, bias=False), nn.BatchNorm2d(w1), nn.ReLU())
        self.layer1 = _stage(in_channels=w1, out_channels=w1, stride=1, num_blocks=blocks_per_stage)
        self.layer2 = _stage(in_channels=w1, out_channels=w2, stride=2, num_blocks=blocks_per_stage)
        self.layer3 = _stage(in_channels=w2, out_channels=w3, stride=2, num_blocks=blocks_per_stage)
        self.fc = nn.Linear(w3, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        logits: torch.Tensor = self.fc(x.mean(dim=(2, 3)))
        return logits


def _stage(*, in_channels: int, out_channels: int, stride: int, num_blocks: int) -> nn.Sequential:
    """``num_blocks`` BasicBlocks; only the first changes the width and resolution."""
    return nn.Sequential(
        BasicBlock(in_channels=in_channels, out_channels=out_channels, stride=stride),
        *(BasicBlock(in_channels=out_channels, out_channels=out_channels, stride=1) for _ in range(num_blocks - 1)),
    )


def build_resnet_tiny() -> Workload:
    """ResNet-14 (16/32/64 channels, ~0.18M parameters) on 4000 synthetic 10-class images."""
    with seeded_init(2001):
        model = ResNet(widths=(16, 32, 64), blocks_per_stage=2, num_classes=10)
    images, labels = prototype_images(
        num_images=4000, num_classes=10, modes_per_class=4, size=32, noise=2.0, max_shift=6, seed=2002
    )
    blocks = [f"layer{s}.{b}" for s in range(1, 4) for b in range(2)]
    return Workload(
        name="resnet-tiny",
        model=model,
        dataset=TensorDataset(images, labels),
        loss_fn=classification_loss,
        blocks=blocks,
        batch_size=64,
    )
