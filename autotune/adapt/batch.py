"""Growing the effective batch with the gradient noise scale (only with ``adapt_batch=True``).

McCandlish et al. 2018 ("An Empirical Model of Large-Batch Training"): batches up to the noise
scale B_noise cost few extra samples; past it, each doubling of the batch nearly doubles the
samples needed. Pollux (Qiao et al., OSDI'21, eq. 5) turns that into a per-sample efficiency
relative to the user's batch B_0: ``(B_noise + B_0) / (B_noise + B)``
(:func:`autotune.measurement.goodput.statistical_efficiency`). The rule: double the batch (more
accumulation, same micro-batch, so memory does not grow) while the doubled batch keeps at least
``min_efficiency`` of the user's per-sample progress; never shrink below the user's batch. The
learning rate follows the config's ``lr_scaling`` rule (linear by default, Goyal et al. 2017).
"""

from __future__ import annotations

import dataclasses

from autotune.adapt.sources import Observation, Proposal
from autotune.measurement.goodput import statistical_efficiency

__all__ = ["grow_batch"]


def grow_batch(
    obs: Observation, *, base_batch_size: int, min_efficiency: float, max_batch_size: int
) -> Proposal | None:
    """Double the effective batch of ``obs.config`` if the noise scale supports it, else None."""
    c = obs.config
    doubled = 2 * c.effective_batch_size
    if obs.b_noise is None or doubled > max_batch_size:
        return None
    efficiency = statistical_efficiency(batch_size=doubled, base_batch_size=base_batch_size, noise_scale=obs.b_noise)
    if efficiency < min_efficiency:
        return None
    config = dataclasses.replace(c, grad_accum_steps=2 * c.grad_accum_steps)
    lr = config.lr_multiplier(base_batch_size)
    reason = (
        f"gradient noise scale {obs.b_noise:.4g} samples: batch {doubled} keeps {efficiency:.3f} >= "
        f"{min_efficiency} of batch {base_batch_size}'s per-sample progress; LR x{lr:g}"
    )
    return Proposal(config=config, reason=reason)
