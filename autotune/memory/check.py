"""Check a memory profile against one real, exactly tracked training step.

A fake-tensor profile is only as faithful as the meta kernels it runs through (an LSTM's oneDNN
workspace was invisible to it until :mod:`autotune.memory.fake_workspaces`), and the next model nobody
here wrote may use another kernel whose meta version allocates differently. So the profile of a
workload is checked once, on the cheapest configuration that exercises it: the local runner,
fp32, no checkpointing, at the profile's larger micro-batch size. Prediction and measurement
disagreeing by more than :data:`TOLERANCE` makes the profile *unverified*: a warning names the
workload and both figures, and callers that act on predictions (a study pruning trials) measure
instead.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import ConfigError, PredictionWarning, one_line

if TYPE_CHECKING:
    from autotune.memory.profile import MemoryProfile
    from autotune.workload import Workload

__all__ = ["TOLERANCE", "Verification", "verify_profile"]

#: The memory model's target: predictions within 5% of the measured peak.
TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True)
class Verification:
    """A profile's prediction for ``config`` next to the peak one real step of it held.

    ``predicted``/``measured``: peak tensor bytes (``measured`` is None if the real step failed).
    ``relative_error``: (predicted - measured) / measured. ``verified``: both known and within
    :data:`TOLERANCE`; otherwise ``reason`` says what went wrong.
    """

    config: TrainConfig
    predicted: int
    measured: int | None
    relative_error: float | None
    verified: bool
    reason: str | None

    def __post_init__(self) -> None:
        if self.verified == (self.reason is not None):
            raise ConfigError(
                f"Verification.reason must be None exactly when verified, but got verified={self.verified} "
                f"with reason={self.reason!r}."
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "predicted": self.predicted,
            "measured": self.measured,
            "relative_error": self.relative_error,
            "verified": self.verified,
            "reason": self.reason,
        }


def verify_profile(workload: Workload, profile: MemoryProfile, *, tolerance: float = TOLERANCE) -> Verification:
    """Predict the check config from ``profile`` (which must have the fp32 mode) and measure one
    real step of it; warn (:class:`PredictionWarning`) if they disagree or the step fails.

    Cost: two real optimizer steps of the workload at the profile's larger micro-batch size (the
    first creates the optimizer state the prediction counts; the second runs under MemTracker,
    ~2x a plain step), on the CPU. Callers that measure every config anyway pass ``verify=False``
    to :func:`autotune.memory.profile.profile_memory` and skip it.
    """
    from autotune.memory.model import predict_memory

    config = TrainConfig(micro_batch_size=profile.micro_batch_sizes[1])
    predicted = predict_memory(workload, config, profile=profile).total
    measured, failure = _measure_one_step(workload, config)
    error = None if measured is None else (predicted - measured) / measured
    reason = failure
    if error is not None and abs(error) > tolerance:
        reason = f"the prediction is {abs(error):.1%} {'above' if error > 0 else 'below'} the measured peak"
    result = Verification(
        config=config,
        predicted=predicted,
        measured=measured,
        relative_error=error,
        verified=reason is None,
        reason=reason,
    )
    if not result.verified:
        warnings.warn(PredictionWarning(unverified_message(workload.name, result)), stacklevel=3)
    return result


def unverified_message(workload: str, v: Verification) -> str:
    """One line: the workload, both figures and the reason."""
    measured = "the real step failed" if v.measured is None else f"measured {v.measured} bytes"
    return (
        f"memory prediction for workload {workload!r} is unverified: predicted {v.predicted} bytes, "
        f"{measured} (micro-batch {v.config.micro_batch_size}, fp32, local): {v.reason}; "
        "configurations will be measured, not pruned on the prediction."
    )


def _measure_one_step(workload: Workload, config: TrainConfig) -> tuple[int | None, str | None]:
    """(peak tensor bytes of one tracked step after one warmup step, None) or (None, why it failed)."""
    from autotune.measurement.tracker import tracked_step
    from autotune.train.local import Trainer

    try:
        trainer = Trainer(workload, config, device="cpu")
        try:
            trainer.step()  # creates the optimizer state, as measure()'s warmup does
            at_peak = tracked_step(trainer).at_peak
        finally:
            trainer.close()
    # A check of user code: whatever it raises (a kernel this CPU lacks, out of memory) leaves
    # the prediction unverified, with the reason, rather than crashing the caller.
    except Exception as e:
        return None, f"the real check step failed: {one_line(e)}"
    return at_peak.total, None
