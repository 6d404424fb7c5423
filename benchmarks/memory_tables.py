"""What the simulator's memory tables cost: seconds to predict every knob setting of a profile.

The policy's proposal and an adaptive run's plan predict the peak of every setting the
environments reach (``envs/memory_tables.py``: 1,200 settings with the blocks' outer parts in
fp32, 1,200 more with them in bf16) from one memory profile. The fake-tensor runs are taken once
first, outside the timing (a study has taken them by then); what is timed is the predictions.

Run (nothing else on the machine): python benchmarks/memory_tables.py [--size 100m] [--repeats 3]

Prints the median seconds of each table over ``--repeats`` and a digest of its bytes (two commits
that print one digest predict the same bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import torch
from autotune.envs.memory_tables import memory_table

from autotune.memory.predict import profile_memory
from autotune.memory.profile import outer_mode

sys.path.insert(0, str(Path(__file__).resolve().parent))
from setup_cost import SIZES, _build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="100m")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    workload = _build(args.size)
    modes = ("fp32", "bf16", outer_mode("fp32", "bf16"), outer_mode("bf16", "bf16"))
    reuse = profile_memory(workload, modes=modes, selective=True, verify=False, device="cpu")
    print(
        f"{workload.name} ({args.size}, {len(workload.block_names())} blocks), torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU {torch.backends.cpu.get_cpu_capability()}"
    )
    for outer in (False, True):
        seconds, digest = [], ""
        for _ in range(args.repeats):
            start = time.perf_counter()
            tables = memory_table(workload, outer=outer, reuse=reuse)
            seconds.append(time.perf_counter() - start)
            digest = hashlib.sha1(repr(tables).encode()).hexdigest()[:12]
        name = "outer parts bf16" if outer else "outer parts fp32"
        print(f"{name}: {statistics.median(seconds):.2f} s (median of {args.repeats}), bytes digest {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
