"""CLI commands of the policy workflow: ``profile``, ``train-policy``, ``fine-tune-policy``, ``tune``.

Only argparse at import time; gymnasium, SB3 and torch load inside the handlers.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.cli.flags import (
    BUDGET_HELP,
    WORKLOAD_HELP,
    add_min_micro_batch_flag,
    add_objective_flag,
    add_ranks_flag,
    add_threads_flag,
)

__all__ = ["register"]


def register(sub: Any) -> None:
    _add_profile(sub)
    _add_train_policy(sub)
    _add_fine_tune_policy(sub)
    _add_tune(sub)


def _add_profile(sub: Any) -> None:
    """The ``profile`` command and its arguments."""
    p = sub.add_parser("profile", help="measure a workload's per-block profile for the simulator (JSON)")
    p.add_argument("workload", help=WORKLOAD_HELP)
    p.add_argument("--out", type=Path, help="output JSON (default: <workload>.profile.json)")
    p.add_argument("--curve-steps", type=int, default=60, help="steps of the recorded loss/noise curve")
    p.set_defaults(func=_cmd_profile)


def _add_train_policy(sub: Any) -> None:
    """The ``train-policy`` command and its arguments."""
    p = sub.add_parser("train-policy", help="train PPO on the simulator and save it (safetensors + JSON)")
    p.add_argument("--timesteps", type=int, default=200_000, help="PPO environment steps to train for (default 200000)")
    p.add_argument("--profiles", nargs="*", type=Path, help="profile JSONs (default: the shipped ones)")
    p.add_argument("--no-randomize", action="store_true", help="no domain randomization")
    p.add_argument("--seed", type=int, default=0, help="seed of PPO and the simulated environments (default 0)")
    p.add_argument("--envs", type=int, default=4, help="simulated environments PPO steps together (default 4)")
    p.add_argument("--out", type=Path, default=Path("policy"), help="output directory (default: ./policy)")
    p.add_argument("--overwrite", action="store_true", help="replace the policy --out already holds")
    p.set_defaults(func=_cmd_train_policy)


def _add_fine_tune_policy(sub: Any) -> None:
    """The ``fine-tune-policy`` command and its arguments."""
    p = sub.add_parser(
        "fine-tune-policy",
        help="fit a workload's simulator to a finished study's trials and fine-tune the policy on it",
        description="Profile WORKLOAD, fit its simulator's time terms to the throughput the study measured, "
        "fine-tune the policy on it at the study's memory budget and save it (for tune --policy DIR and "
        "Adaptive(policy=DIR)).",
    )
    p.add_argument("workload", help="the study's workload: built-in name, random:SEED, path/to/file.py:build, ...")
    p.add_argument("--study", required=True, help="name of a study of WORKLOAD (at least 3 completed trials)")
    p.add_argument("--storage", help="Optuna storage URL or SQLite path (default studies/autotune.db)")
    p.add_argument("--out", type=Path, required=True, help="output policy directory")
    p.add_argument("--overwrite", action="store_true", help="replace the policy --out already holds")
    p.add_argument("--seconds", type=float, default=30.0, help="fine-tuning wall time in seconds (default 30)")
    p.add_argument("--policy", type=Path, help="policy to start from (default: the shipped pretrained policy)")
    p.add_argument("--seed", type=int, default=0, help="seed of PPO and the simulated environments (default 0)")
    p.set_defaults(func=_cmd_fine_tune_policy)


def _add_tune(sub: Any) -> None:
    """The ``tune`` command and its arguments."""
    p = sub.add_parser(
        "tune",
        help="run a policy for one episode on the real training loop of a workload",
        epilog="exit codes: 0 done; 1 a configuration failed to train; 2 a user mistake (nothing "
        "run); 3 the loss became NaN or infinite (at the start, or the step that ended the "
        "episode); 130 Ctrl-C",
    )
    p.add_argument("workload", help=WORKLOAD_HELP)
    p.add_argument("--policy", type=Path, help="policy directory (default: the shipped pretrained policy)")
    p.add_argument(
        "--memory-budget",
        default="75%",
        help=f"{BUDGET_HELP}; the percentage is of the default's peak measured on the running loop (default 75%%)",
    )
    p.add_argument("--steps", type=int, default=8, help="env steps (each trains --steps-per-action steps; default 8)")
    p.add_argument(
        "--fine-tune-seconds",
        type=float,
        default=30.0,
        help="profile the model (seconds) and fine-tune the policy on its calibrated simulator for "
        "this long before acting on the real loop; 0: act with the policy as is (default 30)",
    )
    p.add_argument(
        "--storage",
        help="also record the best step as a trial of the study of this workload and budget in this storage "
        "(e.g. sqlite:///studies/autotune.db), next to Optuna's trials",
    )
    p.add_argument(
        "--adapt-batch",
        action="store_true",
        help="let the policy grow the effective batch (never below the workload's), rewarded by goodput",
    )
    p.add_argument(
        "--steps-per-action", type=int, default=4, help="real optimizer steps per env step, >= 2 (default 4)"
    )
    add_ranks_flag(p)
    add_threads_flag(p)
    add_min_micro_batch_flag(p)
    add_objective_flag(p)
    p.add_argument("--seed", type=int, default=0, help="seed of the episode's reset (default 0)")
    p.add_argument(
        "--json", action="store_true", help="print as JSON: each step's action, config, measures; baselines, ratios"
    )
    _add_tune_after_episode(p)
    p.set_defaults(func=_cmd_tune)


def _add_tune_after_episode(p: Any) -> None:
    """``tune``'s arguments of what runs after the episode: re-timing, the compile check, the baselines, the
    refinement climb."""
    p.add_argument(
        "--retime",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="re-time the three best steps side by side before naming the best (default: on; seconds)",
    )
    p.add_argument(
        "--compile-check",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="time the best configuration eager and torch.compile-d side by side and say whether compiling pays "
        "(default: on where the loop runs on CUDA, off on the CPU, where a compile costs a minute or more)",
    )
    p.add_argument(
        "--baselines",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the episode, measure the PyTorch default and the HF recipe (bf16 + every block recomputed) "
        "at the budget, and say how the best compares with both (default: on; one rank; seconds)",
    )
    p.add_argument(
        "--refine",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the last quarter of the steps, and every step after the policy first proposes to stay, climb "
        "from the best step measured to its untried neighbours (default: on; --no-refine: the policy alone)",
    )


def _cmd_profile(args: argparse.Namespace) -> int:
    from autotune.console import make_console
    from autotune.envs.calibration import calibrate, save_profile
    from autotune.resolve import load_workload

    workload = load_workload(args.workload)
    out = args.out or Path(f"{workload.name}.profile.json")
    console = make_console(stderr=True)
    with console.status(f"profiling {workload.name}") as status:
        profile = calibrate(
            workload,
            curve_steps=args.curve_steps,
            progress=lambda what: status.update(f"profiling {workload.name}: {what}"),
        )
    save_profile(profile, out)
    x_f = profile.reduced_fixed_slowdown
    fixed = "" if x_f is None else f" ({x_f:.2f}x per micro-batch)"
    print(
        f"wrote {out}: {len(profile.blocks)} blocks, reduced-precision slowdown {profile.reduced_slowdown:.2f}x "
        f"per sample{fixed}, recompute +{profile.recompute_fraction:.0%} of block time"
    )
    return 0


def _cmd_train_policy(args: argparse.Namespace) -> int:
    import torch

    from autotune.envs.calibration import load_profile
    from autotune.envs.simulated import shipped_profiles
    from autotune.errors import ConfigError
    from autotune.policies.ppo import EPISODE_STEPS, RANK_CHOICES, save_policy, train_policy

    if args.envs < 1:
        raise ConfigError(f"--envs must be >= 1, but got {args.envs}.")
    _check_out(args.out, overwrite=args.overwrite)  # before minutes of training
    # A 64x64 MLP on batches of 256: one thread does it; a second only contends with the
    # environments' Python (measured on 2 cores shared with other processes: two threads can be slower than one).
    torch.set_num_threads(1)
    profiles = [load_profile(p) for p in args.profiles] if args.profiles else shipped_profiles()
    started = time.perf_counter()
    model = train_policy(
        timesteps=args.timesteps,
        profiles=profiles,
        randomize=not args.no_randomize,
        n_envs=args.envs,
        seed=args.seed,
        verbose=1,
    )
    seconds = time.perf_counter() - started
    save_policy(
        model,
        args.out,
        trained_on=[p.workload for p in profiles],
        timesteps=args.timesteps,
        extra={
            "randomize": not args.no_randomize,
            "seed": args.seed,
            "ranks": list(RANK_CHOICES) if not args.no_randomize else [1],
            "episode_steps": EPISODE_STEPS,
            "n_envs": args.envs,
            "train_seconds": round(seconds),
        },
    )
    print(f"saved {args.out}/policy.safetensors and {args.out}/policy.json")
    return 0


def _check_out(out: Path, *, overwrite: bool) -> None:
    """``--out`` of a command that writes a policy directory: refused before any work if it (or a
    folder in its path) is a file, or it already holds a policy and ``--overwrite`` is not given."""
    from autotune.errors import ConfigError

    existing = next((p for p in (out, *out.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "is a file" if existing == out else f"lies under {str(existing)!r}, a file"
        raise ConfigError(f"--out must be a directory, but {str(out)!r} {where}.")
    held = [name for name in ("policy.json", "policy.safetensors") if (out / name).exists()]
    if held and not overwrite:
        raise ConfigError(
            f"--out {str(out)!r} already holds a policy ({', '.join(held)}): pass --overwrite to "
            "replace it, or another --out."
        )


def _cmd_fine_tune_policy(args: argparse.Namespace) -> int:
    import math

    import torch

    from autotune.console import make_console
    from autotune.errors import ConfigError
    from autotune.policies.from_study import fine_tune_from_study

    if not args.seconds > 0:
        raise ConfigError(f"--seconds must be > 0, but got {args.seconds!r}.")
    _check_out(args.out, overwrite=args.overwrite)  # before profiling and fine-tuning (minutes)
    torch.set_num_threads(1)  # as train-policy: a 64x64 MLP; a second thread only contends
    with make_console(stderr=True).status(
        f"profiling {args.workload}, fitting it to study {args.study!r}, fine-tuning"
    ):
        done = fine_tune_from_study(
            args.workload,
            study=args.study,
            storage=args.storage,
            out=args.out,
            seconds=args.seconds,
            seed=args.seed,
            policy=args.policy,
        )
    steps = done.policy.metadata["fine_tuned"]["steps"]
    before, after = math.exp(done.error_before), math.exp(done.error_after)
    fit = f"simulated throughput off by x{before:.2f} calibrated -> x{after:.2f} fitted, geometric RMS"
    print(f"saved {done.out}: fitted to {done.trials} trials of study {done.study!r} ({fit}), fine-tuned {steps} steps")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    import math
    import time

    from autotune.cli.flags import warn_if_busy
    from autotune.console import make_console
    from autotune.errors import NonFiniteLossError
    from autotune.measurement.progress import loaded_line
    from autotune.policies.ppo import PRETRAINED_DIR, load_policy
    from autotune.policies.tune import tune
    from autotune.resolve import load_workload

    # Everything the user gave is checked before the first real training step (seconds to minutes).
    budget, min_micro, objective, threads = _tune_inputs(args)
    policy = load_policy(args.policy or PRETRAINED_DIR)
    start = time.perf_counter()
    workload = load_workload(args.workload)
    # Said with the first phase: a user mistake tune() finds before any (the episode's length, a
    # policy of another action space) stays one line.
    say, status = _progress([loaded_line(workload, start)])
    if min_micro is not None:
        workload = dataclasses.replace(workload, min_micro_batch=min_micro)
    warn_if_busy(threads)
    tuned = tune(
        workload,
        policy,
        memory_budget=budget,
        steps=args.steps,
        steps_per_action=args.steps_per_action,
        fine_tune_seconds=args.fine_tune_seconds,
        ranks=args.ranks,
        adapt_batch=args.adapt_batch,
        seed=args.seed,
        refine=args.refine,
        retime=args.retime,
        compile_check=args.compile_check,
        baselines=args.baselines,
        status=status,
        note=say,
        objective=objective,
    )
    episode = tuned.episode
    if args.storage:
        _record(args, budget, episode, workload)
    if args.json:
        print(tuned.to_json(), file=args.stdout)
    else:
        _print_episode(episode, tuned.final_knobs)
        make_console().print(tuned.recommended_line(), markup=False, highlight=False)
    diverged = next((s for s in episode.steps if not math.isfinite(s.loss)), None)
    if diverged is not None:  # the environment ended the episode there; its output says what ran before
        raise NonFiniteLossError(
            f"the loss was {diverged.loss} at step {diverged.step} ({diverged.knobs}): the episode ended there"
        )
    return 0


def _tune_inputs(args: argparse.Namespace) -> tuple[Any, int | None, Any, int]:
    """``tune``'s arguments checked before anything loads or trains: the budget, the smallest
    micro-batch, the objective, the threads set (a storage it could not record in is refused here,
    not after minutes of training)."""
    import math

    from autotune.cli.flags import min_micro_batch_of, objective_arg, set_threads
    from autotune.errors import ConfigError
    from autotune.units import parse_memory_budget

    if not (math.isfinite(args.fine_tune_seconds) and args.fine_tune_seconds >= 0):
        raise ConfigError(f"--fine-tune-seconds must be a finite number >= 0, but got {args.fine_tune_seconds!r}.")
    budget = parse_memory_budget(args.memory_budget)
    min_micro = min_micro_batch_of(args)
    objective = objective_arg(args)
    if args.storage:
        from autotune.search.storage import check_storage

        check_storage(args.storage)
    return budget, min_micro, objective, set_threads(args.threads, ranks=args.ranks)


def _progress(pending: list[str]) -> tuple[Callable[[str], None], Callable[[str], Any]]:
    """``tune``'s ``note`` and ``status`` on stderr, each printing the ``pending`` lines first."""
    import sys

    from autotune.console import make_console

    console = make_console(stderr=True)

    def flush() -> None:
        while pending:
            print(pending.pop(0), file=sys.stderr)

    def say(line: str) -> None:
        flush()
        print(line, file=sys.stderr)

    def status(message: str) -> Any:
        flush()
        return console.status(message)

    return say, status


