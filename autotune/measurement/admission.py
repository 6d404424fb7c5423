"""THE arithmetic of a peak against a memory budget: :func:`admission` and its :class:`Verdict`.

Every judgement of memory against a budget asks it: the measurement schedule (a tracked step
over the budget ends the measurement), the budget gate of adaptive runs, the callbacks and the
training environment (:class:`autotune.memory.gate.BudgetGate`, which re-exports both names),
the environments' exact peaks, the study's predictions. It sits in ``measurement/``, below
``memory/``, so that the schedule can ask it too; the memory model's side of the rule (which
prediction, verified or not, scaled how) is the gate's.

The rule on one configuration's figures: a measured peak is judged as is (on CUDA its reserved
peak, with :data:`~autotune.measurement.cuda_memory.RESERVED_HEADROOM`); else a verified
prediction with the caller's headroom (on CUDA scaled by the reserved/allocated ratio seen); an
unverified prediction, or none, counts as over the budget, unless the caller measures such a
configuration to know (``unverified="measure"``: a study's trial runs in an isolated child,
where an out-of-memory error is a result).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from autotune.measurement.cuda_memory import RESERVED_HEADROOM, reserved_of, reserved_with_headroom

__all__ = ["Unverified", "Verdict", "admission"]

#: What an unverified prediction, or none, means for a configuration nothing measured:
#: ``"refuse"`` (over the budget: an adaptive run, the training environment) or ``"measure"``
#: (admitted, so that its measurement says: a study's trial).
Unverified = Literal["refuse", "measure"]


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """Whether a config may run, with the figures that decided it (:func:`admission`).

    Attributes:
        admitted: Whether it may run.
        reason: The rule and figures in words, e.g. ``"predicted 3288 B (+2% headroom) <= budget
            4568 B"``: what the run's history says.
        predicted: The predicted peak bytes it was judged on, or None.
        measured: The measured peak bytes it was judged on, or None.
        needed: The bytes compared with the budget (the peak with its headroom, on CUDA as
            reserved bytes), or None where no figure was compared.
    """

    admitted: bool
    reason: str
    predicted: int | None
    measured: int | None
    needed: int | None = None


def admission(
    *,
    budget: int,
    headroom: float,
    measured: int | None = None,
    predicted: int | None = None,
    verified: bool = False,
    unpredicted: str | None = None,
    reserved: int | None = None,
    reserved_ratio: float | None = None,
    unverified: Unverified = "refuse",
) -> Verdict:
    """The admission rule (module docstring), on one configuration's figures: THE arithmetic of a
    peak against a budget, which every searcher asks.

    Args:
        budget: Peak bytes allowed.
        headroom: The margin on a prediction (0.0 where the peak is exact, as a measurement is).
        measured: Exact bytes of a real step, if known: judged as is.
        predicted: The memory model's bytes, judged when nothing was measured.
        verified: Whether ``predicted`` may be trusted.
        unpredicted: Why there is no prediction, where there is none.
        reserved: On CUDA, the measured step's reserved peak: judged instead of ``measured``,
            with the allocator's headroom (:data:`RESERVED_HEADROOM`).
        reserved_ratio: On CUDA, the highest reserved/allocated ratio of the real steps seen: a
            verified prediction is scaled by it, with the larger of the two headrooms.
        unverified: What an unverified prediction, or none, means when nothing was measured
            (:data:`Unverified`).

    Returns:
        The verdict, with the rule and the figures in its reason.

    Example:
        >>> admission(budget=1000, headroom=0.02, predicted=990, verified=True).reason
        'predicted 990 B (+2% headroom) > budget 1000 B'
        >>> admission(budget=1000, headroom=0.0, measured=990).admitted
        True
    """
    if measured is not None and reserved is not None:
        needed = reserved_with_headroom(reserved)
        rule = "<=" if needed <= budget else ">"
        reason = (
            f"measured {reserved} B reserved (+{RESERVED_HEADROOM:.0%} headroom: {needed} B) {rule} budget {budget} B"
        )
        return Verdict(admitted=needed <= budget, reason=reason, predicted=None, measured=measured, needed=needed)
    if measured is not None:
        fits = measured <= budget
        rule = "<=" if fits else ">"
        reason = f"measured {measured} B {rule} budget {budget} B"
        return Verdict(admitted=fits, reason=reason, predicted=None, measured=measured, needed=measured)
    measure = unverified == "measure"
    then = ": measured to know" if measure else ""
    if predicted is None:
        why = "" if unpredicted is None else f" ({unpredicted})"
        reason = f"no memory prediction{why}{then}" if measure else f"no memory prediction{why} and not measured"
        return Verdict(admitted=measure, reason=reason, predicted=None, measured=None)
    if not verified:
        never = "" if measure else " and the config was never measured"
        reason = f"predicted {predicted} B, but the prediction is unverified{never}{then}"
        return Verdict(admitted=measure, reason=reason, predicted=predicted, measured=None)
    if reserved_ratio is not None:
        as_reserved = reserved_of(predicted, reserved_ratio)
        margin = max(headroom, RESERVED_HEADROOM)
        needed = reserved_with_headroom(as_reserved, margin)
        rule = "<=" if needed <= budget else ">"
        reason = (
            f"predicted {predicted} B allocated x {reserved_ratio:.4f} reserved/allocated = {as_reserved} B reserved "
            f"(+{margin:.0%} headroom: {needed} B) {rule} budget {budget} B"
        )
        return Verdict(admitted=needed <= budget, reason=reason, predicted=predicted, measured=None, needed=needed)
    needed = round(predicted * (1.0 + headroom))
    rule = "<=" if needed <= budget else ">"
    reason = f"predicted {predicted} B (+{headroom:.0%} headroom) {rule} budget {budget} B"
    return Verdict(admitted=needed <= budget, reason=reason, predicted=predicted, measured=None, needed=needed)
