"""``autotune study``, ``autotune worker``, ``autotune best`` and ``autotune dashboard``.

Thin handlers over :mod:`autotune.search`. Only argparse is imported at module level (the CLI's
help must stay instant); each handler imports what it needs.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.cli.flags import (
    BUDGET_HELP,
    THREADS_HELP,
    add_min_micro_batch_flag,
    add_objective_flag,
    min_micro_batch_of,
    warn_if_busy,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna

    from autotune.knobs import Knobs
    from autotune.measurement.objective import ObjectiveName
    from autotune.memory.profile_record import MemoryProfile
    from autotune.procs.isolation import MeasurementProcess
    from autotune.search.spec import StudySpec
    from autotune.search.study import RunOptions
    from autotune.workload import Workload

__all__ = ["register"]

_SAMPLERS = ("tpe", "nsga2", "gp", "random")
_FORMATS = ("json", "deepspeed", "python")


def register(subparsers: Any) -> None:
    """Add the search commands to the ``autotune`` parser."""
    _add_study(subparsers)
    _add_worker(subparsers)
    _add_best(subparsers)
    _add_dashboard(subparsers)


def _add_study(subparsers: Any) -> None:
    """The ``study`` command and its arguments."""
    p = subparsers.add_parser(
        "study",
        help="search the knobs with Optuna: max throughput, min peak memory, within a memory budget",
        description="Run (or resume) an Optuna study over micro-batch, accumulation, per-block precision and "
        "checkpointing. TARGET is a workload reference or a study spec studies/NAME.toml; flags override the spec.",
    )
    p.add_argument("target", metavar="WORKLOAD|SPEC.toml", help="built-in name, random:SEED, file.py:build, or a spec")
    p.add_argument("--trials", type=int, help="trials in the study, baselines and resumed ones included (default 20)")
    p.add_argument("--memory-budget", help=f"peak tensor memory allowed per rank: {BUDGET_HELP}")
    p.add_argument("--storage", help="Optuna storage URL or SQLite path (default studies/autotune.db)")
    p.add_argument("--study-name", help="default: the workload's name")
    p.add_argument("--sampler", choices=_SAMPLERS, help="default tpe")
    add_objective_flag(p, default="per-gib, or the spec's objective")
    p.add_argument("--timeout", help="stop starting trials after this long, e.g. 30m")
    p.add_argument("--seed", type=int, help="sampler and data-order seed (default 0)")
    p.add_argument("--batch-size", type=int, help="effective batch (default: the workload's)")
    p.add_argument("--batch-sizes", help="comma list: the effective batch becomes a knob, compared as goodput")
    p.add_argument("--precisions", help="comma list of precisions to try (default fp32,bf16)")
    p.add_argument("--ranks", help="comma list of data-parallel rank counts (> 1 needs the DeepSpeed runner)")
    p.add_argument(
        "--selective",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="let the study recompute blocks selectively, the level between none and full (default: off, or "
        "the spec's space.selective; off saves the memory model two fake runs per precision)",
    )
    p.add_argument(
        "--selective-refine",
        dest="selective",
        action="store_const",
        const="refine",
        help="the selective level only in enqueued trials (the refinement's neighbours, the policy's proposal), "
        'never sampled: the sampled trials are those without the level (space.selective = "refine")',
    )
    add_min_micro_batch_flag(p)
    p.add_argument("--steps", type=int, help="timed steps per trial (default 4)")
    p.add_argument("--warmup", type=int, help="warmup steps per trial (default 1)")
    p.add_argument("--trial-timeout", help="time limit of one trial, e.g. 90s (default 5m)")
    p.add_argument("--threads", type=int, help=THREADS_HELP)
    p.add_argument(
        "--policy-proposal",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="enqueue the pretrained policy's proposal for the model as a third baseline (default: on, "
        "or the spec's policy_proposal; a quick profile of the model first, seconds to tens of seconds)",
    )
    p.add_argument(
        "--retime",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="re-time the best three configurations side by side at the end and recommend the winner, "
        "before the refinement to start it from the winner, and time each refinement trial beside its "
        "incumbent (default: on, or the spec's retime; seconds to a minute each)",
    )
    p.add_argument(
        "--compile-check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time the recommendation eager and torch.compile-d side by side at the end; compile becomes part "
        "of it only if it wins beyond the noise (default: on where the study measures on CUDA, off on the CPU, "
        "where a compile costs a minute or more)",
    )
    _run_flags(p)
    p.add_argument("--worker", action="store_true", help="join the existing study (created with --create-only)")
    p.add_argument("--create-only", action="store_true", help="create the study and enqueue the baselines, then exit")
    p.set_defaults(func=_cmd_study)


def _add_worker(subparsers: Any) -> None:
    """The ``worker`` command and its arguments."""
    p = subparsers.add_parser("worker", help="join an existing study and run its trials (one per machine)")
    p.add_argument("study", metavar="STUDY", help="study name")
    p.add_argument("--storage", help="Optuna storage URL (default studies/autotune.db)")
    _run_flags(p)
    p.set_defaults(func=_cmd_worker)


def _add_best(subparsers: Any) -> None:
    """The ``best`` command and its arguments."""
    p = subparsers.add_parser("best", help="export the recommended configuration of a study")
    p.add_argument("study", metavar="STUDY", help="study name")
    p.add_argument("--storage", help="Optuna storage URL (default studies/autotune.db)")
    p.add_argument("--format", choices=_FORMATS, default="json", help="our JSON (default), deepspeed or python")
    p.add_argument(
        "--retime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-time the best three side by side first, unless the study already did (default: on)",
    )
    p.add_argument("--device", help="where to re-time: cpu, cuda, cuda:1 (default auto)")
    p.set_defaults(func=_cmd_best, machine_output=True)


def _add_dashboard(subparsers: Any) -> None:
    """The ``dashboard`` command and its arguments."""
    p = subparsers.add_parser("dashboard", help="start optuna-dashboard on a study storage")
    p.add_argument("--storage", help="Optuna storage URL or SQLite path (default studies/autotune.db)")
    p.add_argument("--artifact-dir", default=None, help="artifact store directory (default studies/artifacts)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="TCP port to listen on, 1-65535 (default 8080)")
    p.set_defaults(func=_cmd_dashboard)


def _run_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", help="cpu, cuda, cuda:1 (default auto)")
    p.add_argument("--cache", help="measurement cache file (default studies/measurements.db)")
    p.add_argument("--no-cache", action="store_true", help="measure everything again")
    p.add_argument("--artifact-dir", help="where best-config artifacts go (default studies/artifacts)")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.add_argument(
        "--no-memory-model", action="store_true", help="measure every config, even those predicted not to fit"
    )


# ---- study -----------------------------------------------------------------------------------------


def _ints(text: str, flag: str) -> tuple[int, ...]:
    from autotune.errors import SpecError

    try:
        return tuple(int(s) for s in text.split(","))
    except ValueError:
        raise SpecError(f"{flag} must be a comma list of ints, but got {text!r}.") from None


def _spec_from_args(args: argparse.Namespace) -> StudySpec:
    from autotune.search.spec import StudySpec, load_spec, parse_duration
    from autotune.units import parse_memory_budget

    target: str = args.target
    spec = load_spec(target) if target.endswith(".toml") else StudySpec(workload=target)
    top: dict[str, Any] = {}
    for flag, key in (
        ("trials", "trials"),
        ("study_name", "name"),
        ("sampler", "sampler"),
        ("seed", "seed"),
        ("policy_proposal", "policy_proposal"),
        ("retime", "retime"),
        ("objective", "objective"),  # checked by StudySpec: one line, as a spec's
    ):
        if getattr(args, flag) is not None:
            top[key] = getattr(args, flag)
    if args.memory_budget is not None:
        top["memory_budget"] = parse_memory_budget(args.memory_budget)
    if args.timeout is not None:
        top["timeout"] = parse_duration(args.timeout, name="--timeout")
    space: dict[str, Any] = {}
    if args.batch_size is not None:
        space["batch_size"] = args.batch_size
    if args.batch_sizes is not None:
        space["batch_sizes"] = _ints(args.batch_sizes, "--batch-sizes")
    if args.precisions is not None:
        space["precisions"] = tuple(s.strip() for s in args.precisions.split(","))
    if args.ranks is not None:
        space["ranks"] = _ints(args.ranks, "--ranks")
    if args.selective is not None:
        space["selective"] = args.selective
    if min_micro_batch_of(args) is not None:
        space["min_micro_batch"] = args.min_micro_batch
    measure: dict[str, Any] = {
        k: getattr(args, k) for k in ("steps", "warmup", "threads") if getattr(args, k) is not None
    }
    if args.trial_timeout is not None:
        measure["trial_timeout"] = parse_duration(args.trial_timeout, name="--trial-timeout")
    return dataclasses.replace(
        spec,
        **top,
        space=dataclasses.replace(spec.space, **space),
        measure=dataclasses.replace(spec.measure, **measure),
    )


def _check_device(device: str | None) -> None:
    if device is not None:  # no CUDA, or no such device: one line now, not a failed trial per config
        from autotune.train.local import resolve_device

        resolve_device(device)


def _options(args: argparse.Namespace, **extra: Any) -> RunOptions:
    from autotune.search.storage import DEFAULT_ARTIFACTS, DEFAULT_CACHE
    from autotune.search.study import RunOptions

    cache = None if args.no_cache else (args.cache or DEFAULT_CACHE)
    return RunOptions(
        storage=args.storage,
        cache=cache,
        artifact_dir=args.artifact_dir or DEFAULT_ARTIFACTS,
        device=args.device,
        memory_model=None if args.no_memory_model else RunOptions.memory_model,
        propose=_policy_proposal,
        **extra,
    )


def _policy_proposal(
    workload: Workload,
    *,
    memory_budget: int | None,
    reuse: MemoryProfile | None = None,
    progress: Callable[[str], None] | None = None,
    objective: ObjectiveName = "per-gib",
) -> Knobs:
    """The pretrained policy's proposal, handed to the study (the policies sit above it). Imported
    when the study asks for it: a policy that cannot load is the study's one note, not an exit."""
    from autotune.policies.transfer import propose

    return propose(workload, memory_budget=memory_budget, reuse=reuse, progress=progress, objective=objective)


