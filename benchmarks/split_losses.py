"""How far the loss of runs with the same training maths drifts apart: one corpus model trained
three times from the same initial weights on the same samples in the same order, at the same
effective batch, in fp32 only:

  default   the whole batch in one pass, never changed
  fixed     the batch as micro-batches x accumulation (``--micro``), from the first step
  switched  an adaptive run whose scripted source moves the split back and forth (side-by-side
            trials included), as the adaptive runs of ``benchmarks/adaptive.py`` do

The gradients differ only by floating-point summation order, so the losses agree to rounding for
a while; how long they stay together afterwards is the model's own sensitivity, not adaptation.

Run: python benchmarks/split_losses.py [--model hf-vit] [--size small] [--steps 300] [--micro 8]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark's model sizes

from adaptive import _sizes

from autotune import TrainConfig
from autotune.adapt import Adaptive, DecisionSource, Observation, Proposal
from autotune.zoo import CORPUS


class _Script(DecisionSource):
    name = "scripted"

    def __init__(self, configs: list[TrainConfig]) -> None:
        self.configs = configs

    def propose(self, observation: Observation) -> Proposal | None:
        return Proposal(config=self.configs.pop(0), reason="scripted") if self.configs else None


def _losses(name: str, size: str, policy: Any, steps: int) -> tuple[list[float], Adaptive]:
    wl = CORPUS[name].build(**_sizes(name, size))  # seeded: identical weights and data each call
    tuner = Adaptive(
        wl.model,
        wl.make_optimizer(wl.model.parameters()),
        wl.loss_fn,
        wl.dataset,
        batch_size=wl.batch_size,
        policy=policy,
        decide_every=10,
        blocks=wl.blocks,
    )
    try:
        return [tuner.step().loss for _ in range(steps)], tuner
    finally:
        tuner.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="hf-vit", choices=sorted(CORPUS))
    p.add_argument("--size", default="small")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--micro", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    batch = CORPUS[args.model].build(**_sizes(args.model, args.size)).batch_size
    split = TrainConfig(micro_batch_size=args.micro, grad_accum_steps=batch // args.micro, grad_clip=None)
    other = TrainConfig(micro_batch_size=2 * args.micro, grad_accum_steps=batch // (2 * args.micro), grad_clip=None)
    default, _ = _losses(args.model, args.size, None, args.steps)
    fixed, _ = _losses(args.model, args.size, split, args.steps)
    switched, tuner = _losses(args.model, args.size, _Script([other, split, other]), args.steps)
    print(
        f"{args.model} {args.size}, batch {batch}, torch {torch.__version__}, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    for change in tuner.history:
        print(f"  switched: {change.describe()}")
    same = next((i for i, (a, b) in enumerate(zip(default, fixed, strict=True)) if abs(a - b) > 1e-3), args.steps)
    print(f"default and fixed agree within 1e-3 through step {same - 1}")
    print("| step | default | fixed | switched |\n|---:|---:|---:|---:|")
    for i in [*range(0, args.steps, max(1, args.steps // 10)), args.steps - 1]:
        print(f"| {i} | {default[i]:.4f} | {fixed[i]:.4f} | {switched[i]:.4f} |")
    print(
        f"| mean of last 5 | {sum(default[-5:]) / 5:.4f} | {sum(fixed[-5:]) / 5:.4f} | {sum(switched[-5:]) / 5:.4f} |"
    )


if __name__ == "__main__":
    main()