def _record(args: argparse.Namespace, budget: Any, episode: Any, workload: Any) -> None:
    """The episode's best step as a trial of the study ``autotune study WORKLOAD --memory-budget B``
    would open in ``--storage`` (created if absent)."""
    import sys

    from autotune.knobs import knobs_of_config
    from autotune.search.opening import open_study
    from autotune.search.spec import StudySpec
    from autotune.search.study import RunOptions, prepare, record_trial

    best = episode.best
    if best is None:
        print(f"nothing recorded in {args.storage}: {episode.nothing_fits}", file=sys.stderr)
        return
    knobs = knobs_of_config(best.config, len(workload.block_names()))  # its selective blocks kept
    # The study of the same objective: one of the other is refused (its recommendation means another thing).
    prepared = prepare(StudySpec(workload=args.workload, memory_budget=budget, objective=episode.objective))
    study = open_study(prepared, RunOptions(storage=args.storage))
    number = record_trial(
        study, prepared, knobs, throughput=best.throughput, peak_bytes=best.peak_bytes, source="policy"
    )
    print(f"recorded as trial {number} of study {study.study_name!r} in {args.storage}", file=sys.stderr)


def _print_episode(episode: Any, final_knobs: Any) -> None:
    from rich.table import Table

    from autotune.console import make_console
    from autotune.units import format_bytes

    console = make_console()
    table = Table(title=f"policy on {episode.workload}: budget {format_bytes(episode.budget_bytes)}")
    for col in ("step", "by", "action", "knobs", "samples/s", "peak", "B_noise", "loss", "reward"):
        table.add_column(col, justify="right")
    for s in episode.steps:
        action = "-" if s.action is None else ",".join(str(a) for a in s.action)
        reward = "-" if s.reward is None else f"{s.reward:+.3f}"
        table.add_row(
            str(s.step),
            s.source or "-",
            action,
            s.knobs,
            f"{s.throughput:.1f}",
            format_bytes(s.peak_bytes),
            _num(s.b_noise),
            f"{s.loss:.4f}",
            reward,
        )
    console.print(table)
    console.print(f"return {episode.total_reward:+.3f}; start config: {episode.start_config.to_dict()}")
    console.print(f"final config:   {episode.final_config.to_dict()}")
    best = episode.best
    if best is None:
        console.print(episode.nothing_fits)
    else:
        fastest = "" if episode.objective == "per-gib" else ", the most samples/s"
        console.print(f"best measured within budget{fastest} (step {best.step}, {best.knobs}): {best.config.to_dict()}")
        r = episode.retimed
        if r is not None:
            i = r["steps"].index(r["winner"])
            from autotune.measurement.sidebyside import verdict_words

            verdict = verdict_words(r["decided"])
            retimed = (
                f"{r['retimed_per_gib'][i]:.1f} per GiB"
                if episode.objective == "per-gib"
                else f"{r['retimed_throughput'][i]:.1f} samples/s"
            )
            console.print(
                f"  re-timed side by side with steps {r['steps']}: {retimed} "
                f"(spread {r['retimed_spread'][i]:.1%}; {verdict}, {r['rounds']} rounds)"
            )
            if r["note"]:
                console.print(f"  {r['note']}")
    # The shared encoding (autotune.knobs): the same point in a study's terms, to check it there.
    console.print(f"final knobs:    {final_knobs}")


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
