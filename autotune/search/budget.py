"""A point of the study's space judged against its memory budget: through
:func:`autotune.measurement.admission.admission` on the memory model's verified peak
(:func:`admits`, :func:`known_peak`), as the baselines and the refinement ask."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.search.predictor import MemoryPredictor

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.knobs import Knobs
    from autotune.measurement.admission import Verdict
    from autotune.search.prepared import Prepared

__all__ = ["FAR_OVER", "admits", "far_over", "known_peak"]

#: How many times the budget an unchecked prediction must be for a baseline not to start there
#: (:func:`far_over`). The memory model's worst over-prediction measured on a device was 2.07x
#: (GPT-2's attention dropout on an H200, fixed since): a point predicted past 2.5x the budget
#: cannot fit, while one nearer is measured and retried smaller as before.
FAR_OVER = 2.5


def admits(prepared: Prepared, predictor: MemoryPredictor | None) -> Callable[[Knobs], Verdict] | None:
    """The admission rule on a point of the study's space under its budget (:func:`admission`, with
    the gate's headroom for where it runs): its verified prediction judged, and a point without one
    (an unverified prediction, an optional model that failed) admitted to be measured in its trial
    (``unverified="measure"``); None without a model or a budget: every point is measured."""
    budget = prepared.memory_budget
    peak = known_peak(prepared, predictor)
    if peak is None or budget is None:
        return None

    def verdict(knobs: Knobs) -> Verdict:
        from autotune.memory.gate import admission, headroom_for

        config = prepared.space.config(knobs)
        return admission(
            budget=budget, headroom=headroom_for(config), predicted=peak(knobs), verified=True, unverified="measure"
        )

    return verdict


def far_over(prepared: Prepared, predictor: MemoryPredictor | None) -> Callable[[Knobs], bool] | None:
    """Whether a point's prediction, checked by a measured trial or not, is :data:`FAR_OVER` times
    the budget or more: where the baselines that take the largest micro-batch that fits do not
    start (a trial spent over the budget, and on a card of the budget's size an out-of-memory
    error: GPT-2 small's fp32 whole batch is 52 GiB under a 20 GiB budget). None without a budget
    or a predictor that gives unchecked predictions (:meth:`StudyPredictor.unverified`)."""
    budget = prepared.memory_budget
    unverified = getattr(predictor, "unverified", None)
    if budget is None or unverified is None:
        return None

    def hopeless(knobs: Knobs) -> bool:
        peak = unverified(prepared.workload, prepared.space.config(knobs))
        return peak is not None and peak >= FAR_OVER * budget

    return hopeless


def known_peak(prepared: Prepared, predictor: MemoryPredictor | None) -> Callable[[Knobs], int | None] | None:
    """The memory model's verified peak of a point of the study's space, None where it has none
    (an unverified prediction, a model that cannot profile the workload); None without a model."""
    if predictor is None:
        return None

    def peak(knobs: Knobs) -> int | None:
        try:
            return predictor(prepared.workload, prepared.space.config(knobs))
        except Exception:  # an optional model's failure or an unverified prediction: no known peak
            return None

    return peak
