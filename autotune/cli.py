"""The ``autotune`` command: thin commands over the library.

A user mistake (bad workload reference, bad config value) prints one line and exits with 2;
a configuration that fails to train exits with 1; no traceback either way.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, ConfigError, TrainingError

__all__ = ["main"]

# Modules that add subcommands: each has ``register(subparsers) -> None``, which adds its
# parsers and sets ``func`` (a handler taking the parsed args, returning the exit code). They
# must import only argparse-level code at module level, so ``autotune --help`` stays instant.
_COMMAND_MODULES: tuple[str, ...] = (
    "autotune.search.commands",
    "autotune.policies.commands",
    "autotune.adapt.commands",
)

#: Help of every ``--memory-budget`` (the syntax :func:`autotune.units.parse_memory_budget` reads).
BUDGET_HELP = "a size with a unit (2GiB, 512MiB, 100MB) or a percentage of the default configuration's peak (75%%)"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autotune")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        result: int = args.func(args)
        return result
    except TrainingError as e:
        print(f"autotune {args.command}: {e}", file=sys.stderr)
        return 1
    except AutotuneError as e:
        print(f"autotune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Measure and search PyTorch training configurations.")
    parser.add_argument("--version", action="version", version=f"autotune {_version()}", help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("workloads", help="list the built-in workloads with parameter counts")
    p.set_defaults(func=_cmd_workloads)

    p = sub.add_parser("measure", help="run a workload under one config and measure what it costs")
    p.add_argument(
        "--workload",
        "-w",
        required=True,
        help="built-in name, random:SEED, path/to/file.py:build or package.module:build",
    )
    _add_config_flags(p)
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps (default 8)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warmup steps (default 2)")
    p.add_argument("--memory-budget", help=f"{BUDGET_HELP}: a peak above it is reported as not fitting")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 or auto (default)")
    p.add_argument("--json", action="store_true", help="print the Measurement as JSON")
    p.set_defaults(func=_cmd_measure)

    p = sub.add_parser("predict", help="predict a config's peak memory per rank, by category, without running it")
    p.add_argument("--workload", "-w", required=True, help="as for measure")
    _add_config_flags(p)
    p.add_argument("--memory-budget", help=f"{BUDGET_HELP}: say whether the predicted peak fits")
    p.add_argument("--device", default="cpu", help="device kind the ranks would use: cpu (default) or cuda")
    p.add_argument("--export-deepspeed", type=Path, help="also write the DeepSpeed config JSON for these ranks here")
    p.add_argument("--json", action="store_true", help="print the MemoryEstimate as JSON")
    p.set_defaults(func=_cmd_predict)

    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser


def _add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TrainConfig JSON file; the flags below override it")
    p.add_argument("--micro-batch", type=int, help="micro-batch size (default 8)")
    p.add_argument("--accum", type=int, help="gradient-accumulation steps (default 1)")
    p.add_argument("--precision", help="fp32|bf16|fp16 for every block, or a comma list, one per block")
    p.add_argument("--checkpoint", help="none|all, or comma-separated block indices to recompute")
    p.add_argument("--zero-stage", type=int, help="DeepSpeed ZeRO stage 0-3")
    p.add_argument("--ranks", type=int, help="data-parallel ranks")


def _cmd_workloads(args: argparse.Namespace) -> int:
    from rich.console import Console

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
    Console().print(workloads_table(rows))
    return 0


def _cmd_measure(args: argparse.Namespace) -> int:
    from autotune.memory.model import budget_bytes
    from autotune.resolve import load_workload
    from autotune.train.local import resolve_device
    from autotune.units import parse_memory_budget

    budget = parse_memory_budget(args.memory_budget) if args.memory_budget else None
    device = resolve_device(args.device)  # no CUDA, or no such device: one line before any work
    workload = load_workload(args.workload)
    config = _config_from_args(args, num_blocks=len(workload.block_names()))
    budget_b = budget_bytes(budget, workload, ranks=config.ranks, device_type=device.type)

    from rich.console import Console

    from autotune.measurement import measure
    from autotune.report import measurement_table

    err = Console(stderr=True)
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
        print(m.to_json())
    else:
        Console().print(measurement_table(m))
    return 0


def _cmd_predict(args: argparse.Namespace) -> int:
    """Exit 0 with the estimate (verified or not: the output says which); exit 1 with one line
    (and, with ``--json``, ``{"verified": false, "reason": ...}``) if the model cannot be profiled."""
    import json
    import warnings

    from rich.console import Console

    from autotune.errors import PredictionError, PredictionWarning
    from autotune.memory.check import unverified_message
    from autotune.memory.model import budget_bytes, predict_memory
    from autotune.report import estimate_table
    from autotune.resolve import load_workload
    from autotune.units import parse_memory_budget

    budget = parse_memory_budget(args.memory_budget) if args.memory_budget else None
    if args.export_deepspeed is not None:
        _check_writable(args.export_deepspeed, flag="--export-deepspeed")  # before minutes of profiling
    workload = load_workload(args.workload)
    config = _config_from_args(args, num_blocks=len(workload.block_names()))
    status = f"profiling {workload.name} (fake tensors, then one real step to check)"
    try:
        # The check's warning is printed below as the command's own line, not as a Python warning.
        with Console(stderr=True).status(status), warnings.catch_warnings():
            warnings.simplefilter("ignore", PredictionWarning)
            budget_b = budget_bytes(budget, workload, ranks=config.ranks, device_type=args.device)
            estimate = predict_memory(workload, config, device_type=args.device)
    except PredictionError as e:
        if args.json:
            print(json.dumps({"workload": workload.name, "verified": False, "reason": str(e)}, indent=2))
        print(f"autotune predict: {e}", file=sys.stderr)
        return 1
    if args.export_deepspeed is not None:
        _export_deepspeed(args.export_deepspeed, workload, config, device_type=args.device)
    if args.json:
        print(estimate.to_json())
    else:
        Console().print(estimate_table(workload.name, config, estimate, budget_b))
    if not estimate.verified and estimate.verification is not None:
        print(
            f"autotune predict: UNVERIFIED: {unverified_message(workload.name, estimate.verification)}", file=sys.stderr
        )
    return 0


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


def _config_from_args(args: argparse.Namespace, *, num_blocks: int) -> Any:
    from autotune.config import TrainConfig

    config = TrainConfig()
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as e:
            raise ConfigError(f"--config: cannot read {str(args.config)!r}: {e.strerror}.") from None
        config = TrainConfig.from_json(text)
    overrides: dict[str, Any] = {}
    if args.micro_batch is not None:
        overrides["micro_batch_size"] = args.micro_batch
    if args.accum is not None:
        overrides["grad_accum_steps"] = args.accum
    if args.zero_stage is not None:
        overrides["zero_stage"] = args.zero_stage
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
    if args.precision is not None:
        parts = [s.strip() for s in args.precision.split(",")]
        overrides["precision"] = parts[0] if len(parts) == 1 else tuple(parts)
    if args.checkpoint is not None:
        overrides["checkpoint"] = _parse_checkpoint(args.checkpoint, num_blocks)
    return dataclasses.replace(config, **overrides)


def _parse_checkpoint(text: str, num_blocks: int) -> bool | tuple[bool, ...]:
    if text in ("none", "all"):
        return text == "all"
    try:
        indices = {int(s) for s in text.split(",")}
    except ValueError:
        raise ConfigError(
            f"--checkpoint must be none, all or comma-separated block indices, but got {text!r}."
        ) from None
    bad = sorted(i for i in indices if not 0 <= i < num_blocks)
    if bad:
        raise ConfigError(f"--checkpoint block indices must be in [0, {num_blocks - 1}], but got {bad[0]}.")
    return tuple(i in indices for i in range(num_blocks))


if __name__ == "__main__":
    sys.exit(main())
