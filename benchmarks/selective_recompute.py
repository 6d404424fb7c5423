"""What selective recompute gives on the corpus' language models and the ViT: every block kept
(none), recomputed selectively (its matmul-like outputs kept, the rest recomputed) or recomputed
whole (full), in fp32 and with bf16 blocks; peak memory exact, speed side by side.

For each model the configurations' peaks are measured exactly (``autotune.measure``'s tracked
step) next to the memory model's prediction (``predict_memory``, its profile with the selective
runs), and the configurations are re-timed side by side on one training loop
(``autotune.measurement.sidebyside.retime_configs``: interleaved rounds, median samples/s and its
spread). The ratios that matter are within one model and precision: selective / none and
selective / full, in peak and in samples/s.

Run (nothing else on the machine):

    python benchmarks/selective_recompute.py --out build/selective

``--models`` picks corpus models (default: every corpus language model and ``hf-vit``),
``--tiny`` builds each at its test size, ``--memory-only`` skips the timing (a check that the
script runs, not a benchmark). Writes ``selective_recompute.json`` and ``selective_recompute.md``
to ``--out``, rewritten after each model; ``--result docs/results/selective-recompute.json`` also
writes the results page's record (``benchmarks/results.py``; then
``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

#: The corpus' language models (causal, masked, encoder-decoder, recurrent, padded, streamed,
#: frozen, LoRA) and the ViT.
MODELS = (
    "hf-gpt2",
    "hf-bert",
    "hf-llama",
    "hf-t5",
    "lstm-lm",
    "gru-lm",
    "varlen-lm",
    "stream-lm",
    "frozen-backbone",
    "lora-lm",
    "hf-vit",
)
LEVELS = {"none": False, "selective": "selective", "full": True}


def configurations(batch: int) -> dict[str, Any]:
    """Each recompute level on every block, with fp32 and with bf16 blocks."""
    from autotune import TrainConfig

    return {
        f"{precision} blocks, {level}": TrainConfig(micro_batch_size=batch, precision=precision, checkpoint=value)
        for precision in ("fp32", "bf16")
        for level, value in LEVELS.items()
    }


def run_model(name: str, *, tiny: bool, rounds: int, timed: bool) -> dict[str, Any]:
    from autotune import measure, predict_memory
    from autotune.measurement.sidebyside import retime_configs
    from autotune.memory.predict import profile_memory
    from autotune.zoo import CORPUS

    entry = CORPUS[name]
    workload = entry.build(**(entry.tiny if tiny else entry.sizes))
    configs = configurations(workload.batch_size)
    profile = profile_memory(workload, modes=("fp32", "bf16"), selective=True)
    rows: dict[str, dict[str, Any]] = {}
    for label, config in configs.items():
        m = measure(workload, config, steps=1, warmup=1)
        estimate = predict_memory(workload, config, profile=profile)
        rows[label] = {
            "config": label,
            "describe": config.describe(),
            "status": m.status,
            "peak_bytes": m.peak_bytes if m.ok else None,
            "predicted_bytes": estimate.total,
            "verified": estimate.verified,
        }
    runnable = [label for label, row in rows.items() if row["peak_bytes"] is not None]
    if timed and runnable:
        retimed = retime_configs(workload, [configs[label] for label in runnable], rounds=rounds, max_rounds=rounds)
        for label, timing in zip(runnable, retimed.timings, strict=True):
            peak = rows[label]["peak_bytes"]
            rows[label] |= {
                "samples/s": round(timing.median, 2),
                "spread": round(timing.relative_spread, 4),
                "per GiB": round(timing.median / (peak / 2**30), 2),
            }

    def ratio(a: str, b: str, key: str) -> float | None:
        x, y = rows[a].get(key), rows[b].get(key)
        return None if not x or not y else round(x / y, 3)

    ratios = {
        f"{p} {key} selective/{other}": ratio(f"{p} blocks, selective", f"{p} blocks, {other}", key)
        for p in ("fp32", "bf16")
        for key in ("peak_bytes", "samples/s")
        for other in ("none", "full")
    }
    return {"model": name, "batch_size": workload.batch_size, "rows": list(rows.values()), "ratios": ratios}


def write(out: Path, machine: dict[str, Any], results: list[dict[str, Any]]) -> None:
    (out / "selective_recompute.json").write_text(json.dumps({"machine": machine, "models": results}, indent=2) + "\n")
    lines = [
        f"# Selective recompute ({machine['date']}, CPU capability {machine['capability']}, "
        f"{machine['threads']} threads, {'tiny sizes' if machine['tiny'] else 'built-in sizes'})",
        "",
        "| model | configuration | peak MiB | predicted MiB | samples/s (spread) | samples/s per GiB |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        for row in r["rows"]:
            peak = "-" if row["peak_bytes"] is None else f"{row['peak_bytes'] / 2**20:.2f}"
            speed = f"{row['samples/s']} ({row['spread']:.1%})" if "samples/s" in row else "-"
            lines.append(
                f"| {r['model']} | {row['config']} | {peak} | {row['predicted_bytes'] / 2**20:.2f} | {speed} | "
                f"{row.get('per GiB', '-')} |"
            )
    (out / "selective_recompute.md").write_text("\n".join(lines) + "\n")


def write_record(path: Path, machine: dict[str, Any], results: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the models that ran, timed (``benchmarks/results.py``)."""
    from results import write_result

    rows = []
    for r in results:
        base = {row["config"]: row for row in r["rows"]}
        for row in r["rows"]:
            precision = row["config"].split(" ")[0]
            none = base[f"{precision} blocks, none"]
            peak = row["peak_bytes"]
            rows.append(
                (
                    r["model"],
                    row["config"],
                    "-" if peak is None else f"{peak / 2**20:.2f}",
                    f"{row['predicted_bytes'] / 2**20:.2f}",
                    "-" if peak is None or not none["peak_bytes"] else f"{peak / none['peak_bytes']:.3f}",
                    f"{row['samples/s']} ({row['spread']:.1%})" if "samples/s" in row else "-",
                    row.get("per GiB", "-"),
                )
            )
    write_result(
        path,
        title="Selective recompute against none and full",
        claim=(
            "Every block kept (none), recomputed selectively (its matmul-like outputs kept, the rest recomputed) or "
            "recomputed whole (full), with fp32 and with bf16 blocks, at each model's built-in size and batch: the "
            "exact peak of one tracked step beside the memory model's prediction (and its ratio to the same precision "
            "with nothing recomputed), samples/s "
            "re-timed side by side on one loop (interleaved rounds, median and spread)."
        ),
        machine=f"{machine['cpu']}, {machine['cores']} cores, {machine['threads']} torch threads, nothing else running",
        capability=f"CPU `{machine['capability']}`",
        date=machine["date"],
        command=command,
        columns=(
            "model",
            "configuration",
            "peak MiB",
            "predicted MiB",
            "peak / none",
            "samples/s (spread)",
            "samples/s per GiB",
        ),
        rows=rows,
        note=(
            "The outer parts (embeddings, head, loss) stay fp32 in every row, so no row is the Hugging Face recipe "
            "(the whole model in bf16, every block recomputed): the outer precision's table has it."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="each model at its test size")
    parser.add_argument("--memory-only", action="store_true", help="peaks and predictions, no timing")
    args = parser.parse_args(argv)
    from results import corpus_models

    models = corpus_models(parser, args.models)
    import torch
    from results import cpu_name

    args.out.mkdir(parents=True, exist_ok=True)
    machine = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cores": os.cpu_count(),
        "tiny": args.tiny,
        "timed": not args.memory_only,
    }
    results = []
    for name in models:
        results.append(run_model(name, tiny=args.tiny, rounds=args.rounds, timed=not args.memory_only))
        print(f"{name}: {results[-1]['ratios']}", flush=True)
        write(args.out, machine, results)
    if args.result is not None:
        from results import command_line

        command = command_line(__file__, argv)
        write_record(args.result, machine, results, command)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
