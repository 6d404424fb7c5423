"""Running a study: validate, open or create it, enqueue baselines, recover, optimize.

Everything that can be wrong with the input (workload, spec, budget) is checked in
:func:`~autotune.search.prepared.prepare`, before the storage is opened; an existing study is
checked against this run (objectives, workload, budget, space) before anything is written. So bad
input writes nothing. The baselines and the policy's proposal are enqueued by
:mod:`autotune.search.enqueue`, each point judged against the budget by :mod:`autotune.search.budget`.

Resume: rerunning the same command loads the study and runs only the trials still missing. A
trial left RUNNING by a process that died (SIGKILL, power loss) on this host is marked failed
(user attribute ``interrupted``, not counted) and its params enqueued again, so killing a study
loses at most the trial in flight. Workers (``--worker`` / ``autotune worker``) join a study
created beforehand (two processes creating one study at once on a fresh SQLite or PostgreSQL database can crash
one with a unique violation in alembic's tables) and stop
once the study has its number of trials; each may overshoot by the one trial it had started.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.errors import StudyError
from autotune.measurement.cuda_memory import ALLOC_CONF_VAR, alloc_conf_with
from autotune.measurement.progress import since
from autotune.measurement.sidebyside import verdict_words
from autotune.search.baselines import baselines
from autotune.search.budget import admits, known_peak
from autotune.search.cache import MeasurementCache, machine_fingerprint
from autotune.search.enqueue import Proposer, enqueue_baselines, enqueue_proposal
from autotune.search.memory_checks import adopt_checks, check_by_trial
from autotune.search.observer import StudyObserver
from autotune.search.opening import recover_interrupted, stored_spec
from autotune.search.precisions import screen_precisions
from autotune.search.predictor import MemoryPredictor, StudyPredictor, load_memory_predictor
from autotune.search.prepared import Prepared, prepare
from autotune.search.refine import Refine
from autotune.search.selective_screen import screen_selective
from autotune.search.spec import StudySpec
from autotune.search.storage import DEFAULT_ARTIFACTS, DEFAULT_CACHE
from autotune.search.trial_record import ATTR, MIB

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import optuna

    from autotune.measurement.compiled import CompileCheck
    from autotune.memory.check import CheckStep, StepPeak
    from autotune.procs.isolation import MeasurementProcess
    from autotune.search.trial import Objective

__all__ = [
    "Prepared",
    "Proposer",
    "RunOptions",
    "StudyObserver",
    "admits",
    "count_done",
    "enqueue_baselines",
    "enqueue_proposal",
    "known_peak",
    "measuring_ahead",
    "measuring_process",
    "prepare",
    "run_study",
    "study_alloc_conf",
]


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to run, beside what to search (the spec).

    Args:
        storage: ``--storage`` (None: ``studies/autotune.db``).
        cache: Measurement cache file (None: no cache).
        artifact_dir: Where best-config artifacts go.
        device: Device for the measurements (None: auto).
        worker: Join an existing study; never create one.
        create_only: Create the study and enqueue baselines, run no trial.
        dashboard: Save trial notes, the Pareto plot and artifacts for optuna-dashboard.
        memory_model: Module whose ``predict_memory`` skips configs predicted not to fit (None: off).
        propose: The policy's proposal (:class:`Proposer`; the CLI passes the pretrained
            policy's). Whether it is enqueued is the spec's (``StudySpec.policy_proposal``);
            None: no proposal, and a note says so where the spec asks for one.
        compile_check: Time the recommendation eager and ``torch.compile``-d side by side at the
            end (:mod:`autotune.search.compile_pick`); None: only where the study measures on
            CUDA (on the CPU a compile costs a minute or more of the cores).
    """

    storage: str | None = None
    cache: str | Path | None = DEFAULT_CACHE
    artifact_dir: str | Path = DEFAULT_ARTIFACTS
    device: str | None = None
    worker: bool = False
    create_only: bool = False
    dashboard: bool = True
    memory_model: str | None = "autotune.memory.predict"
    propose: Proposer | None = None
    compile_check: bool | None = None


# ---- trials ------------------------------------------------------------------------------------------


def count_done(study: optuna.Study) -> int:
    """Finished trials that count toward ``trials``: interrupted ones do not (they are retried)."""
    from optuna.trial import TrialState

    finished = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(1 for t in study.get_trials(deepcopy=False, states=finished) if not t.user_attrs.get(ATTR.INTERRUPTED))


