"""Arguments more than one command takes: the config flags and the memory budget's help."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.config import Checkpoint
    from autotune.measurement.objective import ObjectiveName

__all__ = [
    "BUDGET_HELP",
    "THREADS_HELP",
    "WORKLOAD_HELP",
    "add_config_flags",
    "add_min_micro_batch_flag",
    "add_objective_flag",
    "add_ranks_flag",
    "add_threads_flag",
    "add_workload_argument",
    "config_from_args",
    "min_micro_batch_of",
    "objective_arg",
    "set_threads",
    "warn_if_busy",
    "workload_of",
]

#: Help of every ``--memory-budget`` (the syntax :func:`autotune.units.parse_memory_budget` reads).
BUDGET_HELP = "a size with a unit (2GiB, 512MiB, 100MB) or a percentage of the default configuration's peak (75%%)"


#: Help of every ``--threads``: the choice, in one line (README "Threads and a busy machine").
THREADS_HELP = (
    "torch threads of the process that times steps (default: torch's, one per core); fewer than the cores "
    "when other processes run, else a step can time 10x slower"
)


#: Help of every workload argument.
WORKLOAD_HELP = "built-in name, random:SEED, path/to/file.py:build or package.module:build"


def add_workload_argument(p: argparse.ArgumentParser) -> None:
    """The workload of ``measure`` and ``predict``: positional, as every other command takes it,
    or ``--workload`` / ``-w`` (their earlier spelling, kept)."""
    p.add_argument("workload", nargs="?", metavar="WORKLOAD", help=WORKLOAD_HELP)
    p.add_argument("--workload", "-w", dest="workload_flag", metavar="WORKLOAD", help="the same, as a flag")


def workload_of(args: argparse.Namespace) -> str:
    """The workload :func:`add_workload_argument` read: one of its two spellings, given once."""
    given: list[str] = [w for w in (args.workload, args.workload_flag) if w is not None]
    if not given:
        raise ConfigError("a workload is required: WORKLOAD or --workload WORKLOAD.")
    if len(given) == 2 and given[0] != given[1]:
        raise ConfigError(f"two workloads given: {given[0]!r} and --workload {given[1]!r}; give one.")
    return given[0]


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """``--threads N`` of the commands that time steps in this process (``tune``, ``train``)."""
    p.add_argument("--threads", type=int, help=THREADS_HELP)


def set_threads(threads: int | None, *, ranks: int = 1) -> int:
    """Apply ``--threads`` (None: torch's default) to this process; the threads that will time
    steps. With ``ranks`` > 1 the ranks split the cores among themselves (one share each, set in
    their environment), so ``--threads`` is refused and all the cores are counted."""
    import os

    import torch

    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be >= 1, but got {threads}.")
        if ranks > 1:
            raise ConfigError(
                f"--threads needs one process (--ranks 1): {ranks} ranks share the cores, one share each."
            )
        torch.set_num_threads(threads)
    if ranks > 1:
        return os.cpu_count() or 1
    return int(torch.get_num_threads())


def warn_if_busy(threads: int | None) -> None:
    """The busy-machine line (:mod:`autotune.measurement.busy`) on stderr, once, before the command
    times a step; ``threads`` None: torch's default in a fresh process (the measuring child's)."""
    import sys

    from autotune.measurement import busy

    if threads is None:
        import torch

        threads = int(torch.get_num_threads())
    busy.warn_if_busy(threads, lambda line: print(line, file=sys.stderr))


#: Help of every ``--min-micro-batch`` (``Workload.min_micro_batch``).
MIN_MICRO_BATCH_HELP = (
    "smallest micro-batch a split of the batch may take (default: 1, except for a model with BatchNorm layers "
    "in training, whose statistics are the micro-batch's: then no accumulation)"
)


def add_min_micro_batch_flag(p: argparse.ArgumentParser) -> None:
    """``--min-micro-batch N`` of the commands that split the batch (``study``, ``tune``, ``train``)."""
    p.add_argument("--min-micro-batch", type=int, help=MIN_MICRO_BATCH_HELP)


def min_micro_batch_of(args: argparse.Namespace) -> int | None:
    """``--min-micro-batch``, checked (None: not given)."""
    value: int | None = args.min_micro_batch
    if value is not None and value < 1:
        raise ConfigError(f"--min-micro-batch must be >= 1, but got {value}.")
    return value


#: Help of every ``--objective`` (:data:`autotune.measurement.objective.OBJECTIVES`).
OBJECTIVE_HELP = (
    "which configuration within the memory budget is best: per-gib, the most samples/s per GiB of peak (fits more "
    "jobs or longer sequences on a GPU), or throughput, the most samples/s (one dedicated GPU)"
)


def add_objective_flag(p: argparse.ArgumentParser, *, default: str = "per-gib", prefix: str = "") -> None:
    """``--objective per-gib|throughput`` of the commands that pick a configuration (``study``,
    ``tune``, ``train --adapt``); checked by :func:`objective_arg` (one line, exit 2), not by
    argparse's choices (a usage block)."""
    help_text = f"{prefix}{OBJECTIVE_HELP} (default {default})"
    p.add_argument("--objective", metavar="per-gib|throughput", help=help_text)


