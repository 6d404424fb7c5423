"""Goodput: throughput discounted by how much of each sample the optimizer can use.

Pollux (Qiao et al., OSDI'21, eq. 5, after McCandlish et al. 2018): training at batch B instead of
a reference batch B0 needs more samples for the same progress; per sample it is

    efficiency(B) = (B_noise + B0) / (B_noise + B)

as efficient, with B_noise the gradient noise scale. Goodput = throughput x efficiency. When the
effective batch is a knob, the study maximizes goodput, so it cannot win by inflating the batch
beyond what training can use (efficiency falls once B >> B_noise).
"""

from __future__ import annotations

import math

__all__ = ["statistical_efficiency"]


def statistical_efficiency(*, batch_size: int, base_batch_size: int, noise_scale: float | None) -> float:
    """``(B_noise + B0) / (B_noise + B)``; 1.0 when the noise scale is unknown.

    An unknown noise scale (None) happens when the smoothed |G|^2 estimate is not positive, i.e.
    noise dominates the gradient: B_noise is then far above any batch tried and the efficiency
    tends to 1, which is what we return.
    """
    if batch_size < 1 or base_batch_size < 1:
        raise ValueError(f"batch_size and base_batch_size must be >= 1, but got ({batch_size}, {base_batch_size}).")
    if noise_scale is None or not math.isfinite(noise_scale):
        return 1.0
    b_noise = max(noise_scale, 0.0)
    return (b_noise + base_batch_size) / (b_noise + batch_size)
