"""Human-readable tables (rich) of measurements and workloads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import TYPE_CHECKING

from rich.table import Table

from autotune.measurement.record import Measurement, MemoryBreakdown
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.config import TrainConfig
    from autotune.memory.model import MemoryEstimate

__all__ = ["estimate_table", "measurement_table", "workloads_table"]


def _num(x: float | None, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


def measurement_table(m: Measurement) -> Table:
    """One measurement as a two-column table: what was measured, and its value."""
    c = m.config
    title = f"{m.workload} on {m.device}: {m.status}" + (f" ({m.reason})" if m.reason else "")
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("quantity")
    table.add_column("value", justify="right")
    table.add_column("note")
    precision = c.precision if isinstance(c.precision, str) else ",".join(c.precision)
    # Per block: 1 recomputed whole, 0 not, s selectively.
    ckpt = (
        c.checkpoint
        if not isinstance(c.checkpoint, tuple)
        else ",".join({True: "1", False: "0", "selective": "s"}[x] for x in c.checkpoint)
    )
    table.add_row(
        "config",
        f"micro {c.micro_batch_size} x accum {c.grad_accum_steps} x ranks {c.ranks}",
        f"precision {precision}, checkpoint {ckpt}, ZeRO {c.zero_stage}",
    )
    table.add_row(
        "throughput",
        f"{_num(m.throughput, '.1f')} samples/s",
        f"median of {m.steps} steps, IQR {_num(m.throughput_p25, '.1f')}-{_num(m.throughput_p75, '.1f')}",
    )
    table.add_row("step time", f"{_num(m.step_seconds and m.step_seconds * 1e3, '.1f')} ms", "median")
    table.add_row("peak memory", format_bytes(m.peak_bytes), "tensor bytes, exact (by storage)")
    table.add_row("throughput per GiB", f"{_num(m.throughput_per_gib, '.1f')}", "samples/s per GiB of peak")
    _memory_rows(table, m)
    n = m.noise
    table.add_row(
        "gradient noise scale", _num(n.b_simple, ".4g"), f"B_simple = tr(Sigma)/|G|^2, samples; {n.steps} steps pooled"
    )
    table.add_row("  tr(Sigma)", _num(n.trace_sigma), "per-sample gradient variance")
    table.add_row("  |G|^2", _num(n.grad_sq_norm), "squared true-gradient norm")
    table.add_row("  sigma^2", _num(n.sigma2), "micro-batch gradient variance (seed eq. 7)")
    if m.losses:
        table.add_row("loss", f"{m.losses[0]:.4g} -> {m.losses[-1]:.4g}", f"{len(m.losses)} optimizer steps")
    table.add_row("loss slope", _num(m.loss_slope, ".3g"), "per step, EMA-smoothed")
    if c.uses_fp16:
        table.add_row("fp16 overflow steps", str(m.overflow_steps), "skipped by the loss scaler")
    table.add_row("learning rate", _num(m.lr, ".3g"), f"{c.lr_scaling} scaling, {c.lr_schedule}")
    return table


def _memory_rows(table: Table, m: Measurement) -> None:
    """The memory rows below the peak: each category, each rank, the CUDA allocator, the budget."""
    if m.memory is not None and m.category_peaks is not None:
        for f in fields(m.memory):
            at_peak, own = getattr(m.memory, f.name), getattr(m.category_peaks, f.name)
            if at_peak or own:
                table.add_row(
                    f"  {f.name.replace('_', ' ')}", format_bytes(at_peak), f"at peak; own max {format_bytes(own)}"
                )
    for r in m.per_rank:
        held = "-" if r.resident is None else _states(r.resident)
        peak = "-" if r.memory is None else format_bytes(r.memory.total)
        table.add_row(
            f"rank {r.rank}",
            peak,
            f"peak; between steps: {held}; {_num(r.throughput, '.1f')} samples/s",
        )
    if m.allocator is not None:
        a = m.allocator
        table.add_row("allocated peak", format_bytes(a.allocated_peak), "CUDA allocator: live tensor blocks")
        table.add_row("reserved peak", format_bytes(a.reserved_peak), "CUDA allocator: segments held (what runs out)")
        table.add_row("allocator retries", str(a.alloc_retries), f"cache flushed and retried; {a.ooms} OOMs so far")
    elif m.device_peak_bytes is not None:
        table.add_row("allocator peak", format_bytes(m.device_peak_bytes), "torch.cuda.max_memory_allocated")
    if m.memory_budget is not None:
        table.add_row(
            "memory budget", format_bytes(m.memory_budget), "fits" if m.status != "over_budget" else "DOES NOT FIT"
        )


def _states(b: MemoryBreakdown) -> str:
    """What ZeRO partitions, in one line: parameters, gradients, optimizer state (+ DeepSpeed buffers)."""
    parts = [f"params {format_bytes(b.parameters)}", f"grads {format_bytes(b.gradients)}"]
    parts.append(f"optimizer {format_bytes(b.optimizer_state)}")
    if b.other:
        parts.append(f"buffers {format_bytes(b.other)}")
    return ", ".join(parts)


def estimate_table(
    workload: str, config: TrainConfig, e: MemoryEstimate, budget: int | None, *, blocks: str | None = None
) -> Table:
    """A memory prediction as a table: the peak per rank and its categories; ``blocks``: which
    modules are the blocks and why (:meth:`autotune.block_detection.BlockChoice.describe` without its
    ``blocks:``)."""
    c = config
    table = Table(title=f"{workload}: predicted peak per rank at {e.ranks} ranks (not measured)", header_style="bold")
    table.add_column("quantity")
    table.add_column("bytes", justify="right")
    table.add_column("note")
    table.add_row(
        "config",
        f"micro {c.micro_batch_size} x accum {c.grad_accum_steps} x ranks {e.ranks}",
        f"ZeRO {c.zero_stage}, precision {c.precision if isinstance(c.precision, str) else ','.join(c.precision)}",
    )
    if blocks is not None:
        table.add_row("blocks", "", blocks)
    table.add_row("peak", format_bytes(e.total), f"during the {e.phase}")
    for f in ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "buffers", "other"):
        value = getattr(e, f)
        if value:
            table.add_row(f"  {f.replace('_', ' ')}", format_bytes(value), "")
    if e.worst_case:
        table.add_row("batch", "", e.worst_case)
    v = e.verification
    if v is None:
        table.add_row("verified", "no", "not checked against a real step")
    else:
        from autotune.memory.check_text import describe_check

        if v.kind in ("composition", "unchecked"):
            note = f"{v.reason}"
        else:
            measured = "step failed" if v.measured is None else format_bytes(v.measured)
            note = f"{describe_check(v)}: predicted {format_bytes(v.predicted)}, measured {measured}"
        # A check stands for the device type its step ran on: the row names it.
        table.add_row("verified", f"yes, on {v.device}" if v.verified else f"NO (UNVERIFIED on {v.device})", note)
    if budget is not None:
        verdict = "fits" if e.fits(budget) else "DOES NOT FIT"
        table.add_row(
            "memory budget", format_bytes(budget), verdict if e.verified else f"{verdict} (UNVERIFIED prediction)"
        )
    return table


def workloads_table(rows: Sequence[tuple[str, str, str, str, str, str]]) -> Table:
    """Rows of (name, source, parameters, blocks, reference batch, description), already formatted
    (a workload whose library is missing shows what to install instead of its counts)."""
    table = Table(title="built-in workloads", header_style="bold")
    for col, justify in (
        ("name", "left"),
        ("source", "left"),
        ("parameters", "right"),
        ("blocks", "right"),
        ("batch", "right"),
        ("description", "left"),
    ):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*row)  # plain text: the consoles print no markup (autotune.console)
    return table
