"""The objective every searcher maximizes, written once: samples/s per GiB of peak memory.

At the user's effective batch B_0 the value of a configuration is its throughput; when the batch
is a knob (a study over ``batch_sizes``, an environment or a run with ``adapt_batch``) it is its
goodput, throughput x the statistical efficiency of its batch B against B_0 (Pollux, Qiao et al.
OSDI'21; :func:`autotune.measurement.goodput.statistical_efficiency`), so no searcher can win by
inflating the batch. Either way it is divided by the peak tensor memory in GiB, and the
environments reward its logarithm.

The Optuna study (its trial values, its recommended trial), the Gymnasium environments (their
reward) and the adaptive trainer (its per-configuration record) all call :func:`score`: given the
same measured numbers they agree exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.measurement.goodput import statistical_efficiency

__all__ = ["GIB", "Score", "per_gib", "score"]

GIB = 1024**3
_TINY = 1e-12  # log(0) guard: a configuration that made no progress scores very low, not -inf


def per_gib(value: float, peak_bytes: int) -> float:
    """``value`` (samples/s) per GiB of ``peak_bytes``."""
    if peak_bytes <= 0:
        raise ValueError(f"peak_bytes must be > 0, but got {peak_bytes}.")
    return value / (peak_bytes / GIB)


@dataclass(frozen=True, kw_only=True)
class Score:
    """One configuration's objective: ``value`` is throughput, or goodput when the batch is a knob."""

    throughput: float  # samples/s
    efficiency: float  # statistical efficiency of the batch (1.0 at the user's batch)
    value: float  # throughput x efficiency when the batch is a knob, else throughput
    peak_bytes: int

    @property
    def per_gib(self) -> float:
        """The headline number: ``value`` per GiB of peak (the study's recommended trial has the most)."""
        return per_gib(self.value, self.peak_bytes)

    @property
    def log_per_gib(self) -> float:
        """What the environments' reward differences: ``log(value / peak GiB)``."""
        return math.log(max(self.value, _TINY) / (self.peak_bytes / GIB))


def score(
    *,
    throughput: float,
    peak_bytes: int,
    batch_size: int,
    base_batch_size: int,
    noise_scale: float | None,
    batch_is_knob: bool,
) -> Score:
    """The objective of a configuration measured at ``throughput`` samples/s and ``peak_bytes``.

    ``batch_size`` is its effective batch (all ranks), ``base_batch_size`` the user's B_0 and
    ``noise_scale`` the measured gradient noise scale (None: unknown, efficiency 1). Goodput is
    used only when ``batch_is_knob``; at a fixed batch the efficiency is reported but the value
    is the throughput (B = B_0 gives efficiency 1 anyway).
    """
    efficiency = statistical_efficiency(batch_size=batch_size, base_batch_size=base_batch_size, noise_scale=noise_scale)
    value = throughput * efficiency if batch_is_knob else throughput
    return Score(throughput=throughput, efficiency=efficiency, value=value, peak_bytes=peak_bytes)
