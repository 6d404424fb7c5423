"""``tune``'s baselines: the study's PyTorch default and HF recipes measured at the episode's budget.

:func:`measure_baselines` finds, for each, the largest micro-batch within the budget (the study's
retry, :mod:`autotune.search.baselines`: one implementation of the baselines) and its peak; ``tune``
then re-times those within the budget side by side with its best steps
(:func:`autotune.policies.episode.retime_best`, ``beside``), so the recommendation's ratios come
from one interleaved run (:meth:`TunedBaseline.with_timing`). A baseline over the budget keeps its
measured peak and is compared with nothing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.objective import DEFAULT_OBJECTIVE, GIB, per_gib
from autotune.measurement.progress import phase_line
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.config import TrainConfig
    from autotune.knobs import Knobs
    from autotune.measurement.objective import ObjectiveName
    from autotune.measurement.sidebyside import Timing
    from autotune.search.space import SearchSpace
    from autotune.workload import Workload

__all__ = ["TunedBaseline", "measure_baselines"]

#: ``status(message)``: a context shown while a long part runs (a console spinner in the CLI).
Status = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True, kw_only=True)
class TunedBaseline:
    """One of the study's baselines measured on the workload after the episode, to compare with.

    Attributes:
        name: ``"pytorch-default"`` or ``"hf-recipe"`` (:mod:`autotune.search.baselines`).
        config: The configuration measured: the baseline at the largest micro-batch that fit the
            episode's budget (the whole batch first, as the study's objective retries).
        throughput: Its samples/s in its own measurement, or None where no micro-batch of it fit
            or it failed.
        peak_bytes: Its measured peak, or None where nothing was measured.
        reason: Why it is infeasible (None when it ran within the budget).
        within_budget: True where it ran within the budget, False where its peak was over it at
            every micro-batch, None where it failed before a peak was measured.
        retimed_throughput: Its median samples/s re-timed side by side with the episode's best
            steps, None where it was not (over the budget, or no re-timing).
        retimed_spread: That median's relative spread (median absolute deviation / median).

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.policies.tune import TunedBaseline
        >>> config = TrainConfig(micro_batch_size=32)
        >>> TunedBaseline(name="pytorch-default", config=config, throughput=64.0, peak_bytes=2**30).per_gib
        64.0
    """

    name: str
    config: TrainConfig
    throughput: float | None
    peak_bytes: int | None
    reason: str | None = None
    within_budget: bool | None = True
    retimed_throughput: float | None = None
    retimed_spread: float | None = None

    @property
    def per_gib(self) -> float | None:
        """Samples/s per GiB of its peak, None where it is infeasible."""
        if self.throughput is None or not self.peak_bytes:
            return None
        return per_gib(self.throughput, self.peak_bytes)

    @property
    def retimed_per_gib(self) -> float | None:
        """Its re-timed samples/s per GiB of its peak, None where it was not re-timed."""
        if self.retimed_throughput is None or not self.peak_bytes:
            return None
        return per_gib(self.retimed_throughput, self.peak_bytes)

    def scale(self, objective: ObjectiveName) -> float:
        """What turns its samples/s into the value ``objective`` compares: 1 / GiB of its peak, or 1."""
        assert self.peak_bytes, "only a baseline with a measured peak is re-timed"
        return GIB / self.peak_bytes if objective == "per-gib" else 1.0

    def value(self, objective: ObjectiveName, *, retimed: bool) -> float | None:
        """Its value under ``objective`` (per GiB, or samples/s), re-timed or its own measurement."""
        if retimed:
            return self.retimed_per_gib if objective == "per-gib" else self.retimed_throughput
        return self.per_gib if objective == "per-gib" else self.throughput

    def with_timing(self, timing: Timing) -> TunedBaseline:
        """This baseline with its side-by-side timing."""
        return dataclasses.replace(self, retimed_throughput=timing.median, retimed_spread=timing.relative_spread)

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: every field (the configuration as its JSON dict) and both per-GiB values."""
        return {
            "name": self.name,
            "config": self.config.to_dict(),
            "throughput": self.throughput,
            "peak_bytes": self.peak_bytes,
            "per_gib": self.per_gib,
            "within_budget": self.within_budget,
            "reason": self.reason,
            "retimed_throughput": self.retimed_throughput,
            "retimed_spread": self.retimed_spread,
            "retimed_per_gib": self.retimed_per_gib,
        }


