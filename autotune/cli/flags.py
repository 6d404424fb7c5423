"""Arguments more than one command takes: the config flags and the memory budget's help."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from autotune.errors import ConfigError

__all__ = ["BUDGET_HELP", "add_config_flags", "add_ranks_flag", "config_from_args"]

#: Help of every ``--memory-budget`` (the syntax :func:`autotune.units.parse_memory_budget` reads).
BUDGET_HELP = "a size with a unit (2GiB, 512MiB, 100MB) or a percentage of the default configuration's peak (75%%)"


def add_ranks_flag(p: argparse.ArgumentParser) -> None:
    """``--ranks N`` of the commands that train as they tune (``tune``, ``train --adapt``)."""
    help_text = "data-parallel DeepSpeed ranks (> 1: the ZeRO stage is a live knob; needs deepspeed; default 1)"
    p.add_argument("--ranks", type=int, default=1, help=help_text)


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TrainConfig JSON file; the flags below override it")
    p.add_argument("--micro-batch", type=int, help="micro-batch size (default 8)")
    p.add_argument("--accum", type=int, help="gradient-accumulation steps (default 1)")
    p.add_argument("--precision", help="fp32|bf16|fp16 for every block, or a comma list, one per block")
    p.add_argument("--checkpoint", help="none|all, or comma-separated block indices to recompute")
    p.add_argument("--zero-stage", type=int, help="DeepSpeed ZeRO stage 0-3")
    p.add_argument("--ranks", type=int, help="data-parallel ranks")


def config_from_args(args: argparse.Namespace, *, num_blocks: int) -> Any:
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
