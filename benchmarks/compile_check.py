"""The compiler's own recompute knob against per-block recompute: ``activation_memory_budget``
(``torch._functorch.config``) as the recompute setting of a compiled configuration, on the corpus'
smallest transformer decoder (``stream-lm``: a GPT LM of fixed context, so one compile per
configuration).

Configurations, each on its own training loop of a copy of the model: eager with no recompute and
with full recompute of every block; compiled with none, with the budget at 0.5 and 0.1 (the min-cut
partitioner saves at most that share of what it saves by default and recomputes the rest: one
number for the whole graph), and with per-block full recompute. For each:

* memory, exact on the CPU (:func:`autotune.measurement.compiled.compiled_step_memory`, no
  dispatch mode, so a compiled step runs compiled): the bytes saved for backward and the CPU
  allocator's peak of the step;
* samples/s side by side (:func:`autotune.measurement.sidebyside.retime`: warm-up, interleaved
  rounds, median and spread) and compile seconds (what the warm-up steps took beyond the steady
  step; inductor's caches are off so that every compile is paid).

The budget is applied where the partitioner reads it, at compile time: each budget compiles
through its own backend, which patches the setting around inductor's compile (a patch around a
later step changes nothing; a backend of its own also keeps Dynamo from serving one budget's
graph to another's loop).

Run (nothing else on the machine; minutes):

    python benchmarks/compile_check.py --out build/compile-check [--result docs/results/compile-check.json]

``--tiny`` builds the model at its test size with one round (a check that the script runs: its
memory figures are exact, its times are not a benchmark). Writes ``compile_check.json`` and
``compile_check.md`` to ``--out``; with ``--result`` the results page's record
(``benchmarks/results.py``; then ``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODEL = "stream-lm"
BUDGETS = (0.5, 0.1)
MIB = 2**20


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One configuration of the comparison: the block knobs, compiled or not, and the budget."""

    label: str
    checkpoint: bool
    compiled: bool
    budget: float | None = None


VARIANTS = (
    Variant(label="eager, no recompute", checkpoint=False, compiled=False),
    Variant(label="eager, full recompute", checkpoint=True, compiled=False),
    Variant(label="compiled, no recompute", checkpoint=False, compiled=True),
    *(Variant(label=f"compiled, budget {b}", checkpoint=False, compiled=True, budget=b) for b in BUDGETS),
    Variant(label="compiled, full recompute", checkpoint=True, compiled=True),
)


def budget_backend(budget: float) -> Callable[..., Any]:
    """A torch.compile backend: inductor with ``activation_memory_budget`` set while it compiles
    (AOTAutograd partitions forward and backward there)."""
    import torch
    from torch._inductor.compile_fx import compile_fx

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)

    return backend


def run(*, tiny: bool, rounds: int) -> list[dict[str, Any]]:
    """Every variant's memory, samples/s and compile seconds (one row each, VARIANTS' order)."""
    import torch

    from autotune.measurement.compiled import compiled_step_memory, payback_steps
    from autotune.measurement.sidebyside import retime
    from autotune.zoo import CORPUS

    # Every compile paid, none served from disk (torch warns that this also turns off its profile-
    # guided dynamic shapes, which a fixed-shape model does not use).
    warnings.filterwarnings("ignore", message="dynamo_pgo force disabled", category=UserWarning)
    torch._inductor.config.force_disable_caches = True
    entry = CORPUS[MODEL]
    workload = entry.build(**(entry.tiny if tiny else entry.sizes))
    trainers = [_trainer(workload, v) for v in VARIANTS]
    seconds: list[list[float]] = [[] for _ in VARIANTS]

    def step(i: int) -> tuple[int, float]:
        r = trainers[i].step()
        seconds[i].append(r.seconds)
        return r.samples, r.seconds

    try:
        steps = [lambda i=i: step(i) for i in range(len(VARIANTS))]
        retimed = retime(steps, rounds=rounds, max_rounds=rounds, steps_per_round=1 if tiny else 2)
        memory = [compiled_step_memory(t) for t in trainers]
    finally:
        for t in trainers:
            t.close()
    rows = []
    eager_step = workload.batch_size / retimed.timings[0].median
    for i, variant in enumerate(VARIANTS):
        timing = retimed.timings[i]
        step_seconds = workload.batch_size / timing.median
        compile_seconds = sum(max(0.0, s - step_seconds) for s in seconds[i][: retimed.warmup[i]])
        rows.append(
            {
                "configuration": variant.label,
                "checkpoint": variant.checkpoint,
                "compiled": variant.compiled,
                "budget": variant.budget,
                "saved_bytes": memory[i].saved,
                "allocated_peak_bytes": memory[i].allocated_peak,
                "samples_per_s": round(timing.median, 3),
                "spread": round(timing.relative_spread, 4),
                "compile_seconds": round(compile_seconds, 1) if variant.compiled else None,
                "payback_steps": None
                if not variant.compiled
                else payback_steps(compile_seconds=compile_seconds, eager_step=eager_step, compiled_step=step_seconds),
            }
        )
    return rows


