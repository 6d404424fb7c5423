"""Fine-tuning the policy from a finished study: the study's measured trials calibrate the model's
simulator, the pretrained policy is fine-tuned on it, and the result is saved as a policy
directory (``autotune tune --policy DIR``, ``Adaptive(policy=DIR)``).

A study holds what one model's configurations cost on this machine, measured on the real loop:
throughput and exact peak. The simulator's peaks are already the memory model's (exact to a few
hundred bytes); its time terms come from seven step times in the calibrating process. Refitting
them to the trials (:func:`autotune.envs.fit.fit_time_terms`) makes the simulator agree with the
measurements the study made, so the policy is fine-tuned on a cost model closer to this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.envs.calibration import WorkloadProfile
from autotune.envs.fit import MeasuredConfig, fit_time_terms, throughput_error
from autotune.policies.ppo import Policy, load_policy, write_policy
from autotune.policies.transfer import fine_tune, profile_for_tuning

from autotune.errors import StudyError

if TYPE_CHECKING:
    import optuna

    from autotune.workload import Workload

__all__ = ["MIN_TRIALS", "StudyFineTune", "fine_tune_from_study", "measured_trials"]

#: Measured trials a fit needs: the time model has three linear terms.
MIN_TRIALS = 3
REDUCED = "bf16"  # the reduced precision profile_for_tuning calibrates


@dataclass(frozen=True, kw_only=True)
class StudyFineTune:
    """What :func:`fine_tune_from_study` did: the fit (the simulator's throughput error at the
    trials' configurations, before and after: :func:`autotune.envs.fit.throughput_error`, the
    RMS of log(simulated / measured)) and the saved policy."""

    study: str
    trials: int
    error_before: float
    error_after: float
    profile: WorkloadProfile  # the fitted one
    policy: Policy
    out: Path


def measured_trials(study: optuna.Study, workload: Workload) -> list[MeasuredConfig]:
    """The study's completed trials as measured configurations, checked to be ``workload``'s:
    one rank, no ZeRO, fp32 or bf16 blocks and outer parts (what the simulator's single-rank time
    model covers: selective recompute and the outer precision included)."""
    from autotune.search.cache import workload_fingerprint
    from autotune.search.trial_record import trial_record

    identity = study.user_attrs.get("autotune")
    if not isinstance(identity, dict):
        raise StudyError(f"study {study.study_name!r} was not created by autotune study (no workload stored)")
    if identity.get("workload_fingerprint") != workload_fingerprint(workload):
        raise StudyError(
            f"study {study.study_name!r} measured workload {identity.get('workload')!r}, not {workload.name!r} "
            "(another model, weights, data or batch): fine-tune from a study of this workload"
        )
    n, measured = len(workload.block_names()), []
    for r in map(trial_record, study.get_trials(deepcopy=False)):
        c = r.config
        if r.state != "COMPLETE" or r.status != "ok" or c is None or not r.throughput:
            continue
        if c.ranks == 1 and c.zero_stage == 0 and {*c.block_precisions(n), c.outer_precision} <= {"fp32", REDUCED}:
            measured.append(MeasuredConfig(config=c, throughput=r.throughput))
    if len(measured) < MIN_TRIALS:
        raise StudyError(
            f"study {study.study_name!r} has {len(measured)} completed one-rank trials with a measured throughput; "
            f"fine-tuning from a study needs at least {MIN_TRIALS}"
        )
    return measured


def fine_tune_from_study(
    workload: str,
    *,
    study: str,
    storage: str | None,
    out: Path,
    seconds: float = 30.0,
    seed: int = 0,
    policy: Path | None = None,
) -> StudyFineTune:
    """Fit ``workload``'s simulator to the trials of ``study`` and fine-tune the policy on it.

    ``workload`` is a reference (``gpt-tiny``, ``file.py:build``); the study must have measured
    this very workload (same fingerprint) and hold at least :data:`MIN_TRIALS` completed one-rank
    trials. The model is profiled here (the memory table and the block shares; seconds to tens of
    seconds), its time terms fit to the trials, and the policy (default: the shipped one) fine-tuned
    for ``seconds`` at the study's memory budget, then saved to ``out``. Everything is checked
    before anything is profiled or written: bad input raises :class:`StudyError` or
    :class:`~autotune.errors.ConfigError` and writes nothing.
    """
    from autotune.envs._codec import Levels
    from autotune.envs.costmodel import step_cost

    from autotune.resolve import load_workload
    from autotune.search.storage import load_existing_study

    loaded = load_workload(workload)
    base = load_policy(policy) if policy is not None else load_policy()
    found = load_existing_study(storage, study)
    measured = measured_trials(found, loaded)
    profile = profile_for_tuning(loaded)
    fitted = fit_time_terms(profile, measured)
    budget = found.user_attrs["autotune"].get("memory_budget")
    default_peak = step_cost(fitted, Levels.default_for(fitted.batch_size)).peak_bytes
    fraction = 1.0 if budget is None else budget / default_peak
    tuned = fine_tune(
        base,
        fitted,
        memory_budget=fraction,
        seconds=seconds,
        seed=seed,
        min_micro_batch=loaded.micro_batch_floor,
        start_within_budget=True,  # where the real environment the policy is for starts
    )
    before, after = throughput_error(profile, measured), throughput_error(fitted, measured)
    meta = dict(tuned.metadata)
    meta["fine_tuned"] = {
        **meta.get("fine_tuned", {}),
        "from_study": study,
        "trials": len(measured),
        "throughput_error": {"calibrated": before, "fitted": after},
    }
    write_policy(tuned.network, out, metadata=meta)
    return StudyFineTune(
        study=study,
        trials=len(measured),
        error_before=before,
        error_after=after,
        profile=fitted,
        policy=Policy(network=tuned.network, metadata=meta, directory=out),
        out=out,
    )
