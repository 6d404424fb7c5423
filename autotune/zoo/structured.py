"""Corpus models with the structures users write beyond a chain of blocks (issue 19).

* ``shared-encoder``: an ``nn.TransformerEncoder`` text classifier whose encoder layer 3 *is*
  layer 0 (one module object at two block positions, ALBERT-style cross-layer sharing, Lan et al.
  2020) and whose head is tied to the token embedding (Press & Wolf 2017): the logit of class
  ``c`` is the pooled state against the embedding of token ``c``. Each class's texts come from
  their own Markov language, so the class is learnable from bigram statistics. The blocks are
  declared (``encoder.layers.0`` .. ``encoder.layers.{layers - 1}``): a shared module appears once
  in ``named_modules``, so auto-detection would miss position 3.
* ``unet-tiny``: a two-level UNet (Ronneberger et al. 2015): encoder, middle and decoder blocks as
  separate attributes, each decoder block taking the upsampled stream and the matching encoder
  block's output (concatenated), BatchNorm in every block; a 1x1 head labels every pixel with its
  image's class (prototype images). The blocks are declared: they are not one repeated class.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import TensorDict, language_classes, prototype_images, seeded_init

__all__ = ["SharedEncoderClassifier", "UNet", "build_shared_encoder", "build_unet"]

SHARED = (3, 0)  # (position, the position whose module it reuses)


class SharedEncoderClassifier(nn.Module):
    """Token ids ``(B, T)`` -> class logits ``(B, num_classes)``; layer 3 is layer 0."""

    def __init__(self, *, vocab: int, width: int, heads: int, layers: int, seq_len: int, num_classes: int) -> None:
        super().__init__()
        self.num_classes = num_classes
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(seq_len, width))
        layer = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.1, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        position, source = SHARED
        self.encoder.layers[position] = self.encoder.layers[source]
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: class c is scored against token c's embedding
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(idx) + self.pos)
        logits: torch.Tensor = self.head(self.norm(h.mean(dim=1)))[:, : self.num_classes]
        return logits


class ConvBNBlock(nn.Module):
    """Two ``3x3 conv -> BatchNorm -> ReLU``, from ``in_channels`` to ``out_channels``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


class UpBlock(nn.Module):
    """Upsample the stream 2x, concatenate the encoder's skip, then a :class:`ConvBNBlock`."""

    def __init__(self, in_channels: int, skip_channels: int, out_channels: int) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(in_channels, in_channels, 2, stride=2)
        self.conv = ConvBNBlock(in_channels + skip_channels, out_channels)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.conv(torch.cat([self.up(x), skip], dim=1))
        return out


class UNet(nn.Module):
    """Images ``(B, 3, S, S)`` -> per-pixel logits ``(B, num_classes, S, S)``; ``S`` divisible by 4."""

    def __init__(self, *, width: int, num_classes: int) -> None:
        super().__init__()
        self.enc1 = ConvBNBlock(3, width)
        self.enc2 = ConvBNBlock(width, 2 * width)
        self.mid = ConvBNBlock(2 * width, 4 * width)
        self.dec2 = UpBlock(4 * width, 2 * width, 2 * width)
        self.dec1 = UpBlock(2 * width, width, width)
        self.head = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        h = self.mid(F.max_pool2d(e2, 2))
        h = self.dec1(self.dec2(h, e2), e1)
        logits: torch.Tensor = self.head(h)
        return logits


def _pixel_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of every pixel against its image's class."""
    logits = model(batch["images"]).float()
    return F.cross_entropy(logits, batch["labels"][:, None, None].expand(-1, *logits.shape[2:]))


def _text_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return F.cross_entropy(model(batch["tokens"]).float(), batch["labels"])


def build_shared_encoder(
    *, layers: int, width: int, heads: int, seq_len: int, vocab: int, classes: int, num_samples: int, batch_size: int
) -> Workload:
    """``layers`` encoder layers of ``width`` (layer 3 is layer 0), ``classes`` Markov languages."""
    if layers < 4:
        raise WorkloadError(f"workload 'shared-encoder': layers must be >= 4 (layer 3 is layer 0), but got {layers}")
    if width % heads:
        raise WorkloadError(
            f"workload 'shared-encoder': width must be divisible by heads, but got (width={width}, heads={heads})"
        )
    if classes > vocab:
        raise WorkloadError(
            f"workload 'shared-encoder': classes must be <= vocab (class c is token c), but got "
            f"(classes={classes}, vocab={vocab})"
        )
    with seeded_init(6001):
        model = SharedEncoderClassifier(
            vocab=vocab, width=width, heads=heads, layers=layers, seq_len=seq_len, num_classes=classes
        )
    return Workload(
        name="shared-encoder",
        model=model,
        dataset=language_classes(classes=classes, num_samples=num_samples, seq_len=seq_len, vocab=vocab, seed=6000),
        loss_fn=_text_loss,
        blocks=[f"encoder.layers.{i}" for i in range(layers)],
        batch_size=batch_size,
    )


def build_unet(*, width: int, image_size: int, num_samples: int, batch_size: int) -> Workload:
    """A two-level UNet of base ``width`` on ``image_size`` x ``image_size`` prototype images."""
    if image_size % 4:
        raise WorkloadError(f"workload 'unet-tiny': image_size must be divisible by 4, but got {image_size}")
    with seeded_init(6101):
        model = UNet(width=width, num_classes=10)
    images, labels = prototype_images(
        num_images=num_samples, num_classes=10, modes_per_class=2, size=image_size, noise=0.5, max_shift=2, seed=6102
    )
    return Workload(
        name="unet-tiny",
        model=model,
        dataset=TensorDict(images=images, labels=labels),
        loss_fn=_pixel_loss,
        blocks=["enc1", "enc2", "mid", "dec2", "dec1"],
        batch_size=batch_size,
    )
