"""Agreement of the simulator with the real training loop.

For each workload with a shipped profile, a grid of knob settings is measured for real (exact
peak tensor bytes from ``autotune.measure``; step times from live trainers of every setting
stepped round-robin, medians of ``--rounds``, so a shared machine's drift hits every setting
alike, as ``autotune profile`` measures) and costed by the simulator
(``step_cost`` on the profile). Reported per workload: Spearman rank correlation of throughput
per GiB (the quantity the reward is built on), of throughput alone, and the error of the
simulator's peak memory: the profile's table (the memory model's predictions, what the simulator
uses for a calibrated workload) and the block-sum model (what it uses for synthetic profiles).
Runs with as many threads as the shipped profiles were calibrated with (1).

Run: python benchmarks/sim_vs_real.py [--workloads mlp-digits,resnet-tiny,gpt-tiny] [--rounds 8] [--verbose]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import statistics

import numpy as np
import torch
from autotune.envs._codec import MICRO_LEVELS, Levels, knobs_to_config
from autotune.envs.calibration import interleaved_step_seconds
from autotune.envs.costmodel import ranking, step_cost
from autotune.envs.simulated import shipped_profiles

from autotune import load_workload, measure


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp-digits,resnet-tiny,gpt-tiny")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--verbose", action="store_true", help="print every setting")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    profiles = {p.workload: p for p in shipped_profiles()}
    print(
        f"{'workload':<12} {'configs':>7} {'spearman thr/GiB':>17} {'spearman thr':>13} "
        f"{'mem err median/max':>19} {'block-sum err median/max':>25}"
    )
    for name in args.workloads.split(","):
        profile, wl = profiles[name], load_workload(name)
        order = ranking(profile)
        b0 = MICRO_LEVELS.index(min(MICRO_LEVELS, key=lambda m: abs(m - wl.batch_size)))
        grid = [
            Levels(micro=m, precision=p, checkpoint=c)
            for m, p, c in itertools.product((b0 - 2, b0), (0, 2, 4), (0, 2, 4))
        ]
        real_tpg, sim_tpg, real_thr, sim_thr, errors, block_sum = [], [], [], [], [], []
        untabled = dataclasses.replace(profile, peak_table=None)
        configs = {str(i): knobs_to_config(knobs, order) for i, knobs in enumerate(grid)}
        seconds = interleaved_step_seconds(wl, configs, rounds=args.rounds)
        for i, knobs in enumerate(grid):
            peak = measure(wl, configs[str(i)], steps=1, warmup=1).peak_bytes
            assert peak is not None
            throughput = knobs.effective_batch_size / seconds[str(i)]
            cost = step_cost(profile, knobs)
            sim_throughput = knobs.effective_batch_size / cost.seconds
            real_thr.append(throughput)
            sim_thr.append(sim_throughput)
            real_tpg.append(throughput / peak)
            sim_tpg.append(sim_throughput / cost.peak_bytes)
            errors.append(abs(cost.peak_bytes - peak) / peak)
            block_sum.append(abs(step_cost(untabled, knobs).peak_bytes - peak) / peak)
            if args.verbose:
                real, sim = f"{throughput:8.1f}/s {peak / 2**20:7.2f} MiB", f"{sim_throughput:8.1f}/s"
                print(f"  {knobs}: real {real}  sim {sim} {cost.peak_bytes / 2**20:7.2f} MiB")
        print(
            f"{name:<12} {len(grid):>7} {_spearman(real_tpg, sim_tpg):>17.3f} {_spearman(real_thr, sim_thr):>13.3f} "
            f"{statistics.median(errors):>10.1%} /{max(errors):>6.1%} "
            f"{statistics.median(block_sum):>16.1%} /{max(block_sum):>6.1%}",
            flush=True,
        )


if __name__ == "__main__":
    main()
