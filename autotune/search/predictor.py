"""The study's memory predictions: skip configurations predicted not to fit, before measuring them.

The memory model is :mod:`autotune.memory.predict`; ``RunOptions.memory_model`` names another
module with the same ``predict_memory`` (tests plug in a stand-in), or None for no predictions
(every configuration is measured). Whether a prediction fits is the budget gate's rule
(:func:`autotune.memory.gate.admission`, with its headroom), applied by the objective and the
baselines. The contract used::

    predict_memory(workload, config) -> int | <object with .total or .peak_bytes>

the predicted peak tensor bytes on one rank. A prediction only ever *skips* a trial (pruned, with
the predicted bytes in the reason); it never replaces a measurement. A prediction that says it is
not ``verified`` (its profile disagreed with a real step, see ``autotune.memory.check``), or a
workload that cannot be profiled, raises :class:`PredictionError` here instead: the objective
then measures the trial (never prunes it) and records the reason.

Cost: a prediction profiles the model under fake tensors, seconds per call, which is more than
measuring a small model. When the memory model offers the pieces (``plan_of`` naming the
profile modes a config needs, and ``predict_memory(..., profile=)``), one profile is made per
study and reused, grown only when a config needs a mode it lacks; predictions are memoized.
Its checks against real steps run where the study measures (``step``: the measuring child, on
the study's device), never on the host for a GPU study, and stand for that device type only.
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from autotune.config import TrainConfig
from autotune.errors import PredictionError, PredictionWarning
from autotune.memory.check import CheckStep
from autotune.workload import Workload

__all__ = ["MemoryPredictor", "load_memory_predictor", "predicted_bytes"]

#: ``predictor(workload, config) -> predicted peak bytes``.
MemoryPredictor = Callable[[Workload, TrainConfig], int]


def load_memory_predictor(
    module: str = "autotune.memory.predict",
    *,
    device: str = "cpu",
    step: CheckStep | None = None,
    note: Callable[[str], None] | None = None,
) -> MemoryPredictor | None:
    """``predict_memory`` from ``module`` as a memoized bytes-returning function, or None if absent.

    Args:
        module: The memory model's module.
        device: The device type the study measures on: predictions are of it, and verified only
            by checks on it.
        step: Runs a check step where the study measures (its measuring child); None: in this
            process, on ``device``.
        note: Gets one line per profiling phase and check, with its seconds.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    fn = getattr(mod, "predict_memory", None)
    if not callable(fn):
        return None
    return _Predictor(fn, getattr(mod, "plan_of", None), device=device, step=step, note=note)


class _Predictor:
    def __init__(
        self,
        fn: Callable[..., Any],
        plan_of: Callable[..., Any] | None,
        *,
        device: str,
        step: CheckStep | None,
        note: Callable[[str], None] | None,
    ) -> None:
        self.fn = fn
        self.device = device
        self.step = step
        self.note = note
        self.plan_of = plan_of if plan_of is not None and "profile" in inspect.signature(fn).parameters else None
        self.memo: dict[tuple[int, str], int] = {}
        self.profiles: dict[int, Any] = {}  # id(workload) -> the study's reusable profile
        self.failures: dict[int, PredictionError] = {}  # id(workload) -> why it cannot be profiled

    def __call__(self, workload: Workload, config: TrainConfig) -> int:
        key = (id(workload), config.to_json())
        if key not in self.memo:
            if self.plan_of is None:
                prediction = self.fn(workload, config)
            else:
                profile = self._profile(workload, config)
                prediction = self.fn(workload, config, profile=profile, device_type=self.device)
            if getattr(prediction, "verified", True) is False:
                # The profile already warned, once, with the figures; every trial says why it
                # was measured instead of judged by the prediction.
                check = getattr(prediction, "verification", None)
                reason = getattr(check, "reason", None) or "its profile was not checked against a real step"
                raise PredictionError(f"unverified memory prediction for {workload.name!r}: {reason}")
            self.memo[key] = predicted_bytes(prediction)
        return self.memo[key]

    def _profile(self, workload: Workload, config: TrainConfig) -> Any:
        from autotune.memory.predict import profile_memory

        assert self.plan_of is not None
        needed = set(self.plan_of(config, num_blocks=len(workload.block_names())).modes)
        current = self.profiles.get(id(workload))
        have = set(current.modes) if current is not None else set()
        if id(workload) in self.failures:
            raise self.failures[id(workload)]
        if not needed <= have:
            modes = tuple(sorted(needed | have))
            try:
                # Profiled and checked once per workload, mode and kind of configuration: a
                # profile grown later for a new mode runs only that mode's passes and checks.
                current = profile_memory(
                    workload, modes=modes, reuse=current, device=self.device, step=self.step, note=self.note
                )
            except PredictionError as e:
                warnings.warn(PredictionWarning(f"{e}; configurations will be measured, not pruned."), stacklevel=3)
                self.failures[id(workload)] = e
                raise
            self.profiles[id(workload)] = current
        return current


def predicted_bytes(prediction: Any) -> int:
    """Bytes from whatever the memory model returns: an int, or an object with ``peak_bytes`` /
    ``total``."""
    for attr in ("peak_bytes", "total"):
        value = getattr(prediction, attr, None)
        if isinstance(value, int):
            return value
    if isinstance(prediction, int) and not isinstance(prediction, bool):
        return prediction
    raise TypeError(f"predict_memory returned {type(prediction).__name__}; expected bytes or .total/.peak_bytes")
