"""How far is ``predict_memory`` from the measured peak, per workload, and was it verified?

For each workload reference, one profile (with its one-step check, :mod:`autotune.memory.check`)
and a grid of local-runner configs: micro-batch x checkpointing (none / every other block / all)
x accumulation (1, 2), fp32 (``--bf16`` adds bf16 on every block: 10-50x slower on an AVX2
CPU, where bf16 around ``nn.LSTM`` also fails). Each config is measured for real
(``autotune.measure``, one tracked step) and predicted from the profile; the table gives the
relative error of the predicted peak (median / p90 / max of |error|) and whether the profile was
verified. A workload that cannot be profiled is listed with the reason.

Default workloads: every built-in one, the real-model corpus included (``autotune workloads``),
at its built-in size. Any ``load_workload`` reference works (``path/file.py:build``).

Run: python benchmarks/prediction_error.py [--workloads a,b] [--micro 2,8] [--bf16]
"""

from __future__ import annotations

import argparse
import statistics
import warnings

import torch

from autotune import TrainConfig, Workload, load_workload, measure, predict_memory
from autotune.errors import PredictionError, PredictionWarning
from autotune.memory.predict import profile_memory
from autotune.zoo import BUILTINS


def grid(n: int, micro: list[int], bf16: bool) -> list[TrainConfig]:
    checkpoints: list[bool | tuple[bool, ...]] = [False, tuple(i % 2 == 0 for i in range(n)), True]
    precisions = ["fp32", "bf16"] if bf16 else ["fp32"]
    return [
        TrainConfig(micro_batch_size=m, checkpoint=c, grad_accum_steps=k, precision=p)  # type: ignore[arg-type]
        for m in micro
        for c in checkpoints
        for k in (1, 2)
        for p in precisions
    ]


def row(workload: Workload, configs: list[TrainConfig]) -> str:
    modes = ("fp32", "bf16") if any(c.precision == "bf16" for c in configs) else ("fp32",)
    try:
        with warnings.catch_warnings():  # the table says it: verified no
            warnings.simplefilter("ignore", PredictionWarning)
            profile = profile_memory(workload, modes=modes)
    except PredictionError as e:
        return f"| {workload.name} | 0 | - | - | - | no: {e} |"
    check = profile.verification
    assert check is not None
    errors = []
    for config in configs:
        m = measure(workload, config, steps=1, warmup=1)
        if m.status != "ok" or m.memory is None:
            continue
        predicted = predict_memory(workload, config, profile=profile).total
        errors.append(abs(predicted - m.memory.total) / m.memory.total)
    errors.sort()
    p90 = errors[min(len(errors) - 1, round(0.9 * (len(errors) - 1)))] if errors else float("nan")
    verified = "yes" if check.verified else f"no: {check.reason}"
    median = statistics.median(errors) if errors else float("nan")
    worst = max(errors, default=float("nan"))
    return f"| {workload.name} | {len(errors)} | {median:.2%} | {p90:.2%} | {worst:.2%} | {verified} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", help="comma-separated references (default: every built-in)")
    parser.add_argument("--micro", default="2,8", help="micro-batch sizes (default 2,8)")
    parser.add_argument("--bf16", action="store_true", help="also bf16 on every block (slow on AVX2)")
    args = parser.parse_args()
    refs = args.workloads.split(",") if args.workloads else list(BUILTINS)
    micro = [int(x) for x in args.micro.split(",")]
    print(
        f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads; grid: micro {micro} x checkpoint none/alternate/all x accum 1,2"
        f"{' x fp32/bf16' if args.bf16 else ', fp32'}\n"
    )
    print("| workload | configs | median error | p90 | max | verified |")
    print("|---|---|---|---|---|---|")
    for ref in refs:
        workload = load_workload(ref)
        print(row(workload, grid(len(workload.block_names()), micro, args.bf16)), flush=True)


if __name__ == "__main__":
    main()