def measuring_process(spec: StudySpec, options: RunOptions) -> MeasurementProcess:
    """The measuring child a study of ``spec`` run with ``options`` measures in, not launched.
    Launched before :func:`prepare` (``.launch()``), it builds the workload (importing torch and
    the model's libraries, building the model, a warm-up step on the device: ~20 s at GPT-2-small
    size on a GPU host) while this process loads it, and :func:`run_study` measures in it
    (``measurer=``); the caller closes it where no study ran (``.close(grace=0)``: closing twice
    is harmless).

    Example:
        >>> from autotune.search import RunOptions, StudySpec
        >>> measuring_process(StudySpec(workload="mlp-digits"), RunOptions()).source
        'mlp-digits'
    """
    from autotune.procs.isolation import MeasurementProcess
    from autotune.resolve import source_of

    return MeasurementProcess(
        source_of(spec.workload),
        threads=spec.measure.threads,
        device=options.device,
        alloc_conf=study_alloc_conf(spec, options.device),
    )


@contextlib.contextmanager
def measuring_ahead(spec: StudySpec, options: RunOptions) -> Iterator[MeasurementProcess | None]:
    """The study's :func:`measuring_process`, launched on entry, before the caller loads the
    workload, so that its build overlaps the load; hand it to :func:`run_study` (``measurer=``).
    None with ``options.create_only`` (it would measure nothing). Killed on the way out where no
    trial ran in it (the study was complete, or the input was bad); :func:`run_study` has closed
    it already where it ran."""
    if options.create_only:
        yield None
        return
    measurer = measuring_process(spec, options)
    measurer.launch()
    try:
        yield measurer
    finally:
        measurer.close(grace=0)


def run_study(
    prepared: Prepared,
    study: optuna.Study,
    options: RunOptions,
    observer: StudyObserver | None = None,
    *,
    measurer: MeasurementProcess | None = None,
) -> int:
    """Run trials until the study has ``spec.trials`` counted trials (or the timeout). Returns
    the number of trials this process ran. ``measurer``: the study's :func:`measuring_process`,
    launched ahead (None: one is started here); closed on the way out."""
    from autotune.train.local import resolve_device

    observer = observer or StudyObserver()
    spec = prepared.spec
    for line in prepared.notes:
        observer.note(line)
    recover_interrupted(study)
    device_type = resolve_device(options.device).type
    remaining = spec.trials - count_done(study)
    if remaining <= 0 or options.create_only:
        if not options.worker:  # no measuring child: what the memory model is checked by runs here
            setup = _predictor(options, device_type, None, observer, selective=prepared.space.samples_selective)
            adopt_checks(study, prepared.workload, setup, device_type, observer.note)
            _enqueue(study, prepared, setup, observer, options)
        return 0
    assert prepared.workload.source is not None  # load_workload always sets it
    ahead = measurer is not None
    expected = measuring_process(prepared.spec, options)
    if measurer is None:
        measurer = expected
    elif (mismatch := _launched_otherwise(measurer, expected)) is not None:
        measurer.close(grace=0)
        raise StudyError(
            f"run_study: {mismatch}: pass measuring_process(spec, options) of this study's spec and options"
        )
    alloc_conf = study_alloc_conf(spec, options.device)
    machine = machine_fingerprint(threads=spec.measure.threads, device=options.device or "auto", alloc_conf=alloc_conf)
    cache = MeasurementCache(options.cache)
    with measurer:
        start = time.perf_counter()
        measurer.launch()

        def check(config: TrainConfig, predicted: int) -> StepPeak:
            return measurer.check(config, predicted=predicted, timeout=spec.measure.trial_timeout)

        # The memory model is checked by the study's measured trials (each kind by its first), and
        # by check steps in the measuring child, on the study's device, only for data of several shapes.
        predictor = _predictor(options, device_type, check, observer, selective=prepared.space.samples_selective)
        # While the child builds the workload (tens of seconds at real size): the fake-tensor
        # profiles the first trials would wait for.
        _profile_ahead(prepared, predictor, until=measurer.built)
        measurer.start()
        waited = since(start) + (", launched before the workload was loaded" if ahead else "")
        observer.note(f"measuring process ready on {device_type}: workload built, one warm-up step ({waited})")
        where = _Measuring(measurer, device_type, machine, cache)
        return _optimize(prepared, study, options, observer, where, remaining, predictor)


