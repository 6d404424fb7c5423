"""``autotune workloads``, ``measure`` and ``predict``: one workload, one config, measured or predicted.

Only argparse at import time; torch and the library load inside the handlers.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.cli.flags import BUDGET_HELP, add_config_flags, add_workload_argument, config_from_args, workload_of
from autotune.errors import ConfigError

__all__ = ["MEASURE_EPILOG", "register"]

#: The exit codes of ``autotune measure``, as its ``--help`` lists them.
MEASURE_EPILOG = (
    "exit codes: 0 measured (within --memory-budget, if given); 1 the configuration failed to train; "
    "2 a user mistake (nothing measured); 4 the measured peak is over --memory-budget (the measurement is "
    "still printed, with one line on stderr); 130 Ctrl-C"
)


def register(sub: Any) -> None:
    p = sub.add_parser("workloads", help="list the built-in workloads with parameter counts")
    p.set_defaults(func=_cmd_workloads)

    p = sub.add_parser(
        "measure", help="run a workload under one config and measure what it costs", epilog=MEASURE_EPILOG
    )
    add_workload_argument(p)
    add_config_flags(p)
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warmup steps (default 2)")
    p.add_argument("--memory-budget", help=f"{BUDGET_HELP}: a peak above it is reported as not fitting (exit 4)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default)")
    p.add_argument("--json", action="store_true", help="print the Measurement as JSON")
    p.set_defaults(func=_cmd_measure)

    p = sub.add_parser("predict", help="predict a config's peak memory per rank, by category, without running it")
    add_workload_argument(p)
    add_config_flags(p)
    p.add_argument("--memory-budget", help=f"{BUDGET_HELP}: say whether the predicted peak fits")
    p.add_argument("--device", default="cpu", help="device kind the ranks would use: cpu (default) or cuda")
    p.add_argument("--export-deepspeed", type=Path, help="also write the DeepSpeed config JSON for these ranks here")
    p.add_argument("--json", action="store_true", help="print the MemoryEstimate as JSON")
    p.set_defaults(func=_cmd_predict)


def _cmd_workloads(args: argparse.Namespace) -> int:
    from autotune.console import make_console
    from autotune.report import workloads_table
    from autotune.zoo import BUILTINS

    rows: list[tuple[str, str, str, str, str, str]] = []
    for name, entry in BUILTINS.items():
        if entry.requires is not None and not entry.requires.available():
            rows.append((name, entry.source, entry.requires.hint, "-", "-", entry.description))
            continue
        wl = entry.build()
        counts = (f"{wl.num_parameters:,}", str(len(wl.block_names())), str(wl.batch_size))
        rows.append((name, entry.source, *counts, entry.description))
    make_console().print(workloads_table(rows))
    return 0


def _cmd_measure(args: argparse.Namespace) -> int:
    """Exit 0 with the measurement; :data:`~autotune.cli.main.EXIT_OVER_BUDGET` (as ``train``) with
    the measurement and one line on stderr when its peak is over ``--memory-budget``."""
    from autotune.cli.main import EXIT_OVER_BUDGET
    from autotune.memory.predict import budget_bytes
    from autotune.resolve import load_workload
    from autotune.train.local import resolve_device
    from autotune.units import parse_memory_budget

    budget = parse_memory_budget(args.memory_budget) if args.memory_budget else None
    device = resolve_device(args.device)  # no CUDA, or no such device: one line before any work
    workload = load_workload(workload_of(args))
    config = config_from_args(
        args, num_blocks=len(workload.block_names()), batch_size=workload.batch_size, workload=workload.name
    )
    budget_b = budget_bytes(budget, workload, ranks=config.ranks, device_type=device.type)

    from autotune.console import make_console
    from autotune.procs.measure import measure
    from autotune.report import measurement_table

    err = make_console(stderr=True)
    with err.status(f"measuring {workload.name}") as status:

        def progress(phase: str, done: int, total: int) -> None:
            status.update(f"measuring {workload.name}: {phase} steps {done}/{total} done")

        m = measure(
            workload,
            config,
            steps=args.steps,
            warmup=args.warmup,
            memory_budget=budget_b,
            device=args.device,
            progress=progress,
        )
    if args.json:
        print(m.to_json(), file=args.stdout)
    else:
        make_console().print(measurement_table(m))
    if m.status == "over_budget":  # a measurement, not an error: printed above, and said in the exit code
        print(f"autotune measure: OVER BUDGET: {m.config.describe()}: {m.reason}", file=sys.stderr)
        return EXIT_OVER_BUDGET
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    """Exit 0 with the estimate (verified or not: the output says which); exit 1 with one line
    (and, with ``--json``, ``{"verified": false, "reason": ...}``) if the model cannot be profiled."""
    import json
    import warnings

    from autotune.console import make_console
    from autotune.errors import PredictionError, PredictionWarning
    from autotune.measurement.progress import loaded_line
    from autotune.memory.check_text import unverified_message
    from autotune.memory.predict import budget_bytes, predict_memory
    from autotune.report import estimate_table
    from autotune.resolve import load_workload
    from autotune.units import parse_memory_budget

    budget = parse_memory_budget(args.memory_budget) if args.memory_budget else None
    if args.export_deepspeed is not None:
        _check_writable(args.export_deepspeed, flag="--export-deepspeed")  # before minutes of profiling
    start = time.perf_counter()
    workload = load_workload(workload_of(args))
    loaded = loaded_line(workload, start)
    config = config_from_args(
        args, num_blocks=len(workload.block_names()), batch_size=workload.batch_size, workload=workload.name
    )
    _say(loaded)  # after the flags are checked against the model: a mistake in them stays one line
    status = f"profiling {workload.name} (fake tensors, then one real step to check)"
    try:
        # The check's warning is printed below as the command's own line, not as a Python warning.
        with make_console(stderr=True).status(status), warnings.catch_warnings():
            warnings.simplefilter("ignore", PredictionWarning)
            budget_b = budget_bytes(budget, workload, ranks=config.ranks, device_type=args.device, note=_say)
            estimate = predict_memory(workload, config, device_type=args.device, note=_say)
    except PredictionError as e:
        if args.json:
            print(
                json.dumps({"workload": workload.name, "verified": False, "reason": str(e)}, indent=2), file=args.stdout
            )
        print(f"autotune predict: {e}", file=sys.stderr)
        return 1
    if args.export_deepspeed is not None:
        _export_deepspeed(args.export_deepspeed, workload, config, device_type=args.device)
    if args.json:  # with what it is of, as the error's JSON and measure's say
        about = {"workload": workload.name, "config": config.to_dict()}
        print(json.dumps({**about, **estimate.to_dict()}, indent=2), file=args.stdout)
    else:
        choice = workload.block_choice()
        blocks = choice.describe().removeprefix("blocks: ")
        make_console().print(estimate_table(workload.name, config, estimate, budget_b, blocks=blocks))
    if not estimate.verified and estimate.verification is not None:
        print(
            f"autotune predict: UNVERIFIED: {unverified_message(workload.name, estimate.verification)}", file=sys.stderr
        )
    return 0


def _say(line: str) -> None:
    """A phase's line on stderr (stdout holds the table or the JSON)."""
    print(line, file=sys.stderr)


def _check_writable(path: Path, *, flag: str) -> None:
    if path.is_dir():
        raise ConfigError(f"{flag}: {str(path)!r} is a directory; give a file path such as {str(path / 'ds.json')!r}.")
    parent = path.parent
    if not parent.is_dir():
        raise ConfigError(f"{flag}: cannot write {str(path)!r}: directory {str(parent)!r} does not exist.")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{flag}: cannot write {str(path)!r}: permission denied.")


def _export_deepspeed(path: Path, workload: Any, config: Any, *, device_type: str) -> None:
    import json

    from autotune.train.deepspeed_config import deepspeed_config

    ds = deepspeed_config(
        config,
        num_blocks=len(workload.block_names()),
        largest_parameter=workload.largest_parameter,
        device_type=device_type,
    )
    try:
        path.write_text(json.dumps(ds, indent=2) + "\n")
    except OSError as e:
        raise ConfigError(f"--export-deepspeed: cannot write {str(path)!r}: {e.strerror}.") from None
    from autotune.search.export import recompute_note

    note = recompute_note(config, num_blocks=len(workload.block_names()))
    if note is not None:  # JSON has no comments: what the file cannot say goes to stderr
        print(f"autotune predict: {note}", file=sys.stderr)