def _quiet_optuna() -> None:
    import optuna

    # Failed and pruned trials are reported by our display with their reason; Optuna's own log
    # lines (with a traceback per failed trial) would tear the live display apart.
    optuna.logging.set_verbosity(optuna.logging.ERROR)


def _cmd_study(args: argparse.Namespace) -> int:
    from autotune.search.opening import open_study
    from autotune.search.study import measuring_ahead, prepare

    _quiet_optuna()
    spec = _spec_from_args(args)  # validation first: bad input must write nothing
    _check_device(args.device)
    options = _options(args, worker=args.worker, create_only=args.create_only, compile_check=args.compile_check)
    with measuring_ahead(spec, options) as measurer:
        prepared = prepare(spec)
        study = open_study(prepared, options)
        return _run(prepared, study, options, progress=not args.no_progress, measurer=measurer)


def _cmd_worker(args: argparse.Namespace) -> int:
    from autotune.search.opening import open_study, stored_spec
    from autotune.search.storage import load_existing_study
    from autotune.search.study import measuring_ahead, prepare

    _quiet_optuna()
    _check_device(args.device)
    options = _options(args, worker=True)
    existing = load_existing_study(
        args.storage, args.study, hint=": create it first with autotune study ... --create-only"
    )
    spec = dataclasses.replace(stored_spec(existing), name=args.study)
    with measuring_ahead(spec, options) as measurer:
        prepared = prepare(spec)
        study = open_study(prepared, options)
        return _run(prepared, study, options, progress=not args.no_progress, measurer=measurer)


