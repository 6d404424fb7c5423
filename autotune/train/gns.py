"""Gradient noise scale from the micro-batch gradients that accumulation already computes.

McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", App. A.1: with gradient
norms measured at two batch sizes b < B,

    |G|^2    ~ (B |G_B|^2 - b |G_b|^2) / (B - b)          (unbiased)
    tr(Sigma) ~ (|G_b|^2 - |G_B|^2) / (1/b - 1/B)          (unbiased)
    B_simple = tr(Sigma) / |G|^2

Here b is the micro-batch size and B = k*b the accumulated batch: each of the k micro-batch
gradients gives a |G_b|^2 sample, ``.grad`` after the last one gives |G_B|^2. A hook on every
leaf parameter sees each micro-batch gradient *before* it is added to ``.grad``, so no gradient
is copied; the squared norms are summed on-device and read once per optimizer step.

Single-step ratios are very noisy, so the two unbiased estimates are averaged separately
(a decaying weighted mean over steps, McCandlish App. A.1) and only then divided.

We also report the seed method's sigma^2 (its eq. 7): the variance of the micro-batch gradients
around their mean, mean_i |g_i - g_mean|^2 = mean_i |g_i|^2 - |g_mean|^2.

With k = 1 there is only one batch size; the trainer can then run a step as two half
micro-batches (same effective batch, same gradient up to rounding) to feed this estimator.

A loss that is a mean over counted items (label tokens: :mod:`autotune.loss_items`) weighs micro-
batch i by its n_i of the step's N items. Its gradient g_i then has noise tr(Sigma_item) / n_i, and
the step's, N. So mean_i |g_i|^2 estimates |G|^2 + tr(Sigma_item) / b with b the harmonic mean of
the n_i, and the formulas above hold with that b and B = N. A sample's gradient is the mean of its
N / S items' (S samples in the step): tr(Sigma) per sample is tr(Sigma_item) S / N, which is what
is reported, so that B_simple stays in samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.utils.hooks import RemovableHandle

__all__ = ["GradientNoiseMonitor", "NoiseEstimate"]


@dataclass(frozen=True, kw_only=True)
class NoiseEstimate:
    """Smoothed gradient-noise statistics (per-sample units), McCandlish et al. 2018.

    Attributes:
        b_simple: The simple noise scale ``trace_sigma / grad_sq_norm``: the batch size past
            which a larger batch buys little. None when undefined: no step had two
            micro-batches, or the smoothed |G|^2 estimate is not positive (noise dominates: the
            batch is far below B_noise).
        trace_sigma: Smoothed estimate of the trace of the per-sample gradient covariance.
        grad_sq_norm: Smoothed estimate of the squared norm of the true gradient, |G|^2.
        sigma2: The variance of the micro-batch gradients around their mean (the seed
            method's sigma^2), smoothed as the others.
        steps: Optimizer steps that contributed an estimate (those with two micro-batches or more).

    Example:
        >>> from autotune import NoiseEstimate
        >>> noise = NoiseEstimate(b_simple=None, trace_sigma=None, grad_sq_norm=None, sigma2=None, steps=0)
        >>> noise.b_simple is None  # no step had two micro-batches: Measurement.noise of a batch in one step
        True
    """

    b_simple: float | None
    trace_sigma: float | None
    grad_sq_norm: float | None
    sigma2: float | None
    steps: int


class _WeightedMean:
    """Decaying weighted mean: decay=1 is the plain mean over all updates."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.total = 0.0
        self.weight = 0.0

    def update(self, x: float) -> None:
        self.total = self.decay * self.total + x
        self.weight = self.decay * self.weight + 1.0

    @property
    def value(self) -> float | None:
        return self.total / self.weight if self.weight > 0 else None


class GradientNoiseMonitor:
    """Hooks on parameters that estimate the gradient noise scale during normal training.

    Protocol per optimizer step: ``begin_step(micro_batch_size, grad_multiplier)``, then after each
    micro-batch's backward ``end_micro_batch()``, then ``end_step(big_batch_grads)`` with the
    accumulated gradients (already unscaled, before clipping).

    ``grad_multiplier`` converts what the hooks see into a per-micro-batch mean-loss gradient:
    the loop divides each micro-batch loss by k (and a loss scaler multiplies by its scale), so
    it is ``k / scale``.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], *, decay: float = 0.9) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], but got {decay!r}.")
        self._params = [p for p in params if p.requires_grad]
        self._handles: list[RemovableHandle] = [p.register_hook(self._hook) for p in self._params]
        self._norms: list[torch.Tensor] = []
        self._micro: list[torch.Tensor] = []
        self._items: list[float | torch.Tensor] | None = None
        self._b = 0
        self._mult = 1.0
        self._active = False
        self._g2 = _WeightedMean(decay)
        self._tr = _WeightedMean(decay)
        self._s2 = _WeightedMean(decay)
        self.steps = 0

    def _hook(self, grad: torch.Tensor) -> None:
        if not self._active:
            return
        # One reduction kernel per parameter and no full-size temporary (grad.pow(2) would
        # allocate one). The grad itself must not be kept: it is freed (or accumulated into
        # .grad in place) right after this hook, and holding it would cost a gradient's memory.
        self._norms.append(torch.linalg.vector_norm(grad, dtype=torch.float32))

    def begin_step(
        self, micro_batch_size: int, grad_multiplier: float, items: Sequence[float | torch.Tensor] | None = None
    ) -> None:
        """``items``: each micro-batch's counted items where the loss is a mean over them (its
        gradient is then weighted by its share of their total, not by 1/k: ``grad_multiplier``
        is ``k / scale`` all the same, and each micro-batch's is found from its share)."""
        self._b = micro_batch_size
        self._mult = grad_multiplier
        self._items = list(items) if items is not None else None
        self._micro = []
        self._norms = []
        # A micro-batch that counts nothing has no mean gradient: the step is left out (counted
        # on the device, such a count makes the estimate infinite, and end_step leaves it out).
        self._active = not any(not isinstance(n, torch.Tensor) and n <= 0 for n in self._items or ())

    def end_micro_batch(self) -> None:
        if not self._active:
            return
        sq = torch.linalg.vector_norm(torch.stack(self._norms)).square() if self._norms else torch.zeros(())
        mult: float | torch.Tensor = self._mult
        if self._items is not None:  # weighted n_i / N, not 1/k: the multiplier k/scale times N/(k n_i)
            k = len(self._items)
            mult = self._mult * sum(self._items) / (k * self._items[len(self._micro)])
        self._micro.append(sq * (mult**2))
        self._norms = []

    def end_step(self, grads: list[torch.Tensor]) -> None:
        """Fold one optimizer step in. Cost: one device->host sync (``.tolist()``)."""
        self._active = False
        k = len(self._micro)
        if k < 2 or not grads or not self._params:
            return
        big = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads])
        ).square()
        device = self._micro[0].device
        counts = [torch.as_tensor(n, dtype=torch.float32, device=device) for n in self._items or ()]
        values = torch.stack([*self._micro, big.to(device), *counts]).tolist()  # sync point
        small, big_sq, items = values[:k], values[k], values[k + 1 :]
        if not all(math.isfinite(v) for v in values):
            return  # an fp16 overflow step: the loop skips it too
        # In samples, or in counted items (b their harmonic mean, B their sum; see the module's docstring).
        b, big_b, per_sample = float(self._b), float(self._b * k), 1.0
        if items:
            b, big_b, per_sample = k / sum(1.0 / n for n in items), sum(items), self._b * k / sum(items)
        small_sq = sum(small) / k
        self._g2.update((big_b * big_sq - b * small_sq) / (big_b - b))
        self._tr.update(per_sample * (small_sq - big_sq) / (1.0 / b - 1.0 / big_b))
        self._s2.update(small_sq - big_sq)
        self.steps += 1

    def estimate(self) -> NoiseEstimate:
        g2, tr = self._g2.value, self._tr.value
        b_simple = tr / g2 if g2 is not None and tr is not None and g2 > 0 else None
        return NoiseEstimate(
            b_simple=b_simple, trace_sigma=tr, grad_sq_norm=g2, sigma2=self._s2.value, steps=self.steps
        )

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
