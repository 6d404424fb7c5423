"""Opening a study: create it, or load it and check it is this one; resume what a dead process left.

An existing study is checked against this run (objectives, workload, budget, space) before
anything is written (:func:`open_study`). A trial left RUNNING by a process that died on this host
is marked failed and its params enqueued again (:func:`recover_interrupted`). Workers join a study
created beforehand and sample from seeds of their own.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import warnings
from typing import TYPE_CHECKING, Literal

from autotune.errors import StudyError
from autotune.measurement.objective import DEFAULT_OBJECTIVE
from autotune.search.spec import StudySpec, spec_from_dict, spec_to_dict
from autotune.search.storage import open_storage, redact, storage_url
from autotune.search.trial_record import ATTR

if TYPE_CHECKING:
    import optuna

    from autotune.search.study import Prepared, RunOptions

__all__ = ["open_study", "recover_interrupted", "stored_spec"]


_STUDY_ATTR = "autotune"  # study user attribute: what this study is (checked when resuming or joining)
_DIRECTIONS: tuple[Literal["maximize"], Literal["minimize"]] = ("maximize", "minimize")


def open_study(prepared: Prepared, options: RunOptions) -> optuna.Study:
    """Load the study (checking it is this one) or create it
    (:func:`~autotune.search.study.run_study` enqueues the baselines)."""
    import optuna

    storage = open_storage(options.storage)
    name = prepared.study_name
    where = redact(storage_url(options.storage))
    existing = _existing(storage, name)
    if existing is not None:
        _check_same(existing, prepared, where)
        study = optuna.load_study(study_name=name, storage=storage, sampler=_sampler(prepared.spec, options))
        if not options.worker:
            study.set_user_attr("trials", prepared.spec.trials)  # a rerun may ask for more trials
        return study
    if options.worker:
        raise StudyError(
            f"study {name!r} does not exist in {where!r}: create it first (autotune study ... --create-only), "
            "then start the workers"
        )
    study = optuna.create_study(
        study_name=name, storage=storage, directions=list(_DIRECTIONS), sampler=_sampler(prepared.spec, options)
    )
    with warnings.catch_warnings():
        # set_metric_names is experimental since Optuna 3.2 and still is in 5.0: it is the only
        # way to name the objectives in the dashboard, so we accept the interface risk.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(prepared.metric_names))
    study.set_user_attr(_STUDY_ATTR, prepared.identity)
    study.set_user_attr("spec", spec_to_dict(prepared.spec))
    study.set_user_attr("trials", prepared.spec.trials)
    study.set_user_attr("blocks", list(prepared.workload.block_names()))  # for exports without the workload
    study.set_user_attr("largest_parameter", prepared.workload.largest_parameter)  # DeepSpeed's bucket size
    return study


def _existing(storage: optuna.storages.BaseStorage, name: str) -> optuna.study.StudySummary | None:
    import optuna

    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if summary.study_name == name:
            return summary
    return None


def _check_same(existing: optuna.study.StudySummary, prepared: Prepared, where: str) -> None:
    name = prepared.study_name
    directions = tuple(d.name.lower() for d in existing.directions)
    stored = existing.user_attrs.get(_STUDY_ATTR)
    objectives = stored.get("objectives") if isinstance(stored, dict) else None
    if directions != _DIRECTIONS or objectives != list(prepared.metric_names):
        raise StudyError(
            f"study {name!r} already exists in {where!r} with other objectives "
            f"({', '.join(objectives or directions)}); pass --study-name to start another study"
        )
    assert isinstance(stored, dict)
    # A study stored without an objective recommends per GiB (the default, and all there was before).
    stored = {"objective": DEFAULT_OBJECTIVE, **stored}
    for key, value in {"objective": DEFAULT_OBJECTIVE, **prepared.identity}.items():
        if stored.get(key) != value:
            # The fingerprint hashes the weights: a build() that draws them unseeded gives another
            # one on every run, and the user's rerun of the same study is refused.
            seed = (
                "unseeded random weights change the fingerprint on every run (seed them: torch.manual_seed "
                "in build()), or "
                if key == "workload_fingerprint"
                else ""
            )
            raise StudyError(
                f"study {name!r} already exists in {where!r} with another {key.replace('_', ' ')} "
                f"({stored.get(key)!r}, this run: {value!r}); {seed}pass --study-name to start another study"
            )


def _sampler(spec: StudySpec, options: RunOptions) -> optuna.samplers.BaseSampler:
    import optuna

    # Workers draw from distinct seeds, or identical samplers over identical history would
    # propose identical trials on every machine.
    seed = spec.seed + os.getpid() if options.worker else spec.seed
    if spec.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    if spec.sampler == "nsga2":
        # A generation of the default 50 would leave a 20-trial study entirely random.
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, spec.trials // 4)))
    if spec.sampler == "gp":
        return optuna.samplers.GPSampler(seed=seed)
    return optuna.samplers.RandomSampler(seed=seed)


def stored_spec(study: optuna.Study) -> StudySpec:
    """The spec a study was created with (what ``autotune worker`` runs)."""
    data = study.user_attrs.get("spec")
    if not isinstance(data, dict):
        raise StudyError(f"study {study.study_name!r} was not created by autotune study (no spec stored)")
    spec = spec_from_dict(data)
    trials = study.user_attrs.get("trials")
    return dataclasses.replace(spec, trials=trials) if isinstance(trials, int) else spec


def recover_interrupted(study: optuna.Study) -> list[int]:
    """Fail this host's RUNNING trials whose process is gone, and enqueue their params again."""
    from optuna.trial import TrialState

    host = socket.gethostname()
    storage = study._storage  # the public Study has no way to end another process's trial
    recovered = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        pid = t.user_attrs.get(ATTR.PID)
        if t.user_attrs.get(ATTR.HOST) != host or not isinstance(pid, int) or _alive(pid):
            continue
        storage.set_trial_user_attr(t._trial_id, ATTR.INTERRUPTED, True)
        storage.set_trial_user_attr(t._trial_id, ATTR.REASON, f"interrupted: process {pid} ended during the trial")
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        attrs = {ATTR.RETRY_OF: t.number}
        if t.user_attrs.get(ATTR.BASELINE):
            attrs[ATTR.BASELINE] = t.user_attrs[ATTR.BASELINE]
        study.enqueue_trial(t.params, user_attrs=attrs)
        recovered.append(t.number)
    return recovered


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True
