"""What an adaptive run measured of each configuration: its timed steps, and its judged record.

The :class:`~autotune.adapt.decider.Decider` owns one :class:`Ledger`; its rules
(:mod:`autotune.adapt.rules`) and a side-by-side trial's verdict (:mod:`autotune.adapt.side_by_side`) read it.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING, Any

from autotune.adapt.records import ConfigRecord
from autotune.adapt.sources import Observation
from autotune.measurement.objective import ObjectiveName, Score, score
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotune.config import TrainConfig
    from autotune.memory.gate import BudgetGate

__all__ = ["Ledger"]


class Ledger:
    """The timed steps and the judged records of an adaptive run's configurations.

    Args:
        gate: The run's budget gate: a configuration's known peak (measured, or a verified
            prediction) and the budget.
        base_batch_size: The user's effective batch.
        adapt_batch: Whether the batch is a knob (then a record is judged by goodput).
    """

    def __init__(self, *, gate: BudgetGate, base_batch_size: int, adapt_batch: bool) -> None:
        self.gate = gate
        self.base_batch_size = base_batch_size
        self.adapt_batch = adapt_batch
        self.judged: dict[TrainConfig, ConfigRecord] = {}
        self.recent: list[float] = []  # samples/s of the timed steps since the last change
        self.timed: dict[TrainConfig, list[float]] = {}  # the same, of every stint under each config

    def add(self, config: TrainConfig, throughput: float) -> None:
        """Record one timed step of ``config`` (its samples/s)."""
        self.recent.append(throughput)
        self.timed.setdefault(config, []).append(throughput)

    def trusted(self, config: TrainConfig) -> ConfigRecord | None:
        """``config``'s record if its throughput is a median of enough timed steps to act on."""
        record = self.judged.get(config)
        return record if record is not None and record.timed_steps >= TUNING.trusted_steps else None

    def best(self, objective: ObjectiveName) -> ConfigRecord | None:
        """The judged configuration within the budget with the most ``objective``."""
        fits = [r for r in self.judged.values() if r.score.peak_bytes <= self.gate.budget]
        return max(fits, key=lambda r: r.score.under(objective), default=None)

    def judge(self, obs: Observation) -> None:
        """Record ``obs.config``'s objective once its peak is known (measured by a tracked step,
        or a verified prediction where the loop tracks none) and its steps timed: the median
        throughput of its timed steps over every stint the run spent in it, so that the
        configuration the run keeps returning to is not judged by its latest stint alone (on a
        shared machine one stint can time 20% off another, and a latest slow one would make a
        configuration left long ago look like the best)."""
        self.record(obs.config, obs.step, samples=self.timed.get(obs.config, []), b_noise=obs.b_noise)

    def record(
        self, config: TrainConfig, step: int, *, samples: list[float], b_noise: float | None
    ) -> ConfigRecord | None:
        """Judge ``config`` over ``samples`` (samples/s) and keep its record; None if its peak or
        its timing is not known yet."""
        peak = self.gate.known_peak(config)
        if not samples or peak is None:
            return None
        judged = score(
            throughput=statistics.median(samples),
            peak_bytes=peak,
            batch_size=config.effective_batch_size,
            base_batch_size=self.base_batch_size,
            noise_scale=b_noise,
            batch_is_knob=self.adapt_batch,
        )
        # A config judged again keeps its place (dicts keep first insertion order).
        record = ConfigRecord(step=step, config=config, timed_steps=len(samples), noise_scale=b_noise, score=judged)
        self.judged[config] = record
        return record

    def side(self, config: TrainConfig, step: int, samples: list[float]) -> Score:
        """One side of a side-by-side trial judged over its own ``samples``, at the peak of
        ``config``'s record (judged again over every timed step of it), else at the budget."""
        record = self.record(config, step, samples=self.timed[config], b_noise=None)
        peak = record.score.peak_bytes if record is not None else self.gate.budget
        return score(
            throughput=statistics.median(samples),
            peak_bytes=peak,
            batch_size=config.effective_batch_size,
            base_batch_size=self.base_batch_size,
            noise_scale=None,
            batch_is_knob=False,
        )

    def observation(
        self, *, step: int, config: TrainConfig, b_noise: float | None, losses: tuple[float, ...]
    ) -> Observation:
        """The run as measured since the last change (see :meth:`Decider.observation`)."""
        peak = self.gate.measured.get(config)
        if peak is None:
            predicted = self.gate.predict(config)
            peak = predicted[0] if predicted is not None else self.gate.budget
        throughput = statistics.median(self.recent) if self.recent else 0.0
        return Observation(
            step=step, config=config, throughput=throughput, peak_bytes=peak, b_noise=b_noise, losses=losses
        )

    def load(self, state: Mapping[str, Any]) -> None:
        """Continue from the ``judged``, ``recent`` and ``timed`` entries of :meth:`Decider.state_dict`."""
        from autotune.config import TrainConfig

        records = [ConfigRecord.from_dict(r) for r in state["judged"]]
        self.judged = {r.config: r for r in records}
        self.recent = list(state["recent"])
        self.timed = {TrainConfig.from_dict(t["config"]): list(t["samples"]) for t in state["timed"]}
