"""The exception hierarchy.

Every error autotune raises on purpose derives from :class:`AutotuneError`, so a caller (the
CLI, an Optuna objective, an environment) can tell a user mistake or an infeasible
configuration from a bug. ``assert`` is reserved for internal invariants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: errors.py sits below every module, these among them
    from autotune.config import TrainConfig
    from autotune.workload import Workload

__all__ = [
    "AutotuneError",
    "ConfigError",
    "WorkloadError",
    "TrainingError",
    "UnsupportedError",
]


class AutotuneError(Exception):
    """Base class of every error autotune raises deliberately.

    Catch it to tell a user mistake or an infeasible configuration from a bug: anything else that
    escapes autotune is a bug (``assert`` guards only internal invariants). The CLI exits with
    status 2 on it.

    Example:
        >>> from autotune import AutotuneError, TrainConfig
        >>> try:
        ...     TrainConfig(micro_batch_size=0)
        ... except AutotuneError as error:
        ...     print(type(error).__name__)
        ConfigError
    """


class ConfigError(AutotuneError, ValueError):
    """A configuration value breaks a rule; the message names the field, rule and value.

    Raised at construction (:class:`~autotune.TrainConfig`, :class:`~autotune.Adaptive`, the
    callbacks) and by argument checks (:func:`~autotune.measure`'s ``steps``). Also a
    :class:`ValueError`, so code that validates with ``except ValueError`` keeps working.

    Example:
        >>> from autotune import TrainConfig
        >>> TrainConfig(zero_stage=4)
        Traceback (most recent call last):
        ...
        autotune.errors.ConfigError: TrainConfig.zero_stage must be in [0, 3], but got 4.
    """


class WorkloadError(AutotuneError):
    """A workload reference cannot be resolved, or a workload breaks its contract.

    Raised by :func:`~autotune.load_workload` (unknown name, missing file or function, a
    ``build()`` that raised or returned something else) and by :class:`~autotune.Workload`'s
    checks; the message is one line naming the reference and what was expected.

    Example:
        >>> from autotune import load_workload
        >>> load_workload("no-such-model")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        autotune.errors.WorkloadError: unknown workload 'no-such-model': expected a built-in name (...
    """


class TrainingError(AutotuneError):
    """Training under a configuration failed for a reason other than running out of memory.

    The original exception is chained (``__cause__``). Out-of-memory and divergence are not
    errors: :func:`autotune.measure` reports them in the returned ``Measurement`` (its
    ``status``), so a search can go on past them.

    Example:
        >>> from autotune import AutotuneError, TrainingError
        >>> issubclass(TrainingError, AutotuneError)  # one except clause catches every autotune error
        True
    """


class UnsupportedError(AutotuneError):
    """A valid configuration that this build of autotune cannot run where it was asked to.

    The configuration passes :class:`~autotune.TrainConfig`'s checks, but this build, machine or
    entry point cannot run it (a DeepSpeed configuration handed to a one-process measurement, a
    knob a model cannot take); the message says what would run it.

    Example:
        >>> from autotune import TrainConfig, load_workload, predict_memory
        >>> fp16_on_zero = TrainConfig(precision="fp16", zero_stage=1)  # valid, but not on a CPU engine
        >>> predict_memory(load_workload("mlp-digits"), fp16_on_zero, device_type="cpu")
        Traceback (most recent call last):
        ...
        autotune.errors.UnsupportedError: TrainConfig.precision fp16 cannot run on a CPU DeepSpeed engine ...
    """


class SpecError(AutotuneError, ValueError):
    """A study spec (TOML file or command-line flags) breaks a rule; the message names the key, rule and value."""


class StudyError(AutotuneError):
    """A study cannot be created, loaded or joined as asked (storage unreachable, name taken by another study)."""


class MissingDependencyError(AutotuneError, ImportError):
    """An optional dependency is not installed; the message names the package (or extra) to install."""


class ProposalError(AutotuneError):
    """The policy cannot propose a configuration for a workload (it cannot be profiled, or the
    memory model its simulator relies on is off); the message says why. A study goes on without it."""


__all__ += ["SpecError", "StudyError", "MissingDependencyError", "ProposalError"]


class PredictionError(AutotuneError):
    """The memory model cannot predict a workload (its fake-tensor profile failed); the message
    says why. Measure the configuration instead."""


class AutotuneWarning(UserWarning):
    """Base class of every warning autotune emits deliberately."""


class PredictionWarning(AutotuneWarning):
    """A memory prediction is not trustworthy: it disagreed with a measured step, or could not be
    made or checked. The message names the workload and the figures."""


__all__ += ["PredictionError", "AutotuneWarning", "PredictionWarning"]


class NonFiniteLossError(AutotuneError):
    """The loss became NaN or infinite where nothing sound can follow: a policy would act on it,
    or a simulator be calibrated on it. The message names the step and the value. The CLI exits
    with 3 (``autotune tune``, ``autotune train --adapt``); a study prunes the trial instead."""


class NonFiniteLossWarning(AutotuneWarning):
    """A run that makes no decisions (``autotune train`` without ``--adapt``) saw its first NaN or
    infinite loss; the message names the step. It goes on: what to do with a diverged run is the user's."""


class OverBudgetWarning(AutotuneWarning):
    """An adaptive run measured a step over its memory budget (the configuration's prediction was
    off); the message names the configuration, the measured and the budget bytes. Also a framework
    callback's evaluation measured over it (once; the message says what to lower: the training
    configuration stays)."""


__all__ += ["NonFiniteLossError", "NonFiniteLossWarning", "OverBudgetWarning"]


class SessionError(TrainingError):
    """A rank failed, stopped answering or exited, or the session is closed; the session is over."""


class RankFailed(SessionError):
    """A rank's command raised (not a user mistake): which rank, its exception, whether it ran out of memory."""

    def __init__(self, *, rank: int, op: str, type: str, message: str, out_of_memory: bool) -> None:
        super().__init__(f"rank {rank} failed in {op!r}: {type}: {message}")
        self.rank, self.type, self.message, self.out_of_memory = rank, type, message, out_of_memory

    def training_error(self, workload: Workload, config: TrainConfig) -> TrainingError:
        """This failure as what it is to the caller: ``workload`` could not train under ``config``."""
        where = f"training {workload.name!r} failed under {config.describe()} on rank {self.rank}"
        return TrainingError(f"{where}: {self.type}: {self.message}")


class RankTraceback(Exception):
    """A rank's own traceback (its exception lives in another process), chained as the cause.

    Not an :class:`AutotuneError`: it is never raised, only attached as ``__cause__`` of the
    error that is (a :class:`SessionError` or the rank's user error), to show where it began.
    """


class MeasurementFailed(Exception):
    """A measurement ended without a result (training error, time limit, crash): ``reason`` says why.

    Not an :class:`AutotuneError`: it is an expected outcome of a trial, not a user mistake, and
    must not reach the CLI's ``except AutotuneError`` (exit code 2). The objective catches it, marks
    the trial failed with the reason and the study goes on.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class TrialFailed(Exception):
    """A trial that produced no measurement; the study records the reason and goes on.

    Not an :class:`AutotuneError`: Optuna's ``study.optimize(catch=(TrialFailed,))`` catches
    exactly this type, so that any other error raised in a trial (a :class:`WorkloadError`: the
    workload is broken for every config) still stops the study instead of failing every trial.
    """


__all__ += ["SessionError", "RankFailed", "RankTraceback", "MeasurementFailed", "TrialFailed"]


class BatchError(AutotuneError, ValueError):
    """A batch handed to a training step breaks the batch contract (a pytree of tensors sharing a
    leading batch dimension); the message says which tensor and what it got."""


__all__ += ["BatchError"]


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``: how a caught exception of user code is reported as a
    reason (a failed check step, a profile that cannot run, a knob a model cannot take)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


__all__ += ["one_line"]
