"""Instrumentation overhead of the measurement core, measured side by side.

For each workload and config, optimizer steps alternate between variants in one process
(ABAB...), so slow drift of a shared machine hits every variant alike; the figure is the ratio of
median step times. Variants:
  plain       no gradient-noise hooks (``Trainer(track_noise=False)``)
  noise       gradient-noise hooks + loss bookkeeping (what every measured step runs)
  memory      one step under exact memory tracking (MemTracker), which measure() runs once

Run: python benchmarks/overhead.py [--workloads gpt-tiny,mlp-digits] [--steps 30] [--threads 1]

With ``--result docs/results/instrumentation-overhead.json`` it also writes the results page's record
of the table (``benchmarks/results.py``; then ``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from autotune import TrainConfig, load_workload
from autotune.measurement.tracker import tracked_step
from autotune.train import Trainer


def _bench(workload: str, config: TrainConfig, steps: int) -> dict[str, float]:
    wl = load_workload(workload)
    trainers = {"plain": Trainer(wl, config, track_noise=False), "noise": Trainer(wl, config)}
    times: dict[str, list[float]] = {"plain": [], "noise": [], "memory": []}
    for t in trainers.values():
        for _ in range(3):  # warm up kernels and optimizer state
            t.step()
    for i in range(steps):
        for name, t in trainers.items():
            times[name].append(t.step().seconds)
        if i % 10 == 0:
            times["memory"].append(tracked_step(trainers["noise"]).result.seconds)
    for t in trainers.values():
        t.close()
    plain = statistics.median(times["plain"])
    return {name: statistics.median(v) / plain for name, v in times.items()} | {"plain_ms": plain * 1e3}


CONFIGS = (
    ("micro 32, accum 1", TrainConfig(micro_batch_size=32)),
    ("micro 8, accum 4", TrainConfig(micro_batch_size=8, grad_accum_steps=4)),
)


def write_record(path: Path, machine: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the table (``benchmarks/results.py``): each row's plain step
    time and the other variants' median step time over it."""
    from results import machine_fields, write_result

    write_result(
        path,
        title="What measuring costs",
        claim=(
            "Median step time of each variant over the same loop without noise hooks, steps alternating between "
            "variants in one process: the gradient noise and loss statistics `Adaptive` folds in, and the exact "
            "memory tracking of one dedicated step per measurement."
        ),
        **machine_fields(machine),
        command=command,
        columns=(
            "workload",
            "config",
            "plain step",
            "gradient noise + loss stats",
            "exact memory tracking (one step)",
        ),
        rows=[
            (r["workload"], r["config"], f"{r['plain_ms']:.1f} ms", f"{r['noise']:.3f}x", f"{r['memory']:.1f}x")
            for r in rows
        ],
        note="An overhead has no PyTorch default or Hugging Face recipe to stand beside.",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp-digits,resnet-tiny,gpt-tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ratios = median step time / plain")
    print(f"{'workload':<12} {'config':<26} {'plain ms':>9} {'noise':>7} {'memory':>7}")
    rows = []
    for workload in args.workloads.split(","):
        for label, config in CONFIGS:
            r = _bench(workload, config, args.steps)
            rows.append({"workload": workload, "config": label} | r)
            print(f"{workload:<12} {label:<26} {r['plain_ms']:>9.1f} {r['noise']:>7.3f} {r['memory']:>7.2f}")
    if args.result is not None:
        from results import command_line, cpu_machine

        write_record(args.result, cpu_machine(), rows, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
