"""Default vs adaptive vs a fixed configuration, on the user's own run of three corpus models.

Every variant trains a fresh, identically initialised model for ``--steps`` optimizer steps at the
workload's effective batch through :class:`autotune.Adaptive` (one loop, one data stream, the
memory budget = the default configuration's own peak):

  default    policy=None: PyTorch's default way (the whole batch in one fp32 pass), never changed
  adaptive   the shipped pretrained policy, a decision every ``--decide-every`` steps
  fixed      the configuration the adaptive run ended on, from the first step (hindsight)
  observe    the pretrained policy deciding, its proposals discarded: what observing costs
             (gradient-noise hooks, the noise split step, the policy's forward), steps alternated
             with a second default run in the same process (ABBA) so drift hits both alike

Reported: samples/s over all steps (tracked steps and reconfigurations included), the run's
highest measured peak (exact MemTracker bytes of each configuration's tracked step; an adaptive
run's includes the configurations it left), samples/s per GiB of it, the final configuration's
measured peak (what the run holds from its last change on), the mean loss of the last 5 steps
(same effective batch: equal steps are equal samples), and
the number and wall time of reconfigurations.

Run: python benchmarks/adaptive.py [--size small] [--steps 40] [--decide-every 5] [--threads 2]
     [--observation-only]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from autotune.adapt import Adaptive, DecisionSource, Observation, Proposal, RunContext
from autotune.adapt.policy import PolicySource
from autotune.zoo import CORPUS

GIB = 1024**3
SMALL: dict[str, dict[str, int]] = {
    "hf-gpt2": {"layers": 4, "width": 128, "heads": 4, "seq_len": 64, "vocab": 256, "num_samples": 1024,
                "batch_size": 32},
    "hf-vit": {"layers": 4, "width": 128, "heads": 4, "patch_size": 8, "image_size": 32, "num_samples": 1024,
               "batch_size": 32},
    "lstm-lm": {"layers": 4, "width": 128, "seq_len": 64, "vocab": 256, "num_samples": 1024, "batch_size": 32},
}  # fmt: skip


class Observe(DecisionSource):
    """The pretrained policy's observation and decision, never acted on."""

    name = "observe"
    needs_noise = True

    def __init__(self) -> None:
        self.inner = PolicySource()

    def start(self, context: RunContext) -> None:
        self.inner.start(context)

    def propose(self, observation: Observation) -> Proposal | None:
        self.inner.propose(observation)
        return None


def _build(name: str, size: str) -> Any:
    entry = CORPUS[name]
    return entry.build(**(entry.tiny if size == "tiny" else SMALL[name]))


def _tuner(name: str, size: str, policy: Any, decide_every: int) -> Adaptive:
    wl = _build(name, size)
    opt = wl.make_optimizer(wl.model.parameters())
    return Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=wl.batch_size, policy=policy,
                    decide_every=decide_every, blocks=wl.blocks, name=wl.name)  # fmt: skip


def _run(tuner: Adaptive, steps: int) -> dict[str, Any]:
    start = time.perf_counter()
    for _ in range(steps):
        tuner.step()
    wall = time.perf_counter() - start
    tuner.close()
    samples = sum(s.samples for s in tuner.steps)
    peak = max(s.peak_bytes for s in tuner.steps if s.peak_bytes is not None)
    applied = [c for c in tuner.history if c.applied]
    return {
        "thr": samples / wall,
        "peak": peak,
        "thr_gib": samples / wall / (peak / GIB),
        "loss": statistics.fmean(s.loss for s in tuner.steps[-5:]),
        "changes": len(applied),
        "change_s": sum(c.seconds for c in applied),
        "final": tuner.config,
        "final_peak": tuner.gate.measured.get(tuner.config),
    }


def _observation_cost(name: str, size: str, steps: int, decide_every: int) -> float:
    """Wall time of observed steps over plain ones, alternated, tracked steps left out."""
    plain, observed = _tuner(name, size, None, decide_every), _tuner(name, size, Observe(), decide_every)
    times: dict[str, list[float]] = {"plain": [], "observe": []}
    pair = (("plain", plain), ("observe", observed))
    for i in range(steps):
        for key, tuner in pair if i % 2 == 0 else pair[::-1]:  # ABBA: neither always runs first
            t0 = time.perf_counter()
            s = tuner.step()
            if s.peak_bytes is None and s.step >= 2:
                times[key].append(time.perf_counter() - t0)
    plain.close()
    observed.close()
    return sum(times["observe"]) / sum(times["plain"]) - 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="hf-gpt2,hf-vit,lstm-lm")
    parser.add_argument("--size", choices=("tiny", "small"), default="small")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--decide-every", type=int, default=5)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--observation-only", action="store_true", help="measure only the observation cost")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, {args.steps} steps, size {args.size}, "
          f"decide every {args.decide_every}")  # fmt: skip
    print("| model | variant | samples/s | run peak MiB | samples/s per run-peak GiB | final config's peak MiB | "
          "loss (last 5) | reconfigs (s) | final config |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    for name in args.workloads.split(","):
        if args.observation_only:
            cost = _observation_cost(name, args.size, args.steps, args.decide_every)
            print(f"| {name} | observation cost | {cost:+.1%} of step time | | | | | | |")
            continue
        default = _run(_tuner(name, args.size, None, args.decide_every), args.steps)
        adaptive = _run(_tuner(name, args.size, "pretrained", args.decide_every), args.steps)
        fixed = _run(_tuner(name, args.size, adaptive["final"], args.decide_every), args.steps)
        for label, r in (("default", default), ("adaptive", adaptive), ("fixed (adaptive's final)", fixed)):
            final_peak = "-" if r["final_peak"] is None else f"{r['final_peak'] / 2**20:.2f}"
            changes = f"{r['changes']} ({r['change_s']:.3f})"
            final = r["final"].describe().replace(" | ", ", ")  # a table cell: no pipes
            print(f"| {name} | {label} | {r['thr']:.1f} | {r['peak'] / 2**20:.2f} | {r['thr_gib']:.0f} | "
                  f"{final_peak} | {r['loss']:.4f} | {changes} | {final} |")  # fmt: skip
        cost = _observation_cost(name, args.size, args.steps, args.decide_every)
        print(f"| {name} | observation cost | {cost:+.1%} of step time | | | | | | |")


if __name__ == "__main__":
    main()