def _launched_otherwise(measurer: MeasurementProcess, expected: MeasurementProcess) -> str | None:
    """How ``measurer`` (launched ahead) differs from the study's own :func:`measuring_process`, or
    None: a child built for another workload, or with other threads, device or allocator settings,
    would measure what the study's cache and machine fingerprint do not say."""
    if measurer.source != expected.source:
        return f"the measuring process builds {measurer.source!r}, but the study measures {expected.source!r}"
    for name in ("threads", "device", "alloc_conf"):
        got, want = getattr(measurer, name), getattr(expected, name)
        if got != want:
            return f"the measuring process was launched with {name}={got!r}, but this study's is {want!r}"
    return None


@dataclass(frozen=True)
class _Measuring:
    """Where a study's trials are measured: the child, its device, the machine and the cache."""

    measurer: MeasurementProcess
    device_type: str
    machine: str
    cache: MeasurementCache


def _optimize(
    prepared: Prepared,
    study: optuna.Study,
    options: RunOptions,
    observer: StudyObserver,
    where: _Measuring,
    remaining: int,
    predictor: StudyPredictor | None,
) -> int:
    """``remaining`` trials in ``where``'s measuring child, then the study's end (re-timing,
    compile check): the number of trials this process ran."""
    from autotune.search.trial import TrialFailed

    spec, measurer, device_type = prepared.spec, where.measurer, where.device_type
    ran = 0

    proposed = True  # the proposal settled (or none is this process's to enqueue)

    def after_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        nonlocal ran, proposed
        ran += 1
        if predictor is not None:  # before the display: its line says what the trial checked
            check_by_trial(study, trial, prepared.workload, predictor, device_type, observer.note)
        observer.trial_finished(study, trial)
        if count_done(study) >= spec.trials:
            study.stop()  # other workers may have finished the rest
        elif not proposed:  # the baselines have run: the policy's proposal is next, on their profile
            reuse = None if predictor is None else predictor.profile_of(prepared.workload)
            proposed = enqueue_proposal(
                study, prepared, options.propose, after_queue=True, reuse=reuse, note=observer.note
            )

    start = time.perf_counter()
    screened = prepared.space.low_precisions
    prepared = screen_precisions(
        prepared, measurer, study=study, cache=where.cache, machine=where.machine, note=observer.note
    )
    if screened:  # a step of each beside fp32 in the child, unless the study or the cache knows
        kept = ", ".join(prepared.space.low_precisions) or "none"
        observer.note(f"reduced precisions screened: {kept} kept ({since(start)})")
    prepared = screen_selective(prepared, observer.note)
    adopt_checks(study, prepared.workload, predictor, device_type, observer.note)
    if not options.worker:
        proposed = _enqueue(study, prepared, predictor, observer, options, after_queue=True)
    study.optimize(
        _objective(prepared, options, observer, where, predictor),
        n_trials=remaining,
        timeout=spec.timeout,
        catch=(TrialFailed,),
        callbacks=[after_trial, _refine(prepared, measurer, predictor, observer)],
        gc_after_trial=False,
    )
    if count_done(study) >= spec.trials and spec.retime:
        _retime(study, measurer, spec, observer)
    if count_done(study) >= spec.trials and _compile_wanted(options.compile_check, device_type):
        _check_compile(study, measurer, spec, prepared.memory_budget, observer)
    return ran


def _refine(
    prepared: Prepared, measurer: MeasurementProcess, predictor: StudyPredictor | None, observer: StudyObserver
) -> Refine:
    """The study's last trials, the untried neighbours of its best (:mod:`autotune.search.refine`)."""
    spec = prepared.spec

    def duel(configs: list[TrainConfig], scales: list[float]) -> Any:
        return measurer.retime(configs, scales=scales, timeout=len(configs) * spec.measure.trial_timeout)

    return Refine(
        space=prepared.space,
        trials=spec.trials,
        admits=admits(prepared, predictor),
        counted=count_done,
        note=observer.note,
        known_peak=known_peak(prepared, predictor),
        budget_bytes=prepared.memory_budget,
        duel=duel if spec.retime else None,  # no re-timing asked: first measurements decide
    )


