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
``selective=True`` (a study whose space recomputes blocks selectively) adds the runs with every
block recomputed selectively to each mode from the first profile on: two more fake runs per
mode (six instead of four), paid only where the space can produce a selective configuration;
a selective configuration in another study (an enqueued one) grows each mode by them then.
Its checks against real steps run where the study measures (``step``: the measuring child, on
the study's device), never on the host for a GPU study, and stand for that device type only.

``lazy=True`` (a study's): no check step runs. A study's trials are real steps already, each
tracked exactly: a measured trial of a configuration the model predicted checks the kinds it uses
that no check covered yet (:meth:`StudyPredictor.trial_measured`,
:func:`autotune.memory.check.trial_checks`), and until then predictions of those kinds are
unverified (measured, never pruned). Which kinds a configuration uses is known from its plan
alone, so such a prediction takes no profile: a study's setup (its baselines' predictions)
profiles nothing before a trial ran, and a kind's modes are profiled when its first measured
trial needs its prediction to check it. A workload whose data is not of one shape
(:attr:`autotune.worst_case.WorstCase.uniform`) is checked by check steps as before: a
trial's tracked step need not run at the worst case the model predicts.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import PredictionError, PredictionWarning
from autotune.memory.check import CheckStep, Verification
from autotune.memory.check_text import not_chain_message
from autotune.workload import Workload

if TYPE_CHECKING:
    from autotune.memory.profile_record import MemoryProfile

__all__ = ["MemoryPredictor", "StudyPredictor", "load_memory_predictor", "predicted_bytes"]

#: ``predictor(workload, config) -> predicted peak bytes``.
MemoryPredictor = Callable[[Workload, TrainConfig], int]


def load_memory_predictor(
    module: str = "autotune.memory.predict",
    *,
    device: str = "cpu",
    step: CheckStep | None = None,
    note: Callable[[str], None] | None = None,
    lazy: bool = False,
    selective: bool = False,
) -> StudyPredictor | None:
    """``predict_memory`` from ``module`` as a memoized bytes-returning function, or None if absent.

    Args:
        module: The memory model's module.
        device: The device type the study measures on: predictions are of it, and verified only
            by checks on it.
        step: Runs a check step where the study measures (its measuring child); None: in this
            process, on ``device``.
        note: Gets one line per profiling phase and check, with its seconds.
        lazy: Run no check step (where the workload's data is of one shape): the study's
            measured trials check the kinds instead (:meth:`StudyPredictor.trial_measured`).
        selective: Profile the selective recompute level with every mode (the study's space
            can produce it): two more fake runs per mode.
    """
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    fn = getattr(mod, "predict_memory", None)
    if not callable(fn):
        return None
    return StudyPredictor(
        fn, getattr(mod, "plan_of", None), device=device, step=step, note=note, lazy=lazy, selective=selective
    )


class StudyPredictor:
    """A study's memory predictions (:func:`load_memory_predictor`): called as
    ``predictor(workload, config) -> bytes``, raising :class:`PredictionError` where unverified."""

    def __init__(
        self,
        fn: Callable[..., Any],
        plan_of: Callable[..., Any] | None,
        *,
        device: str,
        step: CheckStep | None,
        note: Callable[[str], None] | None,
        lazy: bool = False,
        selective: bool = False,
    ) -> None:
        self.fn = fn
        self.selective = selective
        self.device = device
        self.step = step
        self.note = note
        self.lazy = lazy
        self.plan_of = plan_of if plan_of is not None and "profile" in inspect.signature(fn).parameters else None
        self.memo: dict[tuple[int, str], int] = {}
        self.predicted: dict[tuple[int, str], int] = {}  # every prediction's bytes, verified or not
        self.checks: dict[int, tuple[Verification, ...]] = {}  # id(workload) -> checks made by trials
        self.profiles: dict[int, Any] = {}  # id(workload) -> the study's reusable profile
        self.failures: dict[int, PredictionError] = {}  # id(workload) -> why it cannot be profiled

    def __call__(self, workload: Workload, config: TrainConfig) -> int:
        key = (id(workload), config.to_json())
        if key not in self.memo:
            awaited = self._awaited(workload, config)
            if awaited is not None:
                # Unverified whatever the profile says: no profile is taken for it (a study's
                # setup predicts its baselines before any trial could have checked a kind).
                raise PredictionError(f"unverified memory prediction for {workload.name!r}: {awaited}")
            prediction = self._predict(workload, config)
            if getattr(prediction, "verified", True) is False:
                # The profile already warned, once, with the figures; every trial says why it
                # was measured instead of judged by the prediction.
                check = getattr(prediction, "verification", None)
                reason = getattr(check, "reason", None) or (
                    self._unchecked if self._lazy(workload) else "its profile was not checked against a real step"
                )
                raise PredictionError(f"unverified memory prediction for {workload.name!r}: {reason}")
            self.memo[key] = predicted_bytes(prediction)
        return self.memo[key]

    def unverified(self, workload: Workload, config: TrainConfig) -> int | None:
        """The memory model's bytes for ``config`` whether or not a measured trial has checked its
        kind, from the profile taken so far only (None where it lacks ``config``'s runs: no fake
        run is made for a hint): where a baseline starts (:func:`autotune.search.budget.far_over`),
        never a verdict on a trial."""
        from autotune.errors import AutotuneError

        key = (id(workload), config.to_json())
        if key in self.predicted:
            return self.predicted[key]
        profile = self.profile_of(workload)
        if self.plan_of is None or profile is None:
            return None
        try:  # given a profile the memory model profiles nothing: one lacking the runs is a ConfigError
            return predicted_bytes(self.fn(workload, config, profile=profile, device_type=self.device))
        except AutotuneError:
            return None

    @property
    def _unchecked(self) -> str:
        return f"no measured trial on {self.device} has checked its kind of configuration yet"

    def _predict(self, workload: Workload, config: TrainConfig) -> Any:
        """The memory model's prediction of ``config`` (profiling where needed), its bytes kept."""
        if self.plan_of is None:
            prediction = self.fn(workload, config)
        else:
            profile = self._profile(workload, config)
            prediction = self.fn(workload, config, profile=profile, device_type=self.device)
        self.predicted[(id(workload), config.to_json())] = predicted_bytes(prediction)
        return prediction

    def _awaited(self, workload: Workload, config: TrainConfig) -> str | None:
        """Why a lazily checked ``config``'s prediction is unverified before any profile: it uses a
        kind no measured trial on this device checked (:func:`~autotune.memory.check.kinds_of`
        reads its plan); None where every kind was checked, or checks are not lazy."""
        from autotune.memory.check import kinds_of
        from autotune.memory.check_text import unchecked_reason

        if not self._lazy(workload):
            return None
        assert self.plan_of is not None
        plan = self.plan_of(config, num_blocks=len(workload.block_names()), device_type=self.device)
        checked = {v.kind for v in self.held(workload) if v.device == self.device}
        missing = [k for k in kinds_of(plan) if k not in checked]
        if not missing:
            return None
        # As the memory model says it once a kind is checked; before any, what the study waits for.
        return unchecked_reason(missing[0], self.device) if checked else self._unchecked

    def _profile(self, workload: Workload, config: TrainConfig) -> Any:
        from autotune.memory.predict import profile_memory

        assert self.plan_of is not None
        plan = self.plan_of(config, num_blocks=len(workload.block_names()))
        needed = set(plan.modes)
        current = self.profiles.get(id(workload))
        have = set(current.modes) if current is not None else set()
        # The selective runs: with every mode where the space can produce the level, else once a
        # configuration needs them (every mode then profiled again with them).
        held = current is not None and all(mode.selective is not None for mode in current.modes.values())
        selective = self.selective or "selective" in plan.recompute or held
        if id(workload) in self.failures:
            raise self.failures[id(workload)]
        if not needed <= have or (selective and not held):
            modes = tuple(sorted(needed | have))
            lazy = self._lazy(workload)
            try:
                # Profiled and checked once per workload, mode and kind of configuration: a
                # profile grown later for a new mode runs only that mode's passes and checks.
                grown = profile_memory(
                    workload,
                    modes=modes,
                    selective=selective,
                    reuse=current,
                    verify=not lazy,
                    device=self.device,
                    step=self.step,
                    note=self.note,
                )
            except PredictionError as e:
                warnings.warn(PredictionWarning(f"{e}; configurations will be measured, not pruned."), stacklevel=3)
                self.failures[id(workload)] = e
                raise
            if lazy:  # the trials' checks, kept here: an unchecked profile holds none
                message = not_chain_message(workload.name, grown) if current is None else None
                if message is not None:
                    warnings.warn(PredictionWarning(message), stacklevel=3)
                grown = dataclasses.replace(grown, checks=self.checks.get(id(workload), ()))
            current = grown
            self.profiles[id(workload)] = current
        return current

    def profile_ahead(self, workload: Workload, configs: Sequence[TrainConfig], *, until: Callable[[], bool]) -> None:
        """Take the profile modes ``configs`` use, in their order, before any prediction needs them,
        one configuration at a time while ``until()`` is False (a lazily checked study's, while its
        measuring child builds the workload: its first trials then find the modes taken). Only
        fake runs: no check step, none of them waits on the child. A workload the fake runs cannot
        go through warns here, once, as its first prediction would have."""
        if self.plan_of is None or not self._lazy(workload):
            return
        for config in configs:
            if until():
                return
            try:
                self._profile(workload, config)
            except PredictionError:
                return

    def _lazy(self, workload: Workload) -> bool:
        """Whether ``workload``'s kinds wait for measured trials instead of check steps: lazily,
        and only where any step runs at the profile's shapes (data of one shape)."""
        if not self.lazy or self.plan_of is None:
            return False
        return workload.worst_case.uniform

    def profile_of(self, workload: Workload) -> MemoryProfile | None:
        """The memory model's profile of ``workload`` taken so far (None: none yet, or another
        memory model's), e.g. for the policy's proposal to build on
        (:class:`autotune.search.enqueue.Proposer`)."""
        from autotune.memory.profile_record import MemoryProfile

        profile = self.profiles.get(id(workload))
        return profile if isinstance(profile, MemoryProfile) else None

    def held(self, workload: Workload) -> tuple[Verification, ...]:
        """The checks measured trials made of ``workload``'s kinds, here or adopted."""
        return self.checks.get(id(workload), ())

    def adopt(self, workload: Workload, checks: Sequence[Verification]) -> tuple[Verification, ...]:
        """Take checks other processes' trials made (a study's other workers, an earlier run of it),
        of kinds on this device none here has checked yet. Returns those taken."""
        if not self._lazy(workload):
            return ()
        have = {v.kind for v in self.held(workload)}
        taken = tuple(v for v in checks if v.device == self.device and v.kind not in have)
        if taken:
            self._add(workload, taken)
        return taken

    def trial_measured(
        self, workload: Workload, config: TrainConfig, measured: int, *, trial: int
    ) -> tuple[Verification, ...]:
        """Record a trial's measured peak (its exact tracked step, on this predictor's device type)
        as the check of the kinds ``config`` uses that none checked yet
        (:func:`autotune.memory.check.trial_checks`), where the model predicted ``config``.

        Warns (:class:`PredictionWarning`) for a kind the trial finds off, as a failed check step
        does; from then on predictions of the new kinds are verified, or stay unverified with its
        figures. A trial on ranks or under ZeRO is not a check step's run (one local process), nor
        is one of a workload whose data is not of one shape. Returns the new checks (``()``: none).
        """
        from autotune.memory.check import trial_checks
        from autotune.memory.check_text import unverified_message

        key = (id(workload), config.to_json())
        if not self._lazy(workload) or config.ranks != 1 or config.zero_stage != 0 or measured <= 0:
            return ()
        if key not in self.predicted:  # not profiled before the trial (its kinds awaited one): now
            try:
                self._predict(workload, config)
            except PredictionError:  # the model cannot profile it: said once, nothing to check
                return ()
        profile = self.profiles.get(id(workload))
        assert self.plan_of is not None and profile is not None
        plan = self.plan_of(config, num_blocks=len(workload.block_names()), device_type=self.device)
        new = trial_checks(profile, config, plan, self.predicted[key], measured, trial=trial, device=self.device)
        if new:
            self._add(workload, new)
            if not new[0].verified:
                warnings.warn(PredictionWarning(unverified_message(workload.name, new[0])), stacklevel=2)
        return new

    def _add(self, workload: Workload, checks: Sequence[Verification]) -> None:
        self.checks[id(workload)] = (*self.held(workload), *checks)
        profile = self.profiles.get(id(workload))
        if profile is not None:
            self.profiles[id(workload)] = dataclasses.replace(profile, checks=self.checks[id(workload)])


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
