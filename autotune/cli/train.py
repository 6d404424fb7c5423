"""``autotune train WORKLOAD --steps N [--adapt] [--ranks N]``: train a workload, adapting its configuration.

In this process (:class:`autotune.adapt.Adaptive`), or on N DeepSpeed ranks
(:meth:`autotune.adapt.Adaptive.on_ranks`: the ZeRO stage is a knob too, the budget per rank).
Only argparse at import time; torch and the tuner load inside the handler.

Exit codes (:data:`EPILOG`): 0 done; 1 a configuration failed to train; 2 a user mistake (nothing
trained); 3 ``--adapt``: the loss became NaN or infinite, the run stopped there (without
``--adapt`` a warning names the first such step and training goes on); 4 a step measured a peak
over the memory budget (a prediction the gate trusted was off; each such step is warned of when it
happens and listed after the run) unless ``--allow-over-budget``; 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from autotune.cli.flags import (
    BUDGET_HELP,
    WORKLOAD_HELP,
    add_min_micro_batch_flag,
    add_objective_flag,
    add_ranks_flag,
    add_threads_flag,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.adapt.source_choice import PolicyArg
    from autotune.measurement.objective import ObjectiveName
    from autotune.workload import Workload

__all__ = ["EPILOG", "register"]

#: The exit codes, as ``autotune train --help`` lists them.
EPILOG = (
    "exit codes: 0 done; 1 a configuration failed to train; 2 a user mistake (nothing trained); "
    "3 with --adapt, the loss became NaN or infinite (the run stops there); 4 a step measured a peak over the "
    "memory budget (unless --allow-over-budget); 130 Ctrl-C"
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train", help="train a workload for N steps; with --adapt, keep it at the best configuration", epilog=EPILOG
    )
    p.add_argument("workload", help=WORKLOAD_HELP)
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default 100)")
    p.add_argument("--adapt", action="store_true", help="adapt the configuration as training goes (default: fixed)")
    p.add_argument("--policy", type=Path, help="policy directory for --adapt (default: the shipped pretrained one)")
    p.add_argument("--memory-budget", help=f"{BUDGET_HELP} (default: the default configuration's own peak)")
    p.add_argument("--decide-every", type=int, help="with --adapt: steps between decisions, >= 2 (default 10)")
    p.add_argument(
        "--adapt-batch", action="store_true", help="with --adapt: let the effective batch grow with the gradient noise"
    )
    p.add_argument(
        "--allow-over-budget",
        action="store_true",
        help="exit 0 even if a step measured a peak over the memory budget (default: exit 4)",
    )
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 (default: where the model is)")
    add_ranks_flag(p)
    add_threads_flag(p)
    add_min_micro_batch_flag(p)
    add_objective_flag(p, prefix="with --adapt: ")
    p.add_argument("--json", action="store_true", help="print the run as JSON: every step and every decision")
    p.set_defaults(func=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from autotune.cli.main import warnings_as_lines

    with warnings_as_lines("train"):  # a NaN loss, a step over the budget, a prediction off: one line each
        return _train_command(args)


def _train_command(args: argparse.Namespace) -> int:
    from autotune.resolve import load_workload

    _check_train_args(args)
    decide_every = 10 if args.decide_every is None else args.decide_every
    from autotune.cli.flags import min_micro_batch_of, objective_arg, set_threads, warn_if_busy
    from autotune.console import make_console

    objective = objective_arg(args)
    min_micro = min_micro_batch_of(args)
    threads = set_threads(args.threads, ranks=args.ranks)

    wl = load_workload(args.workload)
    if min_micro is not None:
        wl = dataclasses.replace(wl, min_micro_batch=min_micro)
    warn_if_busy(threads)
    policy = (args.policy or "pretrained") if args.adapt else None
    # Before the first step: the memory profile, and with the policy the machine probe and its
    # start plan on the calibrated simulator (seconds to a minute for the corpus models).
    console = make_console(stderr=True)
    with console.status(f"{wl.name}: memory profile, machine probe and start plan"):
        # Each phase's line above the spinner, as they end (a study's setup lines).
        say = partial(console.print, highlight=False)
        tuner = _adaptive(wl, args, policy=policy, decide_every=decide_every, objective=objective, progress=say)
    try:
        _train(tuner, args.steps, wl.name, quiet=args.json)
    finally:
        tuner.close()  # on ranks: every process reaped, Ctrl-C and errors included
    if args.json:
        _print_run(tuner, args.stdout)
    else:
        _summary(tuner)
    return _over_budget_exit(tuner, allowed=args.allow_over_budget)


def _check_train_args(args: argparse.Namespace) -> None:
    """The ``train`` flags' own rules, checked before anything loads.

    Raises:
        ConfigError: a flag out of range, or one that needs ``--adapt`` (or one process) without it.
    """
    from autotune.errors import ConfigError

    if args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, but got {args.steps}.")
    if args.policy is not None and not args.adapt:
        raise ConfigError("--policy needs --adapt (without it the run keeps the default configuration).")
    if args.ranks < 1:
        raise ConfigError(f"--ranks must be >= 1, but got {args.ranks}.")
    if args.ranks > 1 and args.adapt_batch:
        raise ConfigError(
            "--adapt-batch needs one process (--ranks 1): the batch follows the gradient noise "
            "scale, which ZeRO's engines do not expose."
        )
    given_flags = (
        ("--decide-every", args.decide_every is not None),
        ("--adapt-batch", args.adapt_batch),
        ("--objective", args.objective is not None),
    )
    for flag, given in given_flags:
        if given and not args.adapt:
            raise ConfigError(f"{flag} needs --adapt (without it the run keeps the default configuration).")


def _adaptive(
    wl: Workload,
    args: argparse.Namespace,
    *,
    policy: PolicyArg,
    decide_every: int,
    objective: ObjectiveName,
    progress: Callable[[str], None],
) -> Any:
    """The run ``train`` drives: ``Adaptive.on_ranks`` with ``--ranks`` > 1, else ``Adaptive`` in this process."""
    from autotune.adapt.adaptive import Adaptive

    if args.ranks > 1:
        return Adaptive.on_ranks(
            wl,
            ranks=args.ranks,
            memory_budget=args.memory_budget,
            policy=policy,
            decide_every=decide_every,
            device=args.device,
            objective=objective,
            progress=progress,
        )
    else:
        return Adaptive(
            wl.model,
            wl.make_optimizer(wl.model.parameters()),
            wl.loss_fn,
            wl.dataset,
            batch_size=wl.batch_size,
            memory_budget=args.memory_budget,
            policy=policy,
            decide_every=decide_every,
            adapt_batch=args.adapt_batch,
            blocks=wl.blocks,
            device=args.device,
            name=wl.name,
            collate_fn=wl.collate_fn,
            min_micro_batch=wl.min_micro_batch,
            track_memory="all",
            objective=objective,
            progress=progress,
        )  # the summary reports measured peaks


def _print_run(tuner: Any, out: TextIO) -> None:
    """``--json``: the run's budget, steps, decisions and steps over the budget."""
    import json

    history = [c.to_dict() for c in tuner.history]
    run = {
        "budget_bytes": tuner.budget_bytes,
        "steps": [s.to_dict() for s in tuner.steps],
        "history": history,
        "over_budget_steps": [o.to_dict() for o in tuner.over_budget_steps],
    }
    print(json.dumps(run, indent=2), file=out)


