"""What a running study tells its progress display (:class:`StudyObserver`)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from autotune.config import TrainConfig

if TYPE_CHECKING:
    import optuna


__all__ = ["StudyObserver"]


class StudyObserver:
    """Hooks for a progress display; the default prints notes to stderr and nothing else."""

    def note(self, message: str) -> None:
        """One line about the study itself (e.g. the policy's proposal, or why there is none)."""
        print(message, file=sys.stderr)

    def trial_started(self, number: int, config: TrainConfig, baseline: str | None) -> None:
        pass

    def trial_finished(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        pass
