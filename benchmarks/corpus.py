"""Size and speed of the real-model corpus: parameters, blocks, build time, step time, peak memory.

Each corpus model (``autotune.zoo.CORPUS``) is built at its built-in size (or ``--tiny``) and
measured with ``autotune.measure`` at one micro-batch (fp32, no checkpointing): median step time
over ``--steps`` timed steps and the exact peak tensor bytes. The CPU capability and thread count
are printed with the figures, since both change them (bf16 is far slower than fp32 on a CPU without bf16
units, and faster on one with AMX).

Run: python benchmarks/corpus.py [--tiny] [--micro-batch 8] [--steps 5] [--names hf-gpt2,lstm-lm]
"""

from __future__ import annotations

import argparse
import time

import torch

from autotune import TrainConfig, measure
from autotune.units import format_bytes
from autotune.zoo import CORPUS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="build each model at its tiny preset")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--names", default=",".join(CORPUS), help="comma-separated corpus names")
    args = parser.parse_args()
    cpu, threads = torch.backends.cpu.get_cpu_capability(), torch.get_num_threads()
    print(f"cpu {cpu}, {threads} threads, micro-batch {args.micro_batch}")
    print(f"{'name':<12} {'parameters':>11} {'blocks':>6} {'build s':>8} {'step ms':>8} {'peak':>10}")
    for name in args.names.split(","):
        entry = CORPUS[name]
        start = time.perf_counter()
        workload = entry.build(**(entry.tiny if args.tiny else {}))
        built = time.perf_counter() - start
        m = measure(workload, TrainConfig(micro_batch_size=args.micro_batch), steps=args.steps, warmup=1)
        step_ms = f"{m.step_seconds * 1e3:.0f}" if m.step_seconds is not None else m.status
        peak = format_bytes(m.peak_bytes) if m.peak_bytes is not None else "-"
        params = f"{workload.num_parameters:,}"
        print(
            f"{name:<12} {params:>11} {len(workload.block_names()):>6} {built:>8.2f} {step_ms:>8} {peak:>10}",
            flush=True,
        )


if __name__ == "__main__":
    main()
