"""Markdown notes that optuna-dashboard shows on each trial: config, memory by category,
throughput, gradient noise scale, and why an infeasible trial was stopped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from autotune.config import TrainConfig
from autotune.measurement.record import Measurement
from autotune.search.trial_record import ATTR
from autotune.units import format_bytes

__all__ = ["trial_note"]


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _knobs(config: TrainConfig) -> str:
    precision = config.precision if isinstance(config.precision, str) else ", ".join(config.precision)
    ckpt = (
        config.checkpoint
        if not isinstance(config.checkpoint, tuple)
        else "".join({True: "x", False: ".", "selective": "s"}[c] for c in config.checkpoint)  # s: selective
    )
    return (
        f"| micro-batch x accumulation x ranks | {config.micro_batch_size} x {config.grad_accum_steps} x "
        f"{config.ranks} = {config.effective_batch_size} |\n"
        f"| precision (per block) | {precision} |\n"
        f"| checkpointing (per block, x = recompute) | {ckpt} |\n"
        f"| ZeRO stage | {config.zero_stage} |\n"
    )


def trial_note(
    number: int,
    config: TrainConfig,
    *,
    status: str,
    reason: str | None,
    m: Measurement | None,
    attrs: Mapping[str, Any],
) -> str:
    """The note body of one trial."""
    title = f"## Trial {number}: {status}"
    if attrs.get(ATTR.BASELINE):
        title += f" (baseline: {attrs[ATTR.BASELINE]})"
    lines = [title, ""]
    if reason:
        lines += [f"**Why:** {reason}", ""]
    lines += ["| knob | value |", "|---|---|", _knobs(config)]
    if m is not None:
        cached = " (from the measurement cache)" if attrs.get(ATTR.CACHED) else ""
        lines += [
            f"### Measured{cached}",
            "",
            "| quantity | value |",
            "|---|---|",
            f"| throughput | {_fmt(m.throughput, '.1f')} samples/s (median of {m.steps} steps) |",
            f"| peak memory | {format_bytes(m.peak_bytes)} |",
            f"| throughput per GiB | {_fmt(m.throughput_per_gib, '.1f')} |",
            f"| gradient noise scale B_simple | {_fmt(m.noise.b_simple)} samples |",
            f"| statistical efficiency (Pollux) | {_fmt(attrs.get(ATTR.EFFICIENCY), '.3f')} |",
            "",
        ]
        if m.memory is not None:
            lines += ["### Memory by category (at peak)", "", "| category | bytes |", "|---|---|"]
            lines += [
                f"| {f.name.replace('_', ' ')} | {format_bytes(getattr(m.memory, f.name))} |" for f in fields(m.memory)
            ]
    return "\n".join(lines) + "\n"
