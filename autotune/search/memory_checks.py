"""The memory model's checks a study's trials make, stored on the study for every worker.

The first measured trial of each kind of configuration checks the memory model
(:func:`autotune.memory.check.trial_checks`); :func:`check_by_trial` stores the checks as study
user attributes, and :func:`adopt_checks` takes the ones other workers (or an earlier run) stored.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.config import TrainConfig
from autotune.search.trial_record import ATTR

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna

    from autotune.memory.check import Verification
    from autotune.search.predictor import StudyPredictor
    from autotune.workload import Workload

__all__ = ["MEMORY_CHECK_ATTR", "adopt_checks", "check_by_trial", "stored_checks"]


#: Study user attributes ``memory_check:<device>:<kind>``: the trial that checked the memory model's
#: kind of configuration on that device type (:func:`stored_checks`), seen by every worker.
MEMORY_CHECK_ATTR = "memory_check"


def stored_checks(study: optuna.Study, device_type: str) -> list[Verification]:
    """The memory model's checks the study's trials made on ``device_type``, by any worker or run
    (study user attributes ``memory_check:<device>:<kind>``), in trial order."""
    from autotune.memory.check import Verification

    prefix = f"{MEMORY_CHECK_ATTR}:{device_type}:"
    checks = [Verification.from_dict(v) for k, v in study.user_attrs.items() if k.startswith(prefix)]
    return sorted(checks, key=lambda v: (v.trial if v.trial is not None else -1, v.kind))


def adopt_checks(
    study: optuna.Study,
    workload: Workload,
    predictor: StudyPredictor | None,
    device_type: str,
    note: Callable[[str], None],
) -> None:
    """Take the checks other workers' (or an earlier run's) trials stored, one line per trial."""
    if predictor is None:
        return
    from autotune.memory.check_text import trial_line

    taken = predictor.adopt(workload, stored_checks(study, device_type))
    for number in sorted({v.trial for v in taken if v.trial is not None}):
        note(trial_line([v for v in taken if v.trial == number]))


def check_by_trial(
    study: optuna.Study,
    trial: optuna.trial.FrozenTrial,
    workload: Workload,
    predictor: StudyPredictor,
    device_type: str,
    note: Callable[[str], None],
) -> None:
    """A finished trial's exactly tracked peak as the check of the kinds it is the first of
    (:meth:`StudyPredictor.trial_measured`), stored on the study for its other workers; one line."""
    from autotune.memory.check_text import trial_line

    adopt_checks(study, workload, predictor, device_type, note)  # other workers' first: theirs may be older
    attrs = trial.user_attrs
    peak, config = attrs.get(ATTR.PEAK), attrs.get(ATTR.CONFIG)
    # "over_budget" stops after the tracked step: its peak is as exact as a completed trial's.
    if attrs.get(ATTR.STATUS) not in ("ok", "over_budget") or not isinstance(peak, int) or config is None:
        return
    new = predictor.trial_measured(workload, TrainConfig.from_dict(config), peak, trial=trial.number)
    for v in new:
        study.set_user_attr(f"{MEMORY_CHECK_ATTR}:{v.device}:{v.kind}", v.to_dict())
    if new:
        note(trial_line(new))
