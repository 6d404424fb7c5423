"""The objective every searcher maximizes, written once: samples/s per GiB of peak memory, or
the most samples/s within the memory budget.

At the user's effective batch B_0 the value of a configuration is its throughput; when the batch
is a knob (a study over ``batch_sizes``, an environment or a run with ``adapt_batch``) it is its
goodput, throughput x the statistical efficiency of its batch B against B_0 (Pollux, Qiao et al.
OSDI'21; :func:`autotune.measurement.goodput.statistical_efficiency`), so no searcher can win by
inflating the batch. Either way it is divided by the peak tensor memory in GiB, and the
environments reward its logarithm.

The Optuna study (its trial values, its recommended trial), the Gymnasium environments (their
reward) and the adaptive trainer (its per-configuration record) all call :func:`score`: given the
same measured numbers they agree exactly.

Which configuration is *best* among those within the memory budget depends on what the memory is
for (:data:`OBJECTIVES`): ``"per-gib"`` (the default) ranks by value per GiB of peak, the
configuration that leaves the most room for other jobs or longer sequences on the same GPU;
``"throughput"`` ranks by the value itself, the fastest training on one dedicated card whose
memory up to the budget is free to use. :func:`objective_value` (and :meth:`Score.under`) is that
ranking, the one every searcher's pick calls; over the budget nothing is ranked under either.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

from autotune.errors import AutotuneError, ConfigError
from autotune.measurement.goodput import statistical_efficiency

__all__ = [
    "DEFAULT_OBJECTIVE",
    "GIB",
    "OBJECTIVES",
    "ObjectiveName",
    "Score",
    "check_objective",
    "format_value",
    "objective_value",
    "per_gib",
    "score",
]

#: What "best" means among the configurations within the memory budget: the most value per GiB
#: of peak (``"per-gib"``), or the most value (``"throughput"``).
ObjectiveName = Literal["per-gib", "throughput"]
OBJECTIVES: tuple[str, ...] = get_args(ObjectiveName)
DEFAULT_OBJECTIVE: ObjectiveName = "per-gib"

GIB = 1024**3
_TINY = 1e-12  # log(0) guard: a configuration that made no progress scores very low, not -inf


def per_gib(value: float, peak_bytes: int) -> float:
    """``value`` (samples/s) per GiB of ``peak_bytes``."""
    if peak_bytes <= 0:
        raise ValueError(f"peak_bytes must be > 0, but got {peak_bytes}.")
    return value / (peak_bytes / GIB)


def check_objective(objective: object, *, error: type[AutotuneError] = ConfigError) -> ObjectiveName:
    """``objective`` if it is one of :data:`OBJECTIVES`.

    Args:
        objective: The objective's name, as given.
        error: The exception to raise (:class:`~autotune.errors.SpecError` in a study spec).

    Returns:
        ``objective``, typed.

    Raises:
        ConfigError: (or ``error``) ``objective`` is not one of :data:`OBJECTIVES`.
    """
    if objective not in OBJECTIVES:
        raise error(f"objective must be one of {OBJECTIVES}, but got {objective!r}.")
    return objective  # type: ignore[return-value]  # checked just above


def objective_value(value: float, peak_bytes: int, objective: ObjectiveName) -> float:
    """What ``objective`` ranks a configuration within the budget by: ``value`` (samples/s, or
    goodput when the batch is a knob) per GiB of ``peak_bytes`` under ``"per-gib"``, ``value``
    itself under ``"throughput"`` (the peak then only has to fit the budget)."""
    return per_gib(value, peak_bytes) if objective == "per-gib" else value


def format_value(ranked: float, objective: ObjectiveName) -> str:
    """A value of :func:`objective_value` with its unit: ``12.3 per GiB`` or ``45.6 samples/s``."""
    return f"{ranked:.1f} per GiB" if objective == "per-gib" else f"{ranked:.1f} samples/s"


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

    def under(self, objective: ObjectiveName) -> float:
        """What ``objective`` ranks this configuration by (:func:`objective_value`)."""
        return objective_value(self.value, self.peak_bytes, objective)

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