def _run(
    prepared: Any,
    study: optuna.Study,
    options: RunOptions,
    *,
    progress: bool,
    measurer: MeasurementProcess | None = None,
) -> int:
    import optuna

    from autotune.console import make_console
    from autotune.errors import MissingDependencyError
    from autotune.search.dashboard import save_study_artifacts
    from autotune.search.display import ProgressDisplay, summary_view
    from autotune.search.results import summarize
    from autotune.search.study import StudyObserver, count_done, run_study

    err = make_console(stderr=True)
    if options.create_only:
        run_study(prepared, study, options)
        waiting = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))
        err.print(f"study {study.study_name!r} ready: {waiting} trials enqueued; start the workers now")
        return 0
    total, done = prepared.spec.trials, count_done(study)
    if total > done:  # before the first timed step: the one line a busy machine gets
        warn_if_busy(prepared.spec.measure.threads)
    if progress and total > done:
        with ProgressDisplay(total=total, done=done, console=err, objective=prepared.spec.objective) as display:
            run_study(prepared, study, options, display, measurer=measurer)
    else:
        run_study(prepared, study, options, StudyObserver(), measurer=measurer)
    summary = summarize(study)
    make_console().print(summary_view(summary))
    if options.dashboard and not options.worker:
        try:
            save_study_artifacts(
                study,
                summary,
                artifact_dir=options.artifact_dir,
                block_names=prepared.workload.block_names(),
                workload=prepared.workload.name,
                largest_parameter=prepared.workload.largest_parameter,
            )
        except MissingDependencyError as e:
            err.print(f"note: no dashboard plot or artifacts saved: {e}")
    return 0


