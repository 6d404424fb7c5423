"""The memory model's promise over many random architectures (``random2:SEED``).

For each seed: the drawn architecture (its structural features: shared modules, skip
connections, BatchNorm, dropout, dict batches, where the generator draws them), a verified
profile, ``--configs`` per-block configurations drawn from the seed (uniform and mixed; bf16 with
``--bf16``), each predicted and measured on one real step (:func:`autotune.memory.audit.audit_predictions`),
and whether recompute left the model's buffers as a plain step does. The promise holds when every
prediction is within 5% of its real step *or* flagged unverified. Prints one markdown row per
seed and a summary (seeds, configurations, verified share, worst verified error, broken
promises); the docs' benchmarks page keeps a run's table with the CPU capability.

Run: python benchmarks/property_sweep.py [--seeds 0-199] [--configs 4] [--bf16]
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import warnings

import torch

from autotune import measure
from autotune.config import TrainConfig
from autotune.errors import AutotuneError, PredictionWarning
from autotune.memory.audit import audit_predictions, draw_configs, same_state_after_recompute
from autotune.zoo import random_workload
from autotune.zoo.random_arch import sample_spec


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _features(seed: int) -> str:
    return ",".join(sorted(sample_spec(seed, version=2).features)) or "chain"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-199", help="a seed or a range LO-HI (default 0-199)")
    p.add_argument("--configs", type=int, default=4, help="configurations per seed (default 4)")
    p.add_argument("--bf16", action="store_true", help="draw bf16 blocks too (slow on an AVX2 CPU)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU capability: {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}")
    print("| seed | structure | blocks | configs | verified | worst verified error | holds | buffers exact |")
    print("|---|---|---|---|---|---|---|---|")
    total = verified = broken = state_broken = 0
    worst = 0.0
    for seed in _seeds(args.seeds):
        try:
            workload = random_workload(seed, version=2)
        except AutotuneError as e:
            print(f"| {seed} | - | - | - | - | - | no draw: {e} | - |")
            continue
        n = len(workload.block_names())
        rng = random.Random(seed)
        configs = draw_configs(n, rng, args.configs) if args.bf16 else _fp32(draw_configs(n, rng, args.configs))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PredictionWarning)
            rows = audit_predictions(workload, configs, measure=measure)
        errors = [abs(r.error) for r in rows if r.verified and r.error is not None]
        holds = sum(r.holds for r in rows)
        exact = sum(same_state_after_recompute(workload, c) for c in configs)
        total, verified = total + len(rows), verified + sum(r.verified for r in rows)
        broken, state_broken = broken + len(rows) - holds, state_broken + len(configs) - exact
        worst = max([worst, *errors])
        top = f"{max(errors):.3%}" if errors else "-"
        print(
            f"| {seed} | {_features(seed)} | {n} | {len(rows)} | {sum(r.verified for r in rows)} | {top} | "
            f"{holds}/{len(rows)} | {exact}/{len(configs)} |"
        )
        sys.stdout.flush()
    print(
        f"\n{total} configurations: {verified} verified ({verified / max(total, 1):.0%}), worst verified error "
        f"{worst:.3%}, {broken} broken promises, {state_broken} recomputed steps that changed the buffers."
    )
    return 1 if broken or state_broken else 0


def _fp32(configs: list[TrainConfig]) -> list[TrainConfig]:
    return [dataclasses.replace(c, precision="fp32") for c in configs]


if __name__ == "__main__":
    raise SystemExit(main())
