"""The reduced precision's speed per sample and per micro-batch: one factor or two?

The simulator times a micro-batch of b samples as ``t_mf * A(x_f) + b * t_ps * A(x_ps)``: the
reduced precision has one factor on the per-sample time and one on the per-micro-batch fixed time
(``envs/costmodel.py``). Before the split it had one factor on both, calibrated at the largest
micro-batch; on a GPU that read micro-batches of one as several times faster in bf16 than they are.

For each workload (``--workloads``, default hf-gpt2, gpt-small and hf-llama at their built-in
sizes): one calibration (``calibrate``, its seven timed configurations captured), from which both
profiles are made (the two factors as calibrated; one factor as before, from the same step times);
then every block in the reduced precision and all in fp32 timed side by side at micro-batches of
the whole batch, a quarter of it and one (accumulation making up the batch; interleaved rounds,
medians of ``--rounds``), and each profile's simulated reduced/fp32 step-time ratio set beside the
measured one, with the RMS of log(simulated / measured) step time over the six settings.

Run: python benchmarks/reduced_factors.py [--workloads hf-gpt2,gpt-small,hf-llama] [--rounds 6]
     [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
from pathlib import Path
from typing import Any

import torch
from autotune.envs import calibration
from autotune.envs.calibration import TimeTerms, _block_time_ratios, calibrate, interleaved_step_seconds
from autotune.envs.costmodel import step_seconds

from autotune import TrainConfig, load_workload


def _captured(workload: Any) -> tuple[Any, dict[str, float]]:
    """``calibrate(workload)`` and the step times of its seven timed configurations."""
    seen: dict[str, float] = {}
    real = calibration.interleaved_step_seconds

    def capture(*args: Any, **kwargs: Any) -> dict[str, float]:
        times = real(*args, **kwargs)
        seen.update(times)
        return times

    calibration.interleaved_step_seconds = capture
    try:
        profile = calibrate(workload, curve_steps=2, timing_rounds=4)
    finally:
        calibration.interleaved_step_seconds = real
    return profile, seen


def _one_factor(profile: Any, times: dict[str, float]) -> Any:
    """``profile`` with the one factor of before, from the same step times."""
    b0 = profile.default_micro_batch or profile.batch_size
    terms = TimeTerms(
        micro_fixed=profile.micro_fixed_seconds,
        per_sample=profile.micro_seconds_per_sample,
        micro=b0,
        tiny_accum=min(4, max(1, b0 // 4)),
    )
    without = {k: v for k, v in times.items() if k != "reduced_tiny"}
    one, none, _ = _block_time_ratios(without, terms, profile.blocks_fraction, failure=profile.reduced_failure)
    assert none is None
    return dataclasses.replace(profile, reduced_slowdown=one, reduced_fixed_slowdown=None)


def _simulated(profile: Any, config: TrainConfig, n: int) -> float:
    """``profile``'s step seconds of ``config`` (every block reduced unless it is fp32)."""
    return step_seconds(
        profile,
        micro_batch_size=config.micro_batch_size,
        accum_steps=config.grad_accum_steps,
        reduced=range(n) if config.precision != "fp32" else (),
        recomputed=(),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="hf-gpt2,gpt-small,hf-llama")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name in args.workloads.split(","):
        workload = load_workload(name)
        two, times = _captured(workload)
        one = _one_factor(two, times)
        b0, n = workload.batch_size, len(workload.block_names())
        configs: dict[str, TrainConfig] = {}
        for b in sorted({b0, max(1, b0 // 4), 1}, reverse=True):
            for precision in ("fp32", two.reduced):
                configs[f"{precision} {b}x{b0 // b}"] = TrainConfig(
                    micro_batch_size=b, grad_accum_steps=b0 // b, precision=precision
                )
        measured = interleaved_step_seconds(workload, configs, rounds=args.rounds)

        errors = {
            label: math.sqrt(
                sum(math.log(_simulated(p, c, n) / measured[k]) ** 2 for k, c in configs.items()) / len(configs)
            )
            for label, p in (("one", one), ("two", two))
        }
        row: dict[str, Any] = {
            "workload": name,
            "factors": {
                "one": one.reduced_slowdown,
                "two": {"per_sample": two.reduced_slowdown, "per_micro_batch": two.reduced_fixed_slowdown},
            },
            "fixed_share": two.micro_fixed_seconds / (two.micro_fixed_seconds + b0 * two.micro_seconds_per_sample),
            "rms_log_error": errors,
            "ratios": [],
        }
        print(
            f"{name}: factors one {one.reduced_slowdown:.3f}, two {two.reduced_slowdown:.3f} per sample / "
            f"{two.reduced_fixed_slowdown} per micro-batch; fixed share {row['fixed_share']:.2f}; "
            f"RMS log step-time error one {errors['one']:.3f}, two {errors['two']:.3f}"
        )
        for b in sorted({b0, max(1, b0 // 4), 1}, reverse=True):
            fp32, low = configs[f"fp32 {b}x{b0 // b}"], configs[f"{two.reduced} {b}x{b0 // b}"]
            real = measured[f"{two.reduced} {b}x{b0 // b}"] / measured[f"fp32 {b}x{b0 // b}"]
            sims = {label: _simulated(p, low, n) / _simulated(p, fp32, n) for label, p in (("one", one), ("two", two))}
            row["ratios"].append({"split": f"{b}x{b0 // b}", "measured": real, **sims})
            print(
                f"  {b}x{b0 // b}: {two.reduced}/fp32 step time measured {real:.3f}, "
                f"one factor {sims['one']:.3f}, two {sims['two']:.3f}"
            )
        rows.append(row)
    if args.out is not None:
        meta = {
            "cpu": platform.processor() or platform.machine(),
            "capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
        }
        args.out.write_text(json.dumps({"machine": meta, "workloads": rows}, indent=1))


if __name__ == "__main__":
    main()
