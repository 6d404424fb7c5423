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
    """One optimizer step of the user's model, as :meth:`autotune.Adaptive.step` returns it.

    Attributes:
        step: 0-based index of this optimizer step.
        loss: The step's loss (mean over its micro-batches, weighted by their samples).
        samples: Samples trained in the step.
        seconds: Wall time of the step.
        lr: Learning rate of the step.
        config: The configuration it ran under.
        peak_bytes: The exact peak tensor memory of the step (MemTracker) when the step was
            tracked (the first one under a configuration whose prediction is not trusted), else None.

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import AdaptStep
        >>> step = AdaptStep(step=0, loss=0.69, samples=32, seconds=0.5, lr=0.1,
        ...                   config=TrainConfig(micro_batch_size=32))
        >>> step.throughput
        64.0
        >>> AdaptStep.from_dict(step.to_dict()) == step
        True
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
        """Samples/s of the step (0.0 if it took no measurable time)."""
        return self.samples / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (what :meth:`from_dict` reads)."""
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
        """The record :meth:`to_dict` wrote."""
        return cls(**{**data, "config": TrainConfig.from_dict(data["config"])})


@dataclass(frozen=True, kw_only=True)
class Change:
    """A configuration the decision source proposed, applied or refused, and why.

    An entry of :attr:`autotune.Adaptive.history`; :meth:`describe` is its one-line form.

    Attributes:
        step: Optimizer steps done before the decision.
        source: Who asked: the decision source's name, ``"budget"`` (the start within the budget,
            or a step measured over it), ``"measured"`` (the run left a configuration a proposal
            brought that measured no more than the margin above the best one measured before
            it), ``"resume"``, ``"memory"`` (a measured step checked the memory model on the
            device, nothing applied), or a loop's name for what it cannot take.
        before: The configuration the run was on.
        after: The configuration proposed.
        applied: Whether the run switched to ``after``. False: the budget gate refused it
            (``reason`` says by how much, or that the prediction was not verified), it was
            measured before and was not better than the configuration the run is on, or a
            measured step of it exceeded the budget and the run went back (``reverted``).
        reason: Why, in words (with the predicted bytes and the budget for the gate's verdicts).
        predicted_bytes: The memory model's peak for ``after``, where it made one.
        measured_bytes: A measured peak of ``after``, where one was taken.
        seconds: Wall time of the reconfiguration itself (wrappers, data stream).
        reverted: The run went back from ``after`` because a measured step exceeded the budget.
        recompile_seconds: On a compiled model, what the change's recompile took: its first
            compiled step over the steady step (:mod:`autotune.adapt.recompiles`); None where not
            measured (no recompile, an eager model, or not measured yet).

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import Change
        >>> change = Change(step=10, source="policy", before=TrainConfig(micro_batch_size=32),
        ...                 after=TrainConfig(micro_batch_size=16, grad_accum_steps=2), applied=True,
        ...                 reason="half the micro-batch")
        >>> print(change.describe())
        step 10: applied micro x acc x ranks 16x2x1 | fp32 | ckpt none | ZeRO 0 (policy: half the micro-batch)
        >>> Change.from_dict(change.to_dict()) == change
        True
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
    recompile_seconds: float | None = None

    def describe(self) -> str:
        """One line: the step, applied / refused / reverted, the configuration, the source and
        reason, and on a compiled model the recompile it cost."""
        verdict = "applied" if self.applied else ("reverted" if self.reverted else "refused")
        recompile = ""
        if self.recompile_seconds is not None:
            recompile = f"; recompile {self.recompile_seconds:.1f} s (its first compiled step over the steady one)"
        return f"step {self.step}: {verdict} {self.after.describe()} ({self.source}: {self.reason}{recompile})"

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (what :meth:`from_dict` reads)."""
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
            "recompile_seconds": self.recompile_seconds,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Change:
        """The record :meth:`to_dict` wrote."""
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
        """Every field as plain JSON values (what :meth:`from_dict` reads)."""
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
        """The record :meth:`to_dict` wrote."""
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
    """A step whose exact peak (a tracked step) was over the run's memory budget at the time.

    The gate admitted its configuration on a prediction that was off. The run left it after
    this step (a ``reverted`` :class:`Change`) unless there was nowhere to go back to. An entry
    of :attr:`autotune.Adaptive.over_budget_steps`.

    Attributes:
        step: 0-based index of the step.
        config: The configuration it ran under.
        peak_bytes: Its measured peak tensor bytes.
        budget_bytes: The run's budget at the time.
        predicted_bytes: What the memory model said for ``config``, if it could.

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import OverBudgetStep
        >>> over = OverBudgetStep(step=3, config=TrainConfig(micro_batch_size=32), peak_bytes=5_000_000,
        ...                       budget_bytes=4_000_000, predicted_bytes=3_900_000)
        >>> print(over.describe())
        step 3: micro x acc x ranks 32x1x1 | fp32 | ckpt none | ZeRO 0 measured a peak of 5000000 B (predicted
        3900000 B), over the memory budget of 4000000 B
    """

    step: int
    config: TrainConfig
    peak_bytes: int  # measured
    budget_bytes: int
    predicted_bytes: int | None  # what the memory model said, if it could

    def describe(self) -> str:
        """One line: the step, the configuration, the measured peak (and prediction) and the budget."""
        predicted = "" if self.predicted_bytes is None else f" (predicted {self.predicted_bytes} B)"
        return (
            f"step {self.step}: {self.config.describe()} measured a peak of {self.peak_bytes} B{predicted}, "
            f"over the memory budget of {self.budget_bytes} B"
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (what :meth:`from_dict` reads)."""
        return {
            "step": self.step,
            "config": self.config.to_dict(),
            "peak_bytes": self.peak_bytes,
            "budget_bytes": self.budget_bytes,
            "predicted_bytes": self.predicted_bytes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OverBudgetStep:
        """The record :meth:`to_dict` wrote."""
        return cls(
            step=data["step"],
            config=TrainConfig.from_dict(data["config"]),
            peak_bytes=data["peak_bytes"],
            budget_bytes=data["budget_bytes"],
            predicted_bytes=data["predicted_bytes"],
        )
