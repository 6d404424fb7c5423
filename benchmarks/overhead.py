"""Instrumentation overhead of the measurement core, measured side by side.

For each workload and config, optimizer steps alternate between variants in one process
(ABAB...), so slow drift of a shared machine hits every variant alike; the figure is the ratio of
median step times. Variants:
  plain       no gradient-noise hooks (``Trainer(track_noise=False)``)
  noise       gradient-noise hooks + loss bookkeeping (what every measured step runs)
  memory      one step under exact memory tracking (MemTracker), which measure() runs once

Run: python benchmarks/overhead.py [--workloads gpt-tiny,mlp-digits] [--steps 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp-digits,resnet-tiny,gpt-tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ratios = median step time / plain")
    print(f"{'workload':<12} {'config':<26} {'plain ms':>9} {'noise':>7} {'memory':>7}")
    for workload in args.workloads.split(","):
        for label, config in (
            ("micro 32, accum 1", TrainConfig(micro_batch_size=32)),
            ("micro 8, accum 4", TrainConfig(micro_batch_size=8, grad_accum_steps=4)),
        ):
            r = _bench(workload, config, args.steps)
            print(f"{workload:<12} {label:<26} {r['plain_ms']:>9.1f} {r['noise']:>7.3f} {r['memory']:>7.2f}")


if __name__ == "__main__":
    main()
