"""How well does the memory model predict measured peaks? And DeepSpeed's own estimators?

For each workload, a grid of configurations is *measured* (the local runner for zero_stage=0 and
ranks=1, two DeepSpeed ranks otherwise) and *predicted* (``predict_memory``, from a fake-tensor
profile), and the relative error of the predicted peak is reported: overall, by workload, runner
and ZeRO stage. Two grids: ``dev``, the one the model's rules were developed against (its errors
were looked at while writing them: an in-sample figure, though nothing numeric is fitted), and
``fresh``, other micro-batch sizes, checkpoint patterns and accumulation on workloads including
generated ``random:SEED`` architectures, none of which were looked at before the figure.
DeepSpeed's ``estimate_zero2/3_model_states_mem_needs`` (the arithmetic behind the
``..._all_live`` printers, GPU side, no offload) are compared on the stage-2 and stage-3 configs;
they count model states only, for mixed precision.

A third grid, ``mixed``, mixes fp32 and bf16 blocks (autocast islands, drawn from a seed per
workload), with checkpointing and accumulation: configs the memory model composes from uniform
profile runs.

Run: python benchmarks/memory_model.py [--grid dev|fresh|mixed] [--workloads gpt-tiny,...] [--local-only]
[--save m.json | --load m.json]. Measuring the dev grid of the four built-in workloads takes ~20
min on 2 cores (the fresh grid of six workloads ~15 min); --load re-predicts from saved measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune import TrainConfig, load_workload, measure, predict_memory
from autotune.config import Precision
from autotune.memory.model import plan_of
from autotune.memory.predict import profile_memory
from autotune.procs.multirank import measure_ranks

WORKLOADS = ("gpt-tiny", "mlp-digits", "resnet-tiny", "gpt-small")


def _grid(workload: str, num_blocks: int) -> Iterator[TrainConfig]:
    """Local and 2-rank configs; bf16 sparingly (its matmuls run at ~1 GFLOP/s on this CPU)."""
    alternate = tuple(i % 2 == 0 for i in range(num_blocks))
    mixed = tuple("bf16" if i % 2 == 0 else "fp32" for i in range(num_blocks))
    big = workload == "gpt-small"
    micros = (1, 4) if big else (2, 8)
    for micro in micros:
        for accum in (1, 2):
            for ckpt in (False, True, alternate):
                yield TrainConfig(micro_batch_size=micro, grad_accum_steps=accum, checkpoint=ckpt)
                for stage in range(4):
                    if ckpt is not alternate and not (big and accum == 2):
                        yield TrainConfig(
                            micro_batch_size=micro, grad_accum_steps=accum, checkpoint=ckpt, zero_stage=stage, ranks=2
                        )
    if big:
        return
    small = micros[0]
    for accum in (1, 2):
        for ckpt in (False, True, alternate):
            for precision in ("bf16", mixed):
                yield TrainConfig(micro_batch_size=small, grad_accum_steps=accum, checkpoint=ckpt, precision=precision)
    for stage in range(4):
        for accum, ckpt in ((1, False), (1, True), (2, False)):
            yield TrainConfig(
                micro_batch_size=small,
                grad_accum_steps=accum,
                checkpoint=ckpt,
                precision="bf16",
                zero_stage=stage,
                ranks=2,
            )
    for stage in (0, 3):
        yield TrainConfig(micro_batch_size=small, checkpoint=alternate, precision=mixed, zero_stage=stage, ranks=2)


def _fresh_grid(workload: str, num_blocks: int) -> Iterator[TrainConfig]:
    """Configs the model was never looked at on: other micro-batch sizes and checkpoint patterns."""
    first_half = tuple(i < num_blocks // 2 for i in range(num_blocks))
    for micro in (3, 6):
        for ckpt in (False, first_half):
            yield TrainConfig(micro_batch_size=micro, checkpoint=ckpt)
            for stage in range(4):
                yield TrainConfig(micro_batch_size=micro, checkpoint=ckpt, zero_stage=stage, ranks=2)
    yield TrainConfig(micro_batch_size=3, grad_accum_steps=3)
    yield TrainConfig(micro_batch_size=3, precision="bf16", checkpoint=first_half)
    for stage in (1, 3):
        yield TrainConfig(micro_batch_size=3, grad_accum_steps=3, zero_stage=stage, ranks=2)
        yield TrainConfig(micro_batch_size=3, precision="bf16", zero_stage=stage, ranks=2)


def _mixed_grid(workload: str, num_blocks: int) -> Iterator[TrainConfig]:
    """Blocks mixing fp32 and bf16 (autocast islands), drawn from a seed per workload: the
    composition of mixed configs from uniform profile runs, with checkpointing and accumulation."""
    rng = random.Random(workload)  # str seeds hash with SHA-512: the same draws on every run

    def mixed() -> tuple[Precision, ...]:
        while True:
            drawn: tuple[Precision, ...] = tuple(rng.choice(("fp32", "bf16")) for _ in range(num_blocks))
            if len(set(drawn)) == 2:
                return drawn

    def checkpoints() -> bool | tuple[bool, ...]:
        return rng.choice((False, True, tuple(rng.random() < 0.5 for _ in range(num_blocks))))

    for micro in (4, 24):
        for accum in (1, 2):
            for _ in range(2):
                yield TrainConfig(
                    micro_batch_size=micro, grad_accum_steps=accum, precision=mixed(), checkpoint=checkpoints()
                )
    for stage in (0, 2):  # an fp32 engine with autocast islands
        yield TrainConfig(micro_batch_size=4, precision=mixed(), checkpoint=checkpoints(), zero_stage=stage, ranks=2)


GRIDS = {"dev": _grid, "fresh": _fresh_grid, "mixed": _mixed_grid}


def _measure(workload: str, grid: str, *, local_only: bool) -> list[dict[str, Any]]:
    wl = load_workload(workload)
    configs = [c for c in GRIDS[grid](workload, len(wl.block_names())) if c.ranks == 1 or not local_only]
    rows = []
    local = [c for c in configs if c.ranks == 1]
    start = time.perf_counter()
    for c in local:
        m = measure(wl, c, steps=1, warmup=1)
        rows.append({"workload": workload, "config": c.to_dict(), "status": m.status, "measured": m.peak_bytes})
    print(f"{workload}: {len(local)} local configs in {time.perf_counter() - start:.0f} s", flush=True)
    start = time.perf_counter()
    distributed = [c for c in configs if c.ranks > 1]
    for m in measure_ranks(wl, distributed, steps=1, warmup=1) if distributed else []:
        rows.append(
            {
                "workload": workload,
                "config": m.config.to_dict(),
                "status": m.status,
                "measured": m.peak_bytes,
                "resident": [r.resident and dataclasses.asdict(r.resident) for r in m.per_rank],
            }
        )
    print(f"{workload}: {len(distributed)} 2-rank configs in {time.perf_counter() - start:.0f} s", flush=True)
    return rows


def _predict(rows: list[dict[str, Any]]) -> None:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage3 import model_to_params as params_and_largest_layer
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs, model_to_params

    for workload in dict.fromkeys(r["workload"] for r in rows):
        wl = load_workload(workload)
        n = len(wl.block_names())
        mine = [r for r in rows if r["workload"] == workload]
        modes = {m for r in mine for m in plan_of(TrainConfig.from_dict(r["config"]), num_blocks=n).modes}
        start = time.perf_counter()
        profile = profile_memory(wl, modes=sorted(modes), verify=False)  # every config is measured below
        print(f"{workload}: profile of {sorted(modes)} in {time.perf_counter() - start:.1f} s", flush=True)
        total, (_, largest) = model_to_params(wl.model), params_and_largest_layer(wl.model)
        for r in mine:
            config = TrainConfig.from_dict(r["config"])
            r["predicted"] = predict_memory(wl, config, profile=profile).total
            if config.zero_stage == 2:
                r["deepspeed"] = estimate_zero2_model_states_mem_needs(total, config.ranks, 1, cpu_offload=False)[1]
            elif config.zero_stage == 3:
                r["deepspeed"] = estimate_zero3_model_states_mem_needs(
                    total, largest, config.ranks, 1, cpu_offload=False, cpu_offload_params=False
                )[1]


def _summary(name: str, errors: list[float]) -> str:
    if not errors:
        return f"{name:<34} (none)"
    a = sorted(abs(e) for e in errors)
    within = sum(x <= 0.05 for x in a) / len(a)
    p90 = a[min(len(a) - 1, int(0.9 * len(a)))]
    return (
        f"{name:<34} n={len(a):>3}  median |err| {100 * statistics.median(a):5.1f}%  p90 {100 * p90:5.1f}%  "
        f"max {100 * a[-1]:5.1f}%  mean signed {100 * statistics.fmean(errors):+5.1f}%  within 5%: {100 * within:3.0f}%"
    )


def _report(rows: list[dict[str, Any]]) -> None:
    ok = [r for r in rows if r["status"] in ("ok", "over_budget") and r["measured"]]
    err = {id(r): (r["predicted"] - r["measured"]) / r["measured"] for r in ok}
    print("\nPredicted peak vs measured peak, relative error (predicted - measured) / measured")
    groups: dict[str, list[dict[str, Any]]] = {"all": ok}
    for w in dict.fromkeys(r["workload"] for r in ok):
        groups[f"workload {w}"] = [r for r in ok if r["workload"] == w]
    groups["local runner"] = [r for r in ok if r["config"]["ranks"] == 1]
    for stage in range(4):
        groups[f"2 ranks, ZeRO {stage}"] = [
            r for r in ok if r["config"]["ranks"] == 2 and r["config"]["zero_stage"] == stage
        ]
    for name, members in groups.items():
        print(_summary(name, [err[id(r)] for r in members]))
    worst = sorted(ok, key=lambda r: -abs(err[id(r)]))[:8]
    print("\nLargest errors:")
    for r in worst:
        c = r["config"]
        print(
            f"  {r['workload']:<12} stage {c['zero_stage']} ranks {c['ranks']} micro {c['micro_batch_size']} "
            f"accum {c['grad_accum_steps']} ckpt {c['checkpoint']!s:<5.5} prec {c['precision']!s:<5.5}: "
            f"measured {r['measured'] / 2**20:8.2f} MiB, predicted {r['predicted'] / 2**20:8.2f} MiB "
            f"({100 * err[id(r)]:+.1f}%)"
        )
    ds = [r for r in ok if "deepspeed" in r]
    print("\nSame stage-2/3 configs, DeepSpeed's estimator (model states only, mixed precision) vs measured peak:")
    print(_summary("DeepSpeed estimate_zero2/3", [(r["deepspeed"] - r["measured"]) / r["measured"] for r in ds]))
    print(_summary("autotune predict_memory", [err[id(r)] for r in ds]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default="dev",
        help="dev: the grid the model was developed against; fresh: configs (and random:SEED workloads) it never "
        "saw; mixed: fp32 and bf16 blocks mixed",
    )
    parser.add_argument("--local-only", action="store_true", help="skip the 2-rank DeepSpeed configs")
    parser.add_argument("--save", type=Path, help="write the measurements to this JSON file")
    parser.add_argument("--load", type=Path, help="read measurements from this JSON file instead of measuring")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # the 2-rank runs take both cores; keep the local runs comparable
    if args.load:
        rows = json.loads(args.load.read_text())
    else:
        rows = [row for w in args.workloads.split(",") for row in _measure(w, args.grid, local_only=args.local_only)]
        if args.save:
            args.save.write_text(json.dumps(rows, indent=1))
    _predict(rows)
    _report(rows)


if __name__ == "__main__":
    main()
