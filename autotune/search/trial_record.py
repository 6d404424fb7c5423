"""What a study stores on each trial, and reading it back as a typed record.

Written by the objective as Optuna user attributes (plain JSON, visible in the dashboard), read by
the summary, the exports and the dashboard notes through :func:`trial_record`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.measurement.objective import ObjectiveName, objective_value, per_gib

if TYPE_CHECKING:
    import optuna

__all__ = ["ATTR", "TrialRecord", "trial_record", "METRIC_NAMES", "GOODPUT_METRIC_NAMES"]

METRIC_NAMES = ("throughput (samples/s)", "peak memory (MiB)")
GOODPUT_METRIC_NAMES = ("goodput (samples/s)", "peak memory (MiB)")
MIB = 1024**2


class ATTR:
    """User-attribute keys."""

    CONFIG = "config"
    BASELINE = "baseline"
    STATUS = "status"
    REASON = "reason"
    THROUGHPUT = "throughput"
    GOODPUT = "goodput"
    EFFICIENCY = "statistical_efficiency"
    NOISE_SCALE = "gradient_noise_scale"
    PEAK = "peak_bytes"
    PER_GIB = "throughput_per_gib"
    MEMORY = "memory_bytes"
    ALLOCATOR = "cuda_allocator"  # on CUDA only: peak allocated and reserved bytes, retries, OOMs
    STEP_SECONDS = "step_seconds"
    CACHED = "cached"
    PREDICTED = "predicted_peak_bytes"
    PREDICTION_ERROR = "prediction_error"
    HOST = "autotune:host"
    PID = "autotune:pid"
    INTERRUPTED = "interrupted"
    RETRY_OF = "retry_of"
    BEATEN_BY = "beaten_by"  # a side-by-side timing showed this trial worse than that one (search/refine.py)
    BEATEN_DECIDED = "beaten_decided"  # False: that timing was within both spreads (too close to call)


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """One finished (or running) trial as autotune sees it.

    ``objective`` is throughput, or goodput when the batch is a knob: the first study value.
    ``per_gib`` is ``objective`` per GiB of peak memory, the headline number.
    """

    number: int
    state: str
    config: TrainConfig | None
    baseline: str | None
    status: str | None
    reason: str | None
    throughput: float | None
    objective: float | None
    peak_bytes: int | None
    memory: dict[str, int] | None
    noise_scale: float | None
    efficiency: float | None
    feasible: bool
    #: The trial a side-by-side timing showed better than this one (None: none did).
    beaten_by: int | None = None
    #: Whether that timing separated the two beyond their spreads (a trial of a study from before
    #: this was recorded: True).
    beaten_decided: bool = True

    @property
    def per_gib(self) -> float | None:
        if self.objective is None or not self.peak_bytes:
            return None
        return per_gib(self.objective, self.peak_bytes)

    def under(self, objective: ObjectiveName) -> float | None:
        """What ``objective`` ranks this trial by (:func:`~autotune.measurement.objective.objective_value`):
        ``objective`` per GiB, or ``objective`` itself; None without a value or a peak."""
        if self.objective is None or not self.peak_bytes:
            return None
        return objective_value(self.objective, self.peak_bytes, objective)

    @property
    def peak_mib(self) -> float | None:
        return None if self.peak_bytes is None else self.peak_bytes / MIB


def trial_record(trial: optuna.trial.FrozenTrial) -> TrialRecord:
    a: dict[str, Any] = trial.user_attrs
    config = TrainConfig.from_dict(a[ATTR.CONFIG]) if ATTR.CONFIG in a else None
    complete = trial.state.name == "COMPLETE" and trial.values is not None
    feasible = complete and all(c <= 0 for c in trial.constraints.values())
    return TrialRecord(
        number=trial.number,
        state=trial.state.name,
        config=config,
        baseline=a.get(ATTR.BASELINE),
        status=a.get(ATTR.STATUS),
        reason=a.get(ATTR.REASON),
        throughput=a.get(ATTR.THROUGHPUT),
        objective=trial.values[0] if complete and trial.values else None,
        peak_bytes=a.get(ATTR.PEAK),
        memory=a.get(ATTR.MEMORY),
        noise_scale=a.get(ATTR.NOISE_SCALE),
        efficiency=a.get(ATTR.EFFICIENCY),
        feasible=feasible,
        beaten_by=a.get(ATTR.BEATEN_BY),
        beaten_decided=bool(a.get(ATTR.BEATEN_DECIDED, True)),
    )