def _trainer(workload: Any, variant: Variant) -> Any:
    """``variant``'s loop: autotune's Trainer, or for a budget :class:`BudgetTrainer`."""
    from autotune import TrainConfig

    compile_mode = "default" if variant.compiled and variant.budget is None else "none"
    config = TrainConfig(micro_batch_size=workload.batch_size, checkpoint=variant.checkpoint, compile=compile_mode)
    if variant.budget is None:
        from autotune.train.local import Trainer

        return Trainer(workload, config)
    return _budget_trainer_class()(workload, config, budget=variant.budget)


def _budget_trainer_class() -> type:
    import torch

    from autotune.train.local import Trainer

    class BudgetTrainer(Trainer):
        """autotune's Trainer whose step calls the model compiled through :func:`budget_backend`
        (TrainConfig has no budget: whether it gets one waits for this benchmark's figures)."""

        def __init__(self, *args: Any, budget: float, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.budget_compiled = torch.compile(self.model, backend=budget_backend(budget))

        @property
        def forward_model(self) -> torch.nn.Module:
            return self.model if self._eager else self.budget_compiled

    return BudgetTrainer


def write(out: Path, machine: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """``compile_check.json`` (machine and rows) and ``compile_check.md`` (the table) in ``out``."""
    from results import markdown_table

    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_check.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    lines = [
        f"# activation_memory_budget against per-block recompute ({machine['date']}, {machine['model']}, "
        f"CPU capability {machine['capability']}, {machine['threads']} threads, "
        f"{'tiny size' if machine['tiny'] else 'built-in size'})",
        "",
        *markdown_table(COLUMNS, table(rows)),
    ]
    (out / "compile_check.md").write_text("\n".join(lines) + "\n")


COLUMNS = ("configuration", "saved for backward, MiB", "step peak, MiB", "samples/s (spread)", "compile, s")


def table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The table's cells, as text: the same in the Markdown file and the results record."""
    cells = []
    for r in rows:
        peak = r["allocated_peak_bytes"]
        cells.append(
            (
                r["configuration"],
                f"{r['saved_bytes'] / MIB:.2f}",
                "-" if peak is None else f"{peak / MIB:.2f}",
                f"{r['samples_per_s']:.2f} ({r['spread']:.1%})",
                "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.1f}",
            )
        )
    return cells


def write_record(path: Path, machine: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the run (``benchmarks/results.py``)."""
    from results import write_result

    write_result(
        path,
        title="torch.compile's activation memory budget against per-block recompute",
        claim=(
            f"`{machine['model']}` ({'tiny size' if machine['tiny'] else 'built-in size'}, fp32) eager and compiled: "
            "the bytes saved for backward (exact) and the step's allocator peak (the profiler's, "
            "`compiled_step_memory`), samples/s side by side and compile seconds, with no recompute, per-block "
            "full recompute, and the compiler's "
            "`activation_memory_budget` at " + " and ".join(str(b) for b in BUDGETS) + "."
        ),
        machine=f"{machine['cpu']}, {machine['cores']} cores, {machine['threads']} threads",
        capability=f"CPU `{machine['capability']}`",
        date=machine["date"],
        command=command,
        columns=COLUMNS,
        rows=table(rows),
        note="The step peak counts what the step allocates over what was held before it (the weights and the "
        "optimizer's state are not in it).",
    )


def machine_info(*, tiny: bool) -> dict[str, Any]:
    import torch
    from results import cpu_name

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "model": MODEL,
        "tiny": tiny,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--rounds", type=int, default=5, help="side-by-side rounds (default 5)")
    parser.add_argument("--tiny", action="store_true", help="the model at its test size, one round (a check)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, but got {args.rounds}")
    machine = machine_info(tiny=args.tiny)
    rows = run(tiny=args.tiny, rounds=1 if args.tiny else args.rounds)
    write(args.out, machine, rows)
    for r in rows:
        peak = r["allocated_peak_bytes"]
        print(
            f"{r['configuration']}: saved {r['saved_bytes']:,} B, step peak {'-' if peak is None else f'{peak:,} B'}",
            flush=True,
        )
    if args.result is not None:
        from results import command_line

        command = command_line(__file__, argv)
        write_record(args.result, machine, rows, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
