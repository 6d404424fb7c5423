"""The exception hierarchy.

Every error autotune raises on purpose derives from :class:`AutotuneError`, so a caller (the
CLI, an Optuna objective, an environment) can tell a user mistake or an infeasible
configuration from a bug. ``assert`` is reserved for internal invariants.
"""

from __future__ import annotations

__all__ = [
    "AutotuneError",
    "ConfigError",
    "WorkloadError",
    "TrainingError",
    "UnsupportedError",
]


class AutotuneError(Exception):
    """Base class of every error autotune raises deliberately."""


class ConfigError(AutotuneError, ValueError):
    """A configuration value breaks a rule; the message names the field, rule and value."""


class WorkloadError(AutotuneError):
    """A workload reference cannot be resolved, or a workload breaks its contract."""


class TrainingError(AutotuneError):
    """Training under a configuration failed for a reason other than running out of memory.

    The original exception is chained (``__cause__``). Out-of-memory and divergence are not
    errors: :func:`autotune.measure` reports them in the returned ``Measurement``.
    """


class UnsupportedError(AutotuneError):
    """A valid configuration that this build of autotune cannot run yet (says which issue adds it)."""


class SpecError(AutotuneError, ValueError):
    """A study spec (TOML file or command-line flags) breaks a rule; the message names the key, rule and value."""


class StudyError(AutotuneError):
    """A study cannot be created, loaded or joined as asked (storage unreachable, name taken by another study)."""


class MissingDependencyError(AutotuneError, ImportError):
    """An optional dependency is not installed; the message names the package (or extra) to install."""


__all__ += ["SpecError", "StudyError", "MissingDependencyError"]


class PredictionError(AutotuneError):
    """The memory model cannot predict a workload (its fake-tensor profile failed); the message
    says why. Measure the configuration instead."""


class AutotuneWarning(UserWarning):
    """Base class of every warning autotune emits deliberately."""


class PredictionWarning(AutotuneWarning):
    """A memory prediction is not trustworthy: it disagreed with a measured step, or could not be
    made or checked. The message names the workload and the figures."""


__all__ += ["PredictionError", "AutotuneWarning", "PredictionWarning"]