def objective_arg(args: argparse.Namespace) -> ObjectiveName:
    """``--objective``, checked (not given: the default, per GiB)."""
    from autotune.measurement.objective import DEFAULT_OBJECTIVE, check_objective

    return DEFAULT_OBJECTIVE if args.objective is None else check_objective(args.objective)


def add_ranks_flag(p: argparse.ArgumentParser) -> None:
    """``--ranks N`` of the commands that train as they tune (``tune``, ``train --adapt``)."""
    help_text = "data-parallel DeepSpeed ranks (> 1: the ZeRO stage is a live knob; needs deepspeed; default 1)"
    p.add_argument("--ranks", type=int, default=1, help=help_text)


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TrainConfig JSON file; the flags below override it")
    p.add_argument(
        "--micro-batch",
        type=int,
        help="micro-batch size (default: the workload's batch over --accum and --ranks, one micro-batch each)",
    )
    p.add_argument("--accum", type=int, help="gradient-accumulation steps (default 1)")
    p.add_argument("--precision", help="fp32|bf16|fp16 for every block, or a comma list, one per block")
    p.add_argument(
        "--outer-precision",
        help="fp32|bf16|fp16 for the rest of the model (embeddings, head, loss): bf16 with --precision bf16 "
        "is Hugging Face's bf16=True",
    )
    p.add_argument(
        "--checkpoint",
        help="none|all|selective for every block, or comma-separated block indices to recompute whole, "
        "I:selective for block I recomputed selectively (e.g. 0,1,4:selective)",
    )
    p.add_argument("--zero-stage", type=int, help="DeepSpeed ZeRO stage 0-3")
    p.add_argument("--ranks", type=int, help="data-parallel ranks")


def config_from_args(args: argparse.Namespace, *, num_blocks: int, batch_size: int, workload: str) -> Any:
    """The configuration ``predict`` and ``measure`` run: ``--config``, then the flags over it.

    Without a micro-batch (neither ``--micro-batch`` nor one in ``--config``), the workload's own
    batch: ``batch_size`` split over the ranks and the accumulation steps (the PyTorch default
    at ``--ranks 1``), so the answer is about the training the workload describes.

    Raises:
        ConfigError: ``--config`` unreadable, or the batch does not divide as asked.
    """
    import json

    from autotune.config import TrainConfig

    config = TrainConfig()
    given: dict[str, Any] = {}
    if args.config is not None:
        try:
            text = args.config.read_text()
        except OSError as e:
            raise ConfigError(f"--config: cannot read {str(args.config)!r}: {e.strerror}.") from None
        config = TrainConfig.from_json(text)
        given = json.loads(text)
    overrides: dict[str, Any] = {}
    if args.micro_batch is not None:
        overrides["micro_batch_size"] = args.micro_batch
    elif "micro_batch_size" not in given:
        accum = args.accum if args.accum is not None else config.grad_accum_steps
        ranks = args.ranks if args.ranks is not None else config.ranks
        if accum >= 1 and ranks >= 1:  # else TrainConfig says what is wrong with them
            if batch_size % (accum * ranks):  # a batch below accum x ranks included
                raise ConfigError(
                    f"the batch of workload {workload!r} ({batch_size}) does not split evenly into {accum} "
                    f"accumulation step(s) x {ranks} rank(s): give --micro-batch."
                )
            overrides["micro_batch_size"] = batch_size // (accum * ranks)
    if args.accum is not None:
        overrides["grad_accum_steps"] = args.accum
    if args.zero_stage is not None:
        overrides["zero_stage"] = args.zero_stage
    if args.ranks is not None:
        overrides["ranks"] = args.ranks
    if args.precision is not None:
        parts = [s.strip() for s in args.precision.split(",")]
        overrides["precision"] = parts[0] if len(parts) == 1 else tuple(parts)
    if args.outer_precision is not None:
        overrides["outer_precision"] = args.outer_precision  # TrainConfig validates it
    if args.checkpoint is not None:
        overrides["checkpoint"] = _parse_checkpoint(args.checkpoint, num_blocks)
    return dataclasses.replace(config, **overrides)


def _parse_checkpoint(text: str, num_blocks: int) -> Checkpoint | tuple[Checkpoint, ...]:
    if text in ("none", "all"):
        return text == "all"
    if text == "selective":
        return "selective"
    levels: dict[int, Checkpoint] = {}
    for item in text.split(","):
        index, _, level = item.strip().partition(":")
        if level not in ("", "selective") or not index.strip().lstrip("-").isdigit():
            raise ConfigError(
                "--checkpoint must be none, all, selective or comma-separated block indices (I or I:selective), "
                f"but got {text!r}."
            )
        levels[int(index)] = "selective" if level else True
    bad = sorted(i for i in levels if not 0 <= i < num_blocks)
    if bad:
        raise ConfigError(f"--checkpoint block indices must be in [0, {num_blocks - 1}], but got {bad[0]}.")
    return tuple(levels.get(i, False) for i in range(num_blocks))