def _over_budget_exit(tuner: Any, *, allowed: bool) -> int:
    """0, or :data:`~autotune.cli.main.EXIT_OVER_BUDGET` with one line if a step measured over the
    budget and the user did not allow it (each was warned of as it happened)."""
    import sys

    from autotune.cli.main import EXIT_OVER_BUDGET

    over = tuner.over_budget_steps
    if not over or allowed:
        return 0
    print(
        f"autotune train: {len(over)} step(s) measured a peak over the memory budget, the first at "
        f"{over[0].describe()}; --allow-over-budget accepts that",
        file=sys.stderr,
    )
    return EXIT_OVER_BUDGET


def _train(tuner: Any, steps: int, name: str, *, quiet: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autotune.console import make_console

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
    )
    console = make_console(stderr=quiet)  # quiet: stdout is the JSON's
    # A bar on a terminal only: in a file or a log rich would leave its last frame as one more line.
    with Progress(*columns, transient=quiet, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task(f"train {name}", total=steps, status="")
        for _ in range(steps):
            s = tuner.step()
            status = f"loss {s.loss:.4f} | {s.throughput:.1f} samples/s | {tuner.config.describe()}"
            progress.update(task, advance=1, status=status)


def _summary(tuner: Any) -> None:
    from rich.table import Table

    from autotune.console import make_console
    from autotune.units import format_bytes

    console = make_console()
    steps = tuner.steps
    samples = sum(s.samples for s in steps)
    seconds = sum(s.seconds for s in steps)
    peaks = [s.peak_bytes for s in steps if s.peak_bytes is not None]
    ranks = tuner.config.ranks
    where = f" on {ranks} ranks" if ranks > 1 else ""
    per_rank = " per rank" if ranks > 1 else ""
    rate = samples / max(seconds, 1e-9)
    # Only steps whose prediction was not trusted are tracked: there may be none.
    measured = f"highest measured peak {format_bytes(max(peaks))}" if peaks else "no step's peak measured"
    console.print(
        f"{len(steps)} steps{where}, {samples} samples in {seconds:.1f} s ({rate:.1f} "
        f"samples/s), final loss {steps[-1].loss:.4f}, budget {format_bytes(tuner.budget_bytes)}{per_rank}, "
        f"{measured}"
    )
    for over in tuner.over_budget_steps:
        console.print(f"OVER BUDGET: {over.describe()}", markup=False, highlight=False)
    best = tuner.best  # judged as a study judges its trials (autotune.measurement.objective)
    if best is not None:
        head = "best measured" if tuner.decider.objective == "per-gib" else "fastest measured within the budget"
        console.print(
            f"{head}: {best.config.describe()}: {best.score.throughput:.1f} samples/s, peak "
            f"{format_bytes(best.score.peak_bytes)}, {best.score.per_gib:.1f} samples/s per GiB"
        )
    if not tuner.history:
        console.print(f"configuration: {tuner.config.describe()} (no change)")
        return
    table = Table(title="configuration changes")
    for col in ("step", "verdict", "configuration", "seconds", "why"):
        table.add_column(col)
    for c in tuner.history:
        verdict = "applied" if c.applied else ("reverted" if c.reverted else "refused")
        table.add_row(str(c.step), verdict, c.after.describe(), f"{c.seconds:.3f}", f"{c.source}: {c.reason}")
    console.print(table)
