"""One study trial, the function Optuna calls its objective: params -> a measurement -> (throughput, peak).

The score it returns is :func:`autotune.measurement.objective.score`, the objective every searcher
maximizes; this module runs a trial to get there (hence its name: not a second objective).

Per trial: decode the params into a :class:`TrainConfig`; skip it if the memory model predicts it
cannot fit; take the measurement from the cache or measure it in the child process (with a time
limit); store everything on the trial (user attributes, a dashboard note, the constraint); then

* ``ok``: return ``(throughput or goodput, peak MiB)``;
* ``over_budget`` / ``oom`` / ``diverged`` / predicted over budget (the budget gate's rule and
  headroom, :func:`autotune.memory.gate.admission`): ``optuna.TrialPruned`` with
  the reason (infeasible is a result, and the study goes on);
* training error, time limit, crash: :class:`TrialFailed` with the reason (the study catches it).

Multi-objective studies cannot use Optuna's pruners (``trial.report`` raises), so pruning is
raising ``TrialPruned`` ourselves, as Optuna documents for manual pruning.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from autotune.config import TrainConfig
from autotune.errors import MeasurementFailed, TrialFailed
from autotune.knobs import Knobs
from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.objective import score
from autotune.measurement.record import Measurement
from autotune.search.baselines import RETRIED, smaller_micro_batch
from autotune.search.cache import MeasurementCache, cache_key
from autotune.search.predictor import MemoryPredictor
from autotune.search.space import SearchSpace
from autotune.search.trial_record import ATTR, MIB

if TYPE_CHECKING:
    import optuna

    from autotune.workload import Workload

__all__ = ["Measurer", "Objective", "TrialFailed", "set_constraints"]

# Optuna 5's `Trial.set_constraint` writes "constraints:<name>" keys, which optuna-dashboard 0.21
# does not read (checked with optuna 5.0.0); samplers and the dashboard both read the older "constraints" list
# that `constraints_func` (deprecated in Optuna 5) used to write. We write that list ourselves.
_CONSTRAINTS_KEY = "constraints"


class Measurer(Protocol):
    """Anything that measures a config with a time limit (:class:`MeasurementProcess`)."""

    def measure(
        self, config: TrainConfig, *, steps: int, warmup: int, memory_budget: int | None, timeout: float
    ) -> Measurement: ...


def set_constraints(trial: optuna.Trial, values: list[float]) -> None:
    """Store the trial's constraint values (feasible when all <= 0) where dashboard 0.21 reads them."""
    # Trial has no public setter for system attributes; `storage` is public, `_trial_id` is the
    # id every storage call takes (stable since Optuna 1).
    trial.storage.set_trial_system_attr(trial._trial_id, _CONSTRAINTS_KEY, values)