def _objective(
    prepared: Prepared,
    options: RunOptions,
    observer: StudyObserver,
    where: _Measuring,
    predictor: StudyPredictor | None,
) -> Objective:
    """The function Optuna calls for each trial (:class:`autotune.search.trial.Objective`)."""
    from autotune.search.dashboard import note_saver
    from autotune.search.trial import Objective

    spec = prepared.spec
    return Objective(
        space=prepared.space,
        measurer=where.measurer,
        workload=prepared.workload,
        workload_id=prepared.fingerprint,
        machine=where.machine,
        cache=where.cache,
        memory_budget=prepared.memory_budget,
        steps=spec.measure.steps,
        warmup=spec.measure.warmup,
        trial_timeout=spec.measure.trial_timeout,
        base_batch_size=prepared.reference_batch,
        predictor=predictor,
        on_start=observer.trial_started,
        note=note_saver() if options.dashboard else None,
    )


def _predictor(
    options: RunOptions, device_type: str, step: CheckStep | None, observer: StudyObserver, *, selective: bool
) -> StudyPredictor | None:
    if options.memory_model is None:
        return None
    # Lazy: the study's trials are real, exactly tracked steps; the first measured trial of each
    # kind of configuration checks it, so no check step delays the first trial. ``selective``:
    # every trial may be at the level, so the profile holds its runs from the start (where only
    # enqueued trials are, the first of them grows it).
    return load_memory_predictor(
        options.memory_model, device=device_type, step=step, note=observer.note, lazy=True, selective=selective
    )


def _profile_ahead(prepared: Prepared, predictor: StudyPredictor | None, *, until: Callable[[], bool]) -> None:
    """Take the memory profile's modes the baselines use (the PyTorch default's first), then the
    outer parts' own (fp32 blocks under a reduced outer autocast: the sampled trials reach it, and
    the policy's proposal's tables need it), one at a time while ``until()`` is False: fake runs
    in this process, which the first trials (and the proposal) would otherwise wait for
    (:meth:`StudyPredictor.profile_ahead`; at GPT-2-small size several seconds a mode)."""
    if predictor is None:
        return
    space, held = prepared.space, prepared.workload.held_in_16_bits is not None
    firsts = baselines(space, batch_size=max(space.batch_sizes), held=held, objective=prepared.spec.objective)
    configs = [space.config(b.knobs) for b in firsts]
    if space.low_precisions:  # the outer knob is in the space
        configs.append(space.config(replace(firsts[0].knobs, outer_low_precision=True)))
    predictor.profile_ahead(prepared.workload, configs, until=until)


