"""What an adaptive run did, step by step, and why its configuration changed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.config import TrainConfig
from autotune.measurement.objective import Score

__all__ = ["AdaptStep", "Change", "ConfigRecord", "OverBudgetStep"]


@dataclass(frozen=True, kw_only=True)
class AdaptStep:
    """One optimizer step of the user's model.

    ``peak_bytes`` is the exact peak tensor memory of the step (MemTracker) when the step was
    tracked (the first one under each configuration), else None.
    """

    step: int  # 0-based index of this optimizer step
    loss: float
    samples: int
    seconds: float
    lr: float
    config: TrainConfig
    peak_bytes: int | None = None

    @property
    def throughput(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "loss": self.loss,
            "samples": self.samples,
            "seconds": self.seconds,
            "lr": self.lr,
            "config": self.config.to_dict(),
            "peak_bytes": self.peak_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AdaptStep:
        return cls(**{**data, "config": TrainConfig.from_dict(data["config"])})


@dataclass(frozen=True, kw_only=True)
class Change:
    """A configuration the decision source proposed, applied or refused, and why.

    ``step`` counts the optimizer steps done before the decision. ``applied`` False: the budget
    gate refused it (``reason`` says by how much, or that the prediction was not verified), it was
    measured before and was not better than the configuration the run is on, or a measured step
    of it exceeded the budget and the run went back (``reverted``). ``source`` "measured": the run
    left a configuration a proposal brought that measured no more than the margin above the
    best one measured before it.
    """

    step: int
    source: str
    before: TrainConfig
    after: TrainConfig
    applied: bool
    reason: str
    predicted_bytes: int | None = None
    measured_bytes: int | None = None
    seconds: float = 0.0  # wall time of the reconfiguration itself (wrappers, data stream)
    reverted: bool = False

    def describe(self) -> str:
        verdict = "applied" if self.applied else ("reverted" if self.reverted else "refused")
        return f"step {self.step}: {verdict} {self.after.describe()} ({self.source}: {self.reason})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "source": self.source,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "applied": self.applied,
            "reverted": self.reverted,
            "reason": self.reason,
            "predicted_bytes": self.predicted_bytes,
            "measured_bytes": self.measured_bytes,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Change:
        configs = {k: TrainConfig.from_dict(data[k]) for k in ("before", "after")}
        return cls(**{**data, **configs})


@dataclass(frozen=True, kw_only=True)
class ConfigRecord:
    """A configuration the run trained under, judged as every searcher judges one.

    Taken at the latest decision made under ``config`` once its peak was known (measured by a
    tracked step, or the memory model's verified prediction): ``score`` is
    :func:`autotune.measurement.objective.score` of the median throughput of its timed steps
    (over every stint the run spent in it), that peak and the gradient noise scale (goodput only
    with ``adapt_batch``), the very numbers an environment's reward and a study's recommended
    trial use.
    """

    step: int  # optimizer steps done when it was judged
    config: TrainConfig
    timed_steps: int  # untracked steps behind the median throughput
    noise_scale: float | None
    score: Score

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "timed_steps": self.timed_steps,
            "throughput": self.score.throughput,
            "peak_bytes": self.score.peak_bytes,
            "noise_scale": self.noise_scale,
            "efficiency": self.score.efficiency,
            "value": self.score.value,
            "per_gib": self.score.per_gib,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConfigRecord:
        judged = Score(
            throughput=data["throughput"],
            efficiency=data["efficiency"],
            value=data["value"],
            peak_bytes=data["peak_bytes"],
        )
        return cls(
            step=data["step"],
            config=TrainConfig.from_dict(data["config"]),
            timed_steps=data["timed_steps"],
            noise_scale=data["noise_scale"],
            score=judged,
        )


@dataclass(frozen=True, kw_only=True)
class OverBudgetStep:
    """A step whose exact peak (a tracked step) was over the run's memory budget at the time:
    the gate admitted its configuration on a prediction that was off. The run left it after
    this step (a ``reverted`` :class:`Change`) unless there was nowhere to go back to."""

    step: int
    config: TrainConfig
    peak_bytes: int  # measured
    budget_bytes: int
    predicted_bytes: int | None  # what the memory model said, if it could

    def describe(self) -> str:
        predicted = "" if self.predicted_bytes is None else f" (predicted {self.predicted_bytes} B)"
        return (
            f"step {self.step}: {self.config.describe()} measured a peak of {self.peak_bytes} B{predicted}, "
            f"over the memory budget of {self.budget_bytes} B"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "predicted_bytes": self.predicted_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OverBudgetStep:
        return cls(
            step=data["step"],
            config=TrainConfig.from_dict(data["config"]),
            peak_bytes=data["peak_bytes"],
            budget_bytes=data["budget_bytes"],
            predicted_bytes=data["predicted_bytes"],
        )