@dataclass(kw_only=True)
class Objective:
    """Callable objective for ``study.optimize``.

    Args:
        space: The search space.
        measurer: Runs measurements (a child process with a time limit).
        workload: The workload (only the memory predictor uses it in this process).
        workload_id: Workload fingerprint, for the cache key.
        machine: Machine fingerprint, for the cache key.
        cache: Measurement cache.
        memory_budget: Peak bytes allowed per rank, or None.
        steps, warmup, trial_timeout: Measurement settings.
        base_batch_size: B0 of the statistical efficiency (the reference batch).
        predictor: Memory model, or None.
        on_start: Called with (trial number, config, baseline name) when a trial starts.
        note: Called with (trial, markdown) to attach a dashboard note, or None.
    """

    space: SearchSpace
    measurer: Measurer
    workload: Workload
    workload_id: str
    machine: str
    cache: MeasurementCache
    memory_budget: int | None
    steps: int
    warmup: int
    trial_timeout: float
    base_batch_size: int
    predictor: MemoryPredictor | None = None
    on_start: Callable[[int, TrainConfig, str | None], None] | None = None
    note: Callable[[optuna.Trial, str], None] | None = None

    def __call__(self, trial: optuna.Trial) -> tuple[float, float]:
        trial.set_user_attr(ATTR.HOST, socket.gethostname())
        trial.set_user_attr(ATTR.PID, os.getpid())
        knobs = self.space.suggest(trial)
        config = self.space.config(knobs)
        trial.set_user_attr(ATTR.CONFIG, config.to_dict())
        baseline = trial.user_attrs.get(ATTR.BASELINE)
        if self.on_start is not None:
            self.on_start(trial.number, config, baseline)
        self._skip_if_predicted_over(trial, config)
        try:
            m = self._measurement(trial, config)
        except MeasurementFailed as e:
            self._finish(trial, config, status="failed", reason=e.reason)
            raise TrialFailed(e.reason) from None
        except KeyboardInterrupt:
            # Optuna ends the trial FAIL; mark it so a resume retries it instead of counting it.
            trial.set_user_attr(ATTR.INTERRUPTED, True)
            trial.set_user_attr(ATTR.REASON, "interrupted (Ctrl-C) during the measurement")
            raise
        return self._judge(trial, knobs, config, m, baseline)

    def _skip_if_predicted_over(self, trial: optuna.Trial, config: TrainConfig) -> None:
        if self.predictor is None or self.memory_budget is None:
            return
        try:
            predicted = self.predictor(self.workload, config)
        except Exception as e:
            # The memory model is an optional add-on developed on its own: whatever it
            # raises, the trial is measured as if there were no model, and the error is recorded.
            trial.set_user_attr(ATTR.PREDICTION_ERROR, f"{type(e).__name__}: {e}")
            return
        trial.set_user_attr(ATTR.PREDICTED, predicted)
        from autotune.memory.gate import admission, headroom_for

        # The gate's rule and headroom (autotune.memory.gate); an unverified prediction raised above
        # and the trial is measured instead, in its isolated child process.
        verdict = admission(
            budget=self.memory_budget, headroom=headroom_for(config), predicted=predicted, verified=True
        )
        if not verdict.admitted:
            set_constraints(trial, [float(predicted - self.memory_budget)])
            self._finish(trial, config, status="predicted_over_budget", reason=verdict.reason)
            import optuna

            raise optuna.TrialPruned(verdict.reason)

    def _measurement(self, trial: optuna.Trial, config: TrainConfig) -> Measurement:
        key = cache_key(
            workload=self.workload_id, machine=self.machine, config=config, steps=self.steps, warmup=self.warmup
        )
        cached = self.cache.get(key, memory_budget=self.memory_budget)
        trial.set_user_attr(ATTR.CACHED, cached is not None)
        if cached is not None:
            return cached
        m = self.measurer.measure(
            config, steps=self.steps, warmup=self.warmup, memory_budget=self.memory_budget, timeout=self.trial_timeout
        )
        self.cache.put(key, workload=self.workload_id, machine=self.machine, measurement=m)
        return m

    def _judge(
        self, trial: optuna.Trial, knobs: Knobs, config: TrainConfig, m: Measurement, baseline: str | None
    ) -> tuple[float, float]:
        import optuna

        peak = m.peak_bytes
        if peak is not None and self.memory_budget is not None:
            set_constraints(trial, [float(peak - self.memory_budget)])
        efficiency = statistical_efficiency(
            batch_size=config.effective_batch_size, base_batch_size=self.base_batch_size, noise_scale=m.noise.b_simple
        )
        attrs = {
            ATTR.THROUGHPUT: m.throughput,
            ATTR.PEAK: peak,
            ATTR.PER_GIB: m.throughput_per_gib,
            ATTR.MEMORY: None if m.memory is None else {k: int(v) for k, v in vars(m.memory).items()},
            ATTR.NOISE_SCALE: m.noise.b_simple,
            ATTR.EFFICIENCY: efficiency,
            ATTR.STEP_SECONDS: m.step_seconds,
        }
        for k, v in attrs.items():
            trial.set_user_attr(k, v)
        if m.allocator is not None:  # what runs out on a GPU, and how hard the allocator worked
            trial.set_user_attr(ATTR.ALLOCATOR, dataclasses.asdict(m.allocator))
        if m.status != "ok" or m.throughput is None or not peak:
            reason = m.reason or m.status
            if baseline in RETRIED and m.status in ("over_budget", "oom"):
                reason += self._retry_smaller(trial, knobs, baseline)
            self._finish(trial, config, status=m.status, reason=reason, m=m)
            raise optuna.TrialPruned(reason)
        # The one objective (goodput only when the batch is a knob): the trial's first value,
        # whose value per GiB picks the recommended trial (results.py).
        s = score(
            throughput=m.throughput,
            peak_bytes=peak,
            batch_size=config.effective_batch_size,
            base_batch_size=self.base_batch_size,
            noise_scale=m.noise.b_simple,
            batch_is_knob=self.space.multi_batch,
        )
        trial.set_user_attr(ATTR.GOODPUT, m.throughput * s.efficiency)
        self._finish(trial, config, status="ok", reason=None, m=m)
        return s.value, peak / MIB

    def _retry_smaller(self, trial: optuna.Trial, knobs: Knobs, baseline: str) -> str:
        """The PyTorch default (or an HF recipe) did not fit: enqueue it again with the next
        smaller micro-batch."""
        name = {"pytorch-default": "PyTorch-default", "hf-recipe": "HF-recipe", "hf-bf16": "HF-bf16-only"}.get(
            baseline, baseline
        )
        smaller = smaller_micro_batch(self.space, knobs)
        if smaller is None:
            return f"; no smaller micro-batch left for the {name} baseline"
        trial.study.enqueue_trial(self.space.params(smaller), user_attrs={ATTR.BASELINE: baseline})
        return f"; the {name} baseline is retried with micro-batch {smaller.micro_batch_size}"

    def _finish(
        self, trial: optuna.Trial, config: TrainConfig, *, status: str, reason: str | None, m: Measurement | None = None
    ) -> None:
        trial.set_user_attr(ATTR.STATUS, status)
        if reason is not None:
            trial.set_user_attr(ATTR.REASON, reason)
        if self.note is not None:
            from autotune.search.notes import trial_note

            self.note(
                trial, trial_note(trial.number, config, status=status, reason=reason, m=m, attrs=trial.user_attrs)
            )