# ---- best, dashboard -------------------------------------------------------------------------------


def _cmd_best(args: argparse.Namespace) -> int:

    from autotune.errors import StudyError
    from autotune.search.export import allocator_note, compile_note, export_config, objective_note, recompute_note
    from autotune.search.results import require_recommended, summarize
    from autotune.search.storage import load_existing_study

    study = load_existing_study(args.storage, args.study)
    if args.retime:
        from autotune.search.study import retime_study

        retime_study(study, device=args.device)  # one line each on stderr; the export stays a config
    summary = summarize(study)
    best = require_recommended(summary)
    config = summary.recommended_config
    assert config is not None
    blocks = tuple(study.user_attrs.get("blocks", ()))
    if not blocks:
        raise StudyError(f"study {args.study!r} stores no block names: was it created by autotune study?")
    largest = study.user_attrs.get("largest_parameter")
    if largest is None:  # a study created before the attribute existed: rebuild its workload once
        from autotune.resolve import load_workload
        from autotune.search.opening import stored_spec

        largest = load_workload(stored_spec(study).workload).largest_parameter
    expandable = _expandable_segments(study)
    text = export_config(
        config,
        args.format,
        block_names=blocks,
        workload=study.study_name,
        largest_parameter=largest,
        expandable_segments=expandable,
        measured=_measured(summary, best) if args.format == "json" else None,
        objective=summary.objective,
    )
    args.stdout.write(text)
    if summary.compile_pick is not None:  # whether the pick is compiled, and why not where it is not
        print(f"autotune best: {summary.compile_pick.export_line}", file=sys.stderr)
    if args.format == "deepspeed":  # JSON has no comments: the allocator setting goes to stderr
        print(f"autotune best: {allocator_note(expandable)}", file=sys.stderr)
        print(f"autotune best: {objective_note(summary.objective)}", file=sys.stderr)  # and what it is for
        compiled = compile_note(config)
        if compiled is not None:
            print(f"autotune best: {compiled}", file=sys.stderr)
        recompute = recompute_note(config, num_blocks=len(blocks))
        if recompute is not None:
            print(f"autotune best: {recompute}", file=sys.stderr)
    return 0


def _measured(summary: Any, best: Any) -> dict[str, Any]:
    """What the study measured for its recommendation: its trial's first measurement and, when the
    finalists were re-timed side by side, its re-timed figures (those on the trial's attributes)."""
    measured: dict[str, Any] = {
        "study": summary.name,
        "trial": best.number,
        "throughput": best.throughput,
        "metric": summary.metric,
        "objective": best.objective,
        "peak_bytes": best.peak_bytes,
        "per_gib": best.per_gib,
    }
    measured["recommended_for"] = summary.objective
    f = summary.retimed.get(best.number)
    if f is not None:
        measured["retimed"] = {
            "throughput": f.retimed_throughput,
            "spread": f.retimed_spread,
            "per_gib": f.retimed_per_gib,
            "rank": f.rank + 1,
            "rounds": f.rounds,
            "with": sorted(summary.retimed),
            "decided": summary.retimed_decided,
        }
    pick = summary.compile_pick
    if pick is not None:
        measured["compile"] = {"compiled": pick.compiled, "line": pick.line, **pick.to_dict()}
    return measured


def _expandable_segments(study: optuna.Study) -> bool:
    """Whether the study measured with expandable segments (a study stored without the option did not)."""
    space = study.user_attrs.get("spec", {}).get("space", {})
    return bool(space.get("expandable_segments", False))


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from autotune.errors import ConfigError
    from autotune.search.dashboard import serve
    from autotune.search.storage import DEFAULT_ARTIFACTS, open_storage, storage_url

    if not 1 <= args.port <= 65535:
        raise ConfigError(f"--port must be in [1, 65535], but got {args.port}.")
    open_storage(args.storage, create=False)  # one clear line if it cannot be opened, before the server starts
    artifact_dir = Path(args.artifact_dir) if args.artifact_dir else DEFAULT_ARTIFACTS

    def announce(url: str) -> None:
        print(f"optuna-dashboard on {url} (Ctrl-C stops it)", file=sys.stderr)

    serve(storage_url(args.storage), artifact_dir=artifact_dir, host=args.host, port=args.port, announce=announce)
    return 0