def measure_baselines(
    workload: Workload,
    *,
    budget: int,
    device: str | None,
    show: Status,
    say: Callable[[str], None],
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> tuple[TunedBaseline, ...]:
    """The study's PyTorch default and HF recipes (:func:`autotune.search.baselines.baselines`: one
    implementation; the bf16-only one under the ``"throughput"`` ``objective``) at the workload's
    batch, each measured at its whole batch first and, while over ``budget``, the next smaller
    micro-batch (the study's retry), one line each.

    Args:
        workload: The workload to measure them on (one rank).
        budget: The episode's budget in bytes.
        device: Where the loop runs (None: CUDA when available).
        show: Shows which baseline is being measured.
        say: Gets one line per baseline: its configuration and samples/s and peak, or why infeasible.
        objective: What the tuned run ranks by: which HF recipes are its baselines.

    Returns:
        The PyTorch default, then the HF recipe (bf16; its checkpointing alone on a model held in
        16 bits), then under ``"throughput"`` the HF bf16-only recipe.
    """
    from autotune.config import TrainConfig
    from autotune.search.baselines import RETRIED, baselines
    from autotune.search.space import SearchSpace

    space = SearchSpace(
        batch_sizes=(workload.batch_size,),
        # Both baselines hold every block or none: the ranking does not change them.
        ranking=tuple(range(len(workload.block_names()))),
        max_micro_batch=workload.dataset_size or workload.batch_size,
        min_micro_batch=workload.micro_batch_floor,
        base=TrainConfig(),
    )
    out = []
    held = workload.held_in_16_bits is not None
    for b in baselines(space, batch_size=workload.batch_size, held=held, objective=objective):
        if b.name not in RETRIED:
            continue
        start = time.perf_counter()
        with show(f"measuring the baseline {b.name}"):
            result = _largest_within(workload, space, b.name, b.knobs, budget=budget, device=device)
        if result.within_budget:
            what = f"{result.throughput:.1f} samples/s, peak {format_bytes(result.peak_bytes)}"
        else:
            what = f"infeasible: {result.reason}"
        say(phase_line(f"baseline {b.name} measured: {result.config.describe()}: {what}", start))
        out.append(result)
    return tuple(out)


def _largest_within(
    workload: Workload, space: SearchSpace, name: str, knobs: Knobs, *, budget: int, device: str | None
) -> TunedBaseline:
    """``knobs`` measured at its micro-batch and, while over ``budget``, the next smaller one."""
    from autotune.errors import TrainingError
    from autotune.measurement.schedule import measure_local
    from autotune.search.baselines import smaller_micro_batch

    point: Knobs | None = knobs
    result = TunedBaseline(name=name, config=space.config(knobs), throughput=None, peak_bytes=None)
    while point is not None:
        config = space.config(point)
        try:
            m = measure_local(workload, config, steps=4, warmup=1, memory_budget=budget, device=device)
        except TrainingError as e:  # bf16 this machine cannot run (oneDNN's LSTM on AVX2)
            reason = str(e).splitlines()[0]
            return TunedBaseline(
                name=name, config=config, throughput=None, peak_bytes=None, reason=reason, within_budget=None
            )
        if m.ok:
            return TunedBaseline(name=name, config=config, throughput=m.throughput, peak_bytes=m.peak_bytes)
        over = m.status == "over_budget"
        result = TunedBaseline(
            name=name,
            config=config,
            throughput=None,
            peak_bytes=m.peak_bytes,
            reason=m.reason,
            within_budget=False if over else None,
        )
        point = smaller_micro_batch(space, point) if over else None
    return result
