"""Whether torch.compile ranks configurations as eager training does: the evidence behind the
study's compile check timing every finalist, not only the eager recommendation.

For each corpus model, four configurations of its whole batch, each timed eager and compiled side
by side on its own training loop (:func:`autotune.measurement.compiled.compare_compiled`: warm-up,
interleaved rounds, median and spread; the compile seconds are what the compiled warm-up steps took
beyond the steady step): the PyTorch default (fp32, one micro-batch), Hugging Face's
``bf16=True`` + ``gradient_checkpointing=True`` (the whole model in bf16, every block recomputed,
one micro-batch), the whole model in bf16 in four micro-batches, and bf16 blocks with half of them
recomputed in two micro-batches (inductor's caches off, so that every compile is paid). Each
configuration's rank among the four, eager and compiled, by
samples/s: where the two orders differ, the best configuration compiled is not the best eager one
compiled.

Run (nothing else on the machine; a compile is tens of seconds on 2 cores, four per model):

    python benchmarks/compile_ranking.py --out build/compile-ranking [--models hf-gpt2,hf-llama]
        [--result docs/results/compile-ranking.json]

Writes ``compile_ranking.json`` and ``compile_ranking.md`` to ``--out``; with ``--result`` the
results page's record (``benchmarks/results.py``; then ``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

COLUMNS = (
    "model",
    "configuration",
    "eager samples/s",
    "compiled samples/s",
    "speedup",
    "compile, s",
    "rank eager",
    "rank compiled",
)


def configurations(batch: int, blocks: int) -> dict[str, Any]:
    """The four configurations of a workload's batch ``batch`` and ``blocks`` blocks."""
    from autotune import TrainConfig

    half = tuple(i < blocks // 2 for i in range(blocks))
    return {
        "fp32, 1 micro-batch (PyTorch default)": TrainConfig(micro_batch_size=batch),
        "bf16 whole model, every block recomputed, 1 micro-batch (HF bf16 + gc)": TrainConfig(
            micro_batch_size=batch, precision="bf16", outer_precision="bf16", checkpoint=True
        ),
        "bf16 whole model, 4 micro-batches": TrainConfig(
            micro_batch_size=batch // 4, grad_accum_steps=4, precision="bf16", outer_precision="bf16"
        ),
        "bf16 blocks, half recomputed, 2 micro-batches": TrainConfig(
            micro_batch_size=batch // 2, grad_accum_steps=2, precision="bf16", checkpoint=half
        ),
    }


def ranks(values: list[float]) -> list[int]:
    """Each value's rank, 1 for the largest.

    Example:
        >>> ranks([30.0, 50.0, 40.0])
        [3, 1, 2]
    """
    order = sorted(range(len(values)), key=lambda i: -values[i])
    out = [0] * len(values)
    for rank, i in enumerate(order, start=1):
        out[i] = rank
    return out


def run(models: list[str], *, rounds: int) -> list[dict[str, Any]]:
    import torch
    import torch._inductor.config

    from autotune import load_workload
    from autotune.measurement.compiled import compare_compiled

    torch._inductor.config.force_disable_caches = True
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    for name in models:
        workload = load_workload(name)
        measured = []
        for label, config in configurations(workload.batch_size, len(workload.block_names())).items():
            check = compare_compiled(workload, config, rounds=rounds, max_rounds=2 * rounds)
            measured.append((label, check))
            print(f"{name}: {label}: {check.eager.median:.1f} eager, {check.compiled.median:.1f} compiled", flush=True)
        eager = ranks([c.eager.median for _, c in measured])
        compiled = ranks([c.compiled.median for _, c in measured])
        for (label, check), e, c in zip(measured, eager, compiled, strict=True):
            rows.append(
                {
                    "model": name,
                    "configuration": label,
                    "eager": check.eager.median,
                    "eager_spread": check.eager.relative_spread,
                    "compiled": check.compiled.median,
                    "compiled_spread": check.compiled.relative_spread,
                    "speedup": check.speedup,
                    "compile_seconds": check.compile_seconds,
                    "recommended": check.recommended,
                    "rank_eager": e,
                    "rank_compiled": c,
                }
            )
    return rows


def table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    return [
        (
            r["model"],
            r["configuration"],
            f"{r['eager']:.1f} ({r['eager_spread']:.1%})",
            f"{r['compiled']:.1f} ({r['compiled_spread']:.1%})",
            f"{r['speedup']:.2f}",
            f"{r['compile_seconds']:.0f}",
            str(r["rank_eager"]),
            str(r["rank_compiled"]),
        )
        for r in rows
    ]


def write(out: Path, machine: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    from results import markdown_table

    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_ranking.json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    (out / "compile_ranking.md").write_text("\n".join(markdown_table(COLUMNS, table(rows))) + "\n")


def write_record(path: Path, machine: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the run (``benchmarks/results.py``)."""
    from results import machine_fields, write_result

    models = ", ".join(f"`{m}`" for m in dict.fromkeys(r["model"] for r in rows))
    write_result(
        path,
        title="torch.compile's ranking of configurations against eager's",
        claim=(
            f"{models} (built-in sizes): four configurations of the whole batch, each timed eager and compiled "
            "side by side (median samples/s and spread; compile seconds with inductor's caches off), and each "
            "one's rank among the four both ways. Compiling speeds them up by different factors, so the best "
            "configuration eager need not be the best compiled: the study's compile check times every finalist."
        ),
        **machine_fields(machine),
        command=command,
        columns=COLUMNS,
        rows=table(rows),
        note="One run: the speedups within a spread of each other are ties.",
    )


def main(argv: list[str] | None = None) -> int:
    from results import corpus_models, cpu_machine

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default="hf-gpt2,hf-llama", help="corpus models, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="side-by-side rounds at least (default 3)")
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, but got {args.rounds}")
    models = corpus_models(parser, args.models)
    machine = cpu_machine()
    rows = run(models, rounds=args.rounds)
    write(args.out, machine, rows)
    print("\n".join(f"{' | '.join(r)}" for r in table(rows)))
    if args.result is not None:
        from results import command_line

        write_record(args.result, machine, rows, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
