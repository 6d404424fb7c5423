"""A response surface over a study's measured trials: where a refinement trial may jump to.

A short study's refinement climbs one knob one step at a time from its incumbent
(:mod:`autotune.search.refine`), and the best configuration can be more moves away than the study
has refinement trials left. The knobs act on throughput and on the peak in directions known in
advance, so a model with four coefficients per quantity, fitted by least squares on the trials a
study has measured, already points at the far corner (response surface methodology: Box and
Wilson, "On the experimental attainment of optimum conditions", JRSS B 13(1), 1951)::

    log objective = b0 + b1 log2(micro) + b2 low/L + b3 recomputed/L
    peak          = c0 + micro (c1 + c2 low/L + c3 recomputed/L)

with L blocks, ``low`` of them in reduced precision and ``recomputed`` checkpointed. Throughput
moves by a factor per doubling of the micro-batch and per share of blocks in bf16 or recomputed;
the peak is a fixed part (parameters, gradients, optimizer state) plus activations that grow with
the micro-batch and shrink with recompute and reduced precision. Where the memory model has a
verified prediction for every candidate, its peaks replace the fitted ones (the refinement never
mixes the two: see :meth:`autotune.search.refine.Refine`); where it has some, they bound the
fitted peaks: a point's peak lies between its verified peaks with every block recomputed and with
none (recompute lowers the peak, never below recomputing all), because a straight line through
the measured points can put the far corner below what the memory model knows it holds. The
surface only proposes: the trial measures, and the finalists' re-timing decides.

A knob that did not vary among the measured points has no coefficient; points that would move it
get no estimate. Fewer points than :data:`MIN_POINTS` give no surface.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.knobs import Knobs
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, objective_value, per_gib

__all__ = ["MIN_POINTS", "Estimate", "Surface", "fit_surface", "ranked"]

#: Measured points a surface needs: two more than its coefficients, so a fit is never exact by
#: construction (nine trials precede a 12-trial study's refinement).
MIN_POINTS = 6


def _features(knobs: Knobs, num_blocks: int) -> tuple[float, float, float]:
    return (
        math.log2(knobs.micro_batch_size),
        knobs.low_precision_blocks / num_blocks,
        knobs.checkpoint_blocks / num_blocks,
    )


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """A point's estimated objective, peak and objective per GiB."""

    knobs: Knobs
    objective: float
    peak_bytes: float
    per_gib: float

    def under(self, objective: ObjectiveName) -> float:
        """What ``objective`` ranks the point by (:func:`~autotune.measurement.objective.objective_value`)."""
        return objective_value(self.objective, round(self.peak_bytes), objective)


@dataclass(frozen=True, kw_only=True)
class Surface:
    """Fitted coefficients. ``varied[i]`` says whether feature i (log2 micro, low share,
    recomputed share) varied among the points; ``fixed[i]`` is its value where it did not."""

    num_blocks: int
    varied: tuple[bool, bool, bool]
    fixed: tuple[float, float, float]
    objective_coef: tuple[float, ...]
    peak_coef: tuple[float, ...]
    points: int

    def covers(self, knobs: Knobs) -> bool:
        """Whether ``knobs`` moves only knobs that varied among the fitted points."""
        f = _features(knobs, self.num_blocks)
        return all(v or math.isclose(x, c) for x, c, v in zip(f, self.fixed, self.varied, strict=True))

    def estimate(
        self, knobs: Knobs, *, peak_bytes: int | None = None, bounds: tuple[int | None, int | None] = (None, None)
    ) -> Estimate | None:
        """``knobs``' estimate (``peak_bytes``: a known peak instead of the fitted one; ``bounds``:
        the least and the most the fitted peak may be); None when the surface does not cover the
        point or its peak is not positive."""
        if not self.covers(knobs):
            return None
        f = _features(knobs, self.num_blocks)
        x = [1.0, *(v for v, keep in zip(f, self.varied, strict=True) if keep)]
        objective = math.exp(float(np.dot(self.objective_coef, x)))
        if peak_bytes is None:
            micro = float(knobs.micro_batch_size)
            shares = [v for v, keep in zip(f[1:], self.varied[1:], strict=True) if keep]
            peak = float(np.dot(self.peak_coef, [1.0, micro, *(micro * s for s in shares)]))
            low, high = bounds
            peak = peak if high is None else min(peak, float(high))
            peak = peak if low is None else max(peak, float(low))
        else:
            peak = float(peak_bytes)
        if peak <= 0:
            return None
        return Estimate(knobs=knobs, objective=objective, peak_bytes=peak, per_gib=per_gib(objective, round(peak)))


def fit_surface(measured: Sequence[tuple[Knobs, float, int]], *, num_blocks: int) -> Surface | None:
    """The least-squares surface through ``measured`` points (knobs, objective, peak bytes), all
    at one effective batch, rank count, ZeRO stage and reduced precision; None with fewer than
    :data:`MIN_POINTS` usable points (a positive objective and peak) or a design that does not
    determine the coefficients."""
    usable = [(k, v, p) for k, v, p in measured if v > 0 and p > 0 and math.isfinite(v)]
    if len(usable) < MIN_POINTS:
        return None
    features = np.array([_features(k, num_blocks) for k, _, _ in usable])
    varied = tuple(bool(np.ptp(features[:, i]) > 0) for i in range(3))
    fixed = tuple(float(features[0, i]) for i in range(3))
    x = np.column_stack([np.ones(len(usable)), features[:, [i for i in range(3) if varied[i]]]])
    micro = np.array([float(k.micro_batch_size) for k, _, _ in usable])
    shares = [features[:, i] for i in (1, 2) if varied[i]]
    xp = np.column_stack([np.ones(len(usable)), micro, *(micro * s for s in shares)])
    if np.linalg.matrix_rank(x) < x.shape[1] or np.linalg.matrix_rank(xp) < xp.shape[1]:
        return None
    b = np.linalg.lstsq(x, np.log([v for _, v, _ in usable]), rcond=None)[0]
    c = np.linalg.lstsq(xp, np.array([float(p) for _, _, p in usable]), rcond=None)[0]
    return Surface(
        num_blocks=num_blocks,
        varied=(varied[0], varied[1], varied[2]),
        fixed=(fixed[0], fixed[1], fixed[2]),
        objective_coef=tuple(float(v) for v in b),
        peak_coef=tuple(float(v) for v in c),
        points=len(usable),
    )


def ranked(
    surface: Surface,
    candidates: Iterable[Knobs],
    *,
    known_peak: Callable[[Knobs], int | None] | None = None,
    peak_bounds: Callable[[Knobs], tuple[int | None, int | None]] | None = None,
    budget_bytes: int | None = None,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> list[Estimate]:
    """The candidates the surface covers whose estimated peak is within ``budget_bytes``, highest
    estimated ``objective`` first: per GiB, or the value itself (candidates' order on a tie).
    ``known_peak`` gives the memory model's verified prediction of a point (None: use the fitted
    peak); ``peak_bounds`` the least and the most a point's fitted peak may be (None for either:
    unbounded)."""
    out = []
    for knobs in candidates:
        estimate = surface.estimate(
            knobs,
            peak_bytes=None if known_peak is None else known_peak(knobs),
            bounds=(None, None) if peak_bounds is None else peak_bounds(knobs),
        )
        if estimate is not None and (budget_bytes is None or estimate.peak_bytes <= budget_bytes):
            out.append(estimate)
    out.sort(key=lambda e: -e.under(objective))
    return out
