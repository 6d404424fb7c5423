"""The checks of an adaptive run's arguments that are its own (the workload checks the rest).

:class:`~autotune.Adaptive` and :meth:`~autotune.Adaptive.on_ranks` run them before anything is
built: a user's mistake is one :class:`~autotune.errors.ConfigError` stating the rule and the value.
"""

from __future__ import annotations

import torch

from autotune.errors import ConfigError
from autotune.measurement.objective import ObjectiveName, check_objective

__all__ = ["check_decisions", "check_int", "check_optimizer", "track_mode"]


def check_int(name: str, value: object, low: int) -> None:
    """Refuse ``value`` unless it is an int (not a bool) of at least ``low``.

    Raises:
        ConfigError: it is not.
    """
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, but got {value!r}.")


def check_optimizer(optimizer: object) -> None:
    """Refuse anything but a ``torch.optim.Optimizer``.

    Raises:
        ConfigError: ``optimizer`` is not one.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"optimizer must be a torch.optim.Optimizer, but got {type(optimizer).__name__}.")


def check_decisions(
    *,
    batch_size: int,
    decide_every: object,
    objective: ObjectiveName,
    min_efficiency: float,
    max_batch_size: int | None,
) -> tuple[ObjectiveName, int]:
    """Check the arguments of the run's decisions, in this order.

    Returns:
        The objective's name and the largest effective batch (default 8 x ``batch_size``).

    Raises:
        ConfigError: ``decide_every`` below 2, an unknown objective, ``min_efficiency`` outside
            (0, 1], or ``max_batch_size`` below ``batch_size``.
    """
    check_int("decide_every", decide_every, 2)
    objective = check_objective(objective)
    if not 0.0 < min_efficiency <= 1.0:
        raise ConfigError(f"min_efficiency must be in (0, 1], but got {min_efficiency!r}.")
    largest = 8 * batch_size if max_batch_size is None else max_batch_size
    check_int("max_batch_size", largest, batch_size)
    return objective, largest


def track_mode(value: object) -> str:
    """``track_memory``'s value as one of ``"all"``, ``"none"``, ``"unverified"``.

    Raises:
        ConfigError: ``value`` is none of the accepted ones.
    """
    modes = {True: "all", False: "none", "all": "all", "unverified": "unverified", "none": "none"}
    if isinstance(value, (bool, str)) and value in modes:
        return modes[value]
    raise ConfigError(f"track_memory must be 'unverified', True or 'all', False or 'none', but got {value!r}.")
