"""What the outer precision gives on the corpus' language models: the blocks in bf16 with the rest
of the model (embeddings, final norm, head, loss) in fp32, against the whole model in bf16, each
with and without every block recomputed, beside the PyTorch default; speed side by side, memory
exact.

For each model the configurations are re-timed side by side on one training loop
(``autotune.measurement.sidebyside.retime_configs``: interleaved rounds, median samples/s and its
spread) and their peaks measured exactly (``autotune.measure``'s tracked step). The ratios that
matter are within one run: outer bf16 / outer fp32 at the same blocks.

Run (nothing else on the machine):

    python benchmarks/outer_precision.py --out build/outer [--models hf-gpt2,hf-llama,lstm-lm,gru-lm]

Writes ``outer_precision.json`` and ``outer_precision.md`` to ``--out``, rewritten after each model,
and with ``--result docs/results/outer-precision.json`` the results page's record of the first table
(``benchmarks/results.py``; then ``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MODELS = ("hf-gpt2", "hf-llama", "lstm-lm", "gru-lm")


def configurations(batch: int) -> dict[str, Any]:
    """The PyTorch default, and the blocks in bf16 with the rest in fp32 or bf16, plain or recomputed."""
    from autotune import TrainConfig

    return {
        "fp32 (PyTorch default)": TrainConfig(micro_batch_size=batch),
        "blocks bf16, outer fp32": TrainConfig(micro_batch_size=batch, precision="bf16"),
        "blocks bf16, outer bf16": TrainConfig(micro_batch_size=batch, precision="bf16", outer_precision="bf16"),
        "blocks bf16 recomputed, outer fp32": TrainConfig(micro_batch_size=batch, precision="bf16", checkpoint=True),
        "blocks bf16 recomputed, outer bf16": TrainConfig(
            micro_batch_size=batch, precision="bf16", checkpoint=True, outer_precision="bf16"
        ),
    }


def run_model(name: str, *, rounds: int) -> dict[str, Any]:
    from autotune import measure
    from autotune.measurement.sidebyside import retime_configs
    from autotune.resolve import load_workload

    workload = load_workload(name)
    configs = configurations(workload.batch_size)
    peaks = {}
    for label, config in configs.items():
        m = measure(workload, config, steps=1, warmup=1)
        peaks[label] = m.peak_bytes if m.ok else None
    timed = retime_configs(workload, list(configs.values()), rounds=rounds, max_rounds=rounds)
    rows = []
    for (label, config), timing in zip(configs.items(), timed.timings, strict=True):
        peak = peaks[label]
        rows.append(
            {
                "config": label,
                "describe": config.describe(),
                "samples/s": round(timing.median, 2),
                "spread": round(timing.relative_spread, 4),
                "peak_bytes": peak,
                "per GiB": None if not peak else round(timing.median / (peak / 2**30), 2),
            }
        )
    by = {r["config"]: r for r in rows}

    def ratio(a: str, b: str, key: str) -> float | None:
        x, y = by[a][key], by[b][key]
        return None if not x or not y else round(x / y, 3)

    return {
        "model": name,
        "batch_size": workload.batch_size,
        "rows": rows,
        "outer_bf16_speed": ratio("blocks bf16, outer bf16", "blocks bf16, outer fp32", "samples/s"),
        "outer_bf16_speed_recomputed": ratio(
            "blocks bf16 recomputed, outer bf16", "blocks bf16 recomputed, outer fp32", "samples/s"
        ),
        "outer_bf16_memory": ratio("blocks bf16, outer bf16", "blocks bf16, outer fp32", "peak_bytes"),
        "outer_bf16_memory_recomputed": ratio(
            "blocks bf16 recomputed, outer bf16", "blocks bf16 recomputed, outer fp32", "peak_bytes"
        ),
    }


def write(out: Path, machine: dict[str, Any], results: list[dict[str, Any]]) -> None:
    (out / "outer_precision.json").write_text(json.dumps({"machine": machine, "models": results}, indent=2) + "\n")
    lines = [
        f"# Outer precision ({machine['date']}, CPU capability {machine['capability']}, {machine['threads']} threads)",
        "",
        "| model | configuration | samples/s (spread) | peak MiB | samples/s per GiB |",
        "|---|---|---|---|---|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in table(results)]
    lines += [
        "",
        "| model | outer bf16 / outer fp32: speed | recomputed: speed | peak | recomputed: peak |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['outer_bf16_speed']} | {r['outer_bf16_speed_recomputed']} | "
            f"{r['outer_bf16_memory']} | {r['outer_bf16_memory_recomputed']} |"
        )
    (out / "outer_precision.md").write_text("\n".join(lines) + "\n")


def table(results: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The rows of the first table: model, configuration, samples/s (spread), peak MiB, per GiB."""
    out = []
    for r in results:
        for row in r["rows"]:
            peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.1f}"
            out.append(
                (r["model"], row["config"], f"{row['samples/s']} ({row['spread']:.1%})", peak, str(row["per GiB"]))
            )
    return out


def write_record(path: Path, machine: dict[str, Any], results: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the first table (``benchmarks/results.py``), the recipe charted."""
    from results import Chart, write_result

    write_result(
        path,
        title="The Hugging Face recipe against the PyTorch default",
        claim=(
            "The blocks in bf16 with the rest of the model (embeddings, final norm, head, loss) in fp32, against the "
            'whole model in bf16 (`TrainConfig.outer_precision="bf16"`, what Hugging Face\'s `bf16=True` does), '
            'plain and with every block recomputed, beside the PyTorch default (fp32). "blocks bf16 recomputed, '
            'outer bf16" is the recipe users run (`bf16=True` with gradient checkpointing). Samples/s re-timed side '
            "by side on one loop (interleaved rounds, median and spread), peaks exact."
        ),
        machine=f"{machine['cores']} cores, {machine['threads']} torch threads",
        capability=f"CPU `{machine['capability']}`",
        date=machine["date"],
        command=command,
        columns=("model", "configuration", "samples/s (spread)", "peak MiB", "samples/s per GiB"),
        rows=table(results),
        chart=Chart(
            group="model",
            series="configuration",
            value="samples/s per GiB",
            baseline="fp32 (PyTorch default)",
            shown=(
                "fp32 (PyTorch default)",
                "blocks bf16 recomputed, outer bf16",
                "blocks bf16 recomputed, outer fp32",
            ),
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    machine = {
        "date": time.strftime("%Y-%m-%d"),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
    }
    results = []
    for name in args.models.split(","):
        results.append(run_model(name, rounds=args.rounds))
        print(f"{name}: speed x{results[-1]['outer_bf16_speed']}, peak x{results[-1]['outer_bf16_memory']}", flush=True)
        write(args.out, machine, results)
    if args.result is not None:
        from results import command_line

        command = command_line(__file__, argv)
        write_record(args.result, machine, results, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