def _enqueue(
    study: optuna.Study,
    prepared: Prepared,
    predictor: MemoryPredictor | None,
    observer: StudyObserver,
    options: RunOptions,
    *,
    after_queue: bool = False,
) -> bool:
    """Enqueue the baselines, and the proposal where the spec asks for one: whether that is settled
    (``after_queue``: it waits until the baselines have run, see :func:`enqueue_proposal`)."""
    space = prepared.space
    floor = prepared.workload.micro_batch_note(max(space.batch_sizes) // min(space.ranks))
    if floor is not None:
        observer.note(floor)
    enqueue_baselines(study, prepared, predictor, note=observer.note)
    return not prepared.spec.policy_proposal or enqueue_proposal(
        study, prepared, options.propose, after_queue=after_queue, note=observer.note
    )


def retime_study(study: optuna.Study, *, device: str | None = None) -> dict[str, Any] | None:
    """Re-time a finished study's finalists side by side unless it already did (``autotune best``):
    the record stored on the study (:mod:`autotune.search.finalists`), or None with fewer than two."""
    from autotune.procs.isolation import MeasurementProcess
    from autotune.resolve import load_workload
    from autotune.search.finalists import RETIMED, to_retime

    if not to_retime(study):  # decided before a measuring process is started for nothing
        previous = study.user_attrs.get(RETIMED)
        return dict(previous) if previous else None
    spec = stored_spec(study)
    source = load_workload(spec.workload).source
    assert source is not None  # load_workload always sets it
    alloc_conf = study_alloc_conf(spec, device)
    with MeasurementProcess(source, threads=spec.measure.threads, device=device, alloc_conf=alloc_conf) as measurer:
        measurer.start()
        return _retime(study, measurer, spec, StudyObserver())  # its notes go to stderr


def _retime(study: optuna.Study, measurer: Any, spec: StudySpec, observer: StudyObserver) -> dict[str, Any] | None:
    """The finalists re-timed side by side in the measuring child (:mod:`autotune.search.finalists`)."""
    from autotune.errors import MeasurementFailed
    from autotune.search.finalists import retime_finalists

    def retimer(configs: list[TrainConfig], scales: list[float]) -> Any:
        # Each finalist: up to 6 warm-up steps and 6 rounds of 2 steps, each bounded like a trial.
        return measurer.retime(configs, scales=scales, timeout=len(configs) * spec.measure.trial_timeout)

    threads = spec.measure.threads or os.cpu_count() or 1
    try:
        record = retime_finalists(study, retimer, threads=threads, note=observer.note)
    except MeasurementFailed as e:
        observer.note(f"re-timing the finalists failed ({e}): the recommendation stays the best first measurement")
        return None
    if record is not None:
        verdict = verdict_words(record["decided"])
        observer.note(f"re-timed side by side: trial {record['winner']} wins ({verdict}, {record['rounds']} rounds)")
        if record["note"]:
            observer.note(record["note"])
    return record


def _compile_wanted(asked: bool | None, device_type: str) -> bool:
    return device_type == "cuda" if asked is None else asked


def _check_compile(
    study: optuna.Study,
    measurer: MeasurementProcess,
    spec: StudySpec,
    memory_budget: int | None,
    observer: StudyObserver,
) -> None:
    """The recommendation timed eager and compiled in the measuring child
    (:mod:`autotune.search.compile_pick`); the summary prints its line after the recommendation."""
    from autotune.search.compile_pick import candidates, check_recommendation
    from autotune.search.results import summarize

    def compare(config: TrainConfig) -> CompileCheck:
        # The compile, then both configurations' warm-up and up to 6 rounds: bounded like 3 trials.
        return measurer.compare_compiled(config, memory_budget=memory_budget, timeout=3 * spec.measure.trial_timeout)

    summary = summarize(study)
    # Compiled too, the best eager finalist need not stay the best (compile_pick.py).
    check_recommendation(
        study,
        summary.recommended,
        compare,
        note=observer.note,
        finalists=candidates(summary),
        objective=spec.objective,
    )


def study_alloc_conf(spec: StudySpec, device: str | None) -> str | None:
    """``PYTORCH_CUDA_ALLOC_CONF`` for the study's measurements: None (inherited) unless the spec
    asks for expandable segments and the measurements run on CUDA (on the CPU it is no setting)."""
    if not spec.space.expandable_segments:
        return None
    from autotune.train.local import resolve_device

    if resolve_device(device).type != "cuda":
        return None
    return alloc_conf_with(os.environ.get(ALLOC_CONF_VAR), expandable_segments=True)


def record_trial(
    study: optuna.Study, prepared: Prepared, knobs: Any, *, throughput: float, peak_bytes: int, source: str
) -> int:
    """Add a configuration measured elsewhere (``autotune tune``'s best step) as a completed trial,
    through Optuna's own protocol (enqueue, ask, suggest, tell), so ``autotune best``, exports
    and the dashboard show it next to the study's trials. ``source`` goes in the baseline
    attribute. Returns the trial number."""
    from autotune.measurement.objective import per_gib, score
    from autotune.search.trial import set_constraints

    study.enqueue_trial(prepared.space.params(knobs), user_attrs={ATTR.BASELINE: source})
    trial = study.ask()
    config = prepared.space.config(prepared.space.suggest(trial))
    # Measured at the user's batch without a noise estimate: efficiency 1, value = throughput.
    s = score(
        throughput=throughput,
        peak_bytes=peak_bytes,
        batch_size=config.effective_batch_size,
        base_batch_size=prepared.reference_batch,
        noise_scale=None,
        batch_is_knob=prepared.space.multi_batch,
    )
    attrs = {
        ATTR.CONFIG: config.to_dict(),
        ATTR.STATUS: "ok",
        ATTR.THROUGHPUT: throughput,
        ATTR.GOODPUT: throughput * s.efficiency,
        ATTR.EFFICIENCY: s.efficiency,
        ATTR.PEAK: peak_bytes,
        ATTR.PER_GIB: per_gib(throughput, peak_bytes),
    }
    for k, v in attrs.items():
        trial.set_user_attr(k, v)
    if prepared.memory_budget is not None:
        set_constraints(trial, [float(peak_bytes - prepared.memory_budget)])
    study.tell(trial, [s.value, peak_bytes / MIB])
    return trial.number
