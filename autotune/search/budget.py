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

__all__ = ["admits", "known_peak"]


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
