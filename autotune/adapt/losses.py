"""The losses an adaptive run has seen, and its NaN rule.

A non-finite loss (or gradient) stops a run that decides: its decisions, the policy's observation
and the objective would act on it. A run that does not decide warns once and goes on. The
:class:`~autotune.adapt.controller.Controller` owns one :class:`Losses`.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

from autotune.errors import NonFiniteLossError, NonFiniteLossWarning
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from autotune.config import TrainConfig

__all__ = ["Losses"]


class Losses:
    """The recent losses an observation carries (``TUNING.observed_losses`` of them), and whether
    a non-finite one was warned of."""

    def __init__(self) -> None:
        self.recent: list[float] = []
        self._warned_nonfinite = False

    def add(self, loss: float) -> None:
        """Record a step's loss."""
        self.recent = [*self.recent[-(TUNING.observed_losses - 1) :], loss]

    def resume(self, losses: list[float]) -> None:
        """Set the losses of the run so far, on a resume (a non-finite one was warned of before the restart)."""
        self.recent = list(losses)[-TUNING.observed_losses :]
        self._warned_nonfinite = not all(math.isfinite(v) for v in losses)

    def diverged(self, index: int, *, config: TrainConfig, loss: float | None, skipped: bool, decides: bool) -> None:
        """The NaN rule (see :meth:`Controller.diverged`); ``decides``: the run makes decisions.

        Raises:
            NonFiniteLossError: in a run that decides.
        """
        if loss is not None and not math.isfinite(loss):
            what = f"step {index}: the loss is {loss}"
        else:
            what = f"step {index}: a gradient is not finite" + ("" if loss is None else f" (the loss is {loss})")
        what = f"{what} under {config.describe()}"
        if skipped:
            what = f"{what} (its update skipped: the weights and optimizer state are the step before's)"
        if decides:
            raise NonFiniteLossError(f"{what}: an adaptive run stops at a diverged step")
        if not self._warned_nonfinite:
            self._warned_nonfinite = True
            warnings.warn(NonFiniteLossWarning(f"{what}; training goes on"), stacklevel=5)
