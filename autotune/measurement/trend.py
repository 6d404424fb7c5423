"""Loss trend: is training still making progress, and is it diverging?"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["ema", "loss_slope"]


def ema(values: Sequence[float], *, alpha: float = 0.3) -> list[float]:
    """Exponential moving average, ``alpha`` the weight of each new value (first value seeds it)."""
    out: list[float] = []
    for v in values:
        out.append(v if not out else alpha * v + (1.0 - alpha) * out[-1])
    return out


def loss_slope(losses: Sequence[float], *, alpha: float = 0.3) -> float | None:
    """Least-squares slope, per optimizer step, of the EMA-smoothed loss.

    Negative: still improving. None with fewer than two finite values.
    """
    ys = ema([v for v in losses if math.isfinite(v)], alpha=alpha)
    n = len(ys)
    if n < 2:
        return None
    x_mean, y_mean = (n - 1) / 2.0, sum(ys) / n
    cov = sum((i - x_mean) * (y - y_mean) for i, y in enumerate(ys))
    var = sum((i - x_mean) ** 2 for i in range(n))
    return cov / var
