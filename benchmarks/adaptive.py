"""Default vs adaptive vs a study's best fixed configuration, on the user's own run of three corpus models.

For each model, at the workload's effective batch and one memory budget (the PyTorch default's
measured peak, what :class:`autotune.Adaptive` uses when given none):

1. study: a real Optuna study of the same model through the public API (``autotune.search``:
   a spec built here, ``prepare`` / ``open_study`` / ``run_study`` / ``summarize``, SQLite in a
   temporary directory or ``--storage``), ``--study-trials`` trials, its wall time reported; its
   recommendation (the most samples/s per GiB of peak within the budget) is "study-best";
2. three fresh, identically initialised runs of ``--steps`` optimizer steps through
   :class:`autotune.Adaptive` (one loop, one data stream), steps interleaved in one process
   (the order rotates every round) so that drift on a shared machine hits all three alike:

  default     policy=None: PyTorch's default way (the whole batch in one fp32 pass), never changed
  adaptive    the shipped pretrained policy, a decision every ``--decide-every`` steps, no study
  study-best  the study's recommendation as a fixed configuration, from the first step

``--observation-only`` instead measures what observing costs: the pretrained policy deciding,
its proposals discarded (gradient-noise hooks, the noise split step, the policy's forward),
steps alternated with a plain default run in the same process (ABBA).

The runs track memory as :class:`autotune.Adaptive` does by default: only configurations whose
prediction the budget gate does not trust (none, on these models). Each configuration a run trained under is
measured exactly after the runs instead (one MemTracker-tracked step of a fresh copy of the model
under it, after one that creates the optimizer state; outside the timed steps).

Reported per run: samples/s over all steps (tracked steps, decisions and reconfigurations
included), the run's highest measured peak (of every configuration it trained under; an adaptive
run's includes the configurations it left), samples/s per GiB of it; "settled": the configuration
of the run's last steps, the median samples/s of its untracked steps (how many in brackets) and
its measured peak, and samples/s per GiB of that; the mean loss
of the last 5 steps (same effective batch: equal steps are equal samples); the number and wall
time of reconfigurations. ``--out`` writes every run's decision history and judged configurations as JSON;
``--result docs/results/adaptive-vs-study.json`` the results page's record of the settled figures
(``benchmarks/results.py``; then ``python benchmarks/render_results.py``, which renders README's
results table from it too).

Run: python benchmarks/adaptive.py [--size small] [--steps 60] [--decide-every 10] [--threads 1]
     [--study-trials 24] [--storage studies.db] [--out adaptive.json] [--result PATH] [--observation-only]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from autotune.policies.transfer import propose

from autotune.adapt import Adaptive, DecisionSource, Observation, Proposal, RunContext
from autotune.adapt.policy_source import PolicySource
from autotune.config import TrainConfig
from autotune.procs.measure import measure
from autotune.resolve import load_workload
from autotune.search import MeasureSpec, RunOptions, SpaceSpec, StudySpec, open_study, prepare, run_study, summarize
from autotune.search.baselines import PYTORCH_DEFAULT
from autotune.search.results import require_recommended
from autotune.units import MemoryBudget
from autotune.zoo import CORPUS

GIB = 1024**3
SMALL: dict[str, dict[str, int]] = {
    "hf-gpt2": {
        "layers": 4,
        "width": 128,
        "heads": 4,
        "seq_len": 64,
        "vocab": 256,
        "num_samples": 1024,
        "batch_size": 32,
    },
    "hf-vit": {
        "layers": 4,
        "width": 128,
        "heads": 4,
        "patch_size": 8,
        "image_size": 32,
        "num_samples": 1024,
        "batch_size": 32,
    },
    "lstm-lm": {"layers": 4, "width": 128, "seq_len": 64, "vocab": 256, "num_samples": 1024, "batch_size": 32},
}
VARIANTS = ("default", "adaptive", "study-best")


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


def _sizes(name: str, size: str) -> dict[str, int]:
    return dict(CORPUS[name].tiny if size == "tiny" else SMALL[name])


def _tuner(name: str, size: str, policy: Any, decide_every: int) -> Adaptive:
    wl = CORPUS[name].build(**_sizes(name, size))
    opt = wl.make_optimizer(wl.model.parameters())
    return Adaptive(
        wl.model,
        opt,
        wl.loss_fn,
        wl.dataset,
        batch_size=wl.batch_size,
        policy=policy,
        decide_every=decide_every,
        blocks=wl.blocks,
        name=wl.name,
    )


# ---- the study ------------------------------------------------------------------------------------


def _default_peak(source: Path) -> int:
    """The PyTorch default's measured peak: the budget every run reaches once it has tracked the
    default (a percentage would be of its *prediction*, which sits a few bytes below the measured
    peak, and the study's default baseline would be pruned as over it)."""
    workload = load_workload(f"{source}:build")
    measured = measure(workload, TrainConfig(micro_batch_size=workload.batch_size), steps=1, warmup=1)
    assert measured.peak_bytes is not None
    return measured.peak_bytes


def _study(name: str, size: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """A real study of the same model, batch and budget; its recommendation and wall time."""
    # The study measures in a child process that resolves the workload by reference: a file here.
    source = workdir / f"{name.replace('-', '_')}_{size}.py"
    source.write_text(
        f"from autotune.zoo import CORPUS\n\n\ndef build():\n"
        f"    return CORPUS[{name!r}].build(**{_sizes(name, size)!r})\n"
    )
    spec = StudySpec(
        workload=f"{source}:build",
        name=f"adaptive-benchmark-{name}-{size}",
        trials=args.study_trials,
        memory_budget=MemoryBudget(bytes=_default_peak(source)),
        sampler="tpe",
        seed=0,
        space=SpaceSpec(precisions=("fp32", "bf16")),
        measure=MeasureSpec(steps=args.study_steps, warmup=1, trial_timeout=600.0, threads=args.threads or None),
    )
    options = RunOptions(
        storage=args.storage or str(workdir / "studies.db"),
        cache=None,
        artifact_dir=workdir / "artifacts",
        dashboard=False,
        propose=propose,
    )
    start = time.perf_counter()
    prepared = prepare(spec)
    study = open_study(prepared, options)
    run_study(prepared, study, options)
    wall = time.perf_counter() - start
    summary = summarize(study)
    best = require_recommended(summary)
    assert best.config is not None and best.per_gib is not None
    gain = summary.improvement(PYTORCH_DEFAULT)
    return {
        "config": best.config,
        "trial": best.number,
        "per_gib": best.per_gib,
        "over_default": None if gain is None else gain.per_gib,
        "trials": len(summary.trials),
        "states": summary.states,
        "seconds": wall,
        "budget": prepared.memory_budget,
    }


# ---- the three runs -------------------------------------------------------------------------------


def _interleaved(tuners: dict[str, Adaptive], steps: int) -> dict[str, list[float]]:
    """Wall seconds of every ``step()`` (decisions and reconfigurations included), the variants'
    order rotating each round so none always runs first."""
    walls: dict[str, list[float]] = {k: [] for k in tuners}
    order = list(tuners)
    for i in range(steps):
        for key in order[i % len(order) :] + order[: i % len(order)]:
            t0 = time.perf_counter()
            tuners[key].step()
            walls[key].append(time.perf_counter() - t0)
    return walls


def _exact_peak(name: str, size: str, config: TrainConfig, cache: dict[TrainConfig, int]) -> int:
    """``config``'s exact peak: a tracked step of a fresh copy of the model, after a warm-up step."""
    if config not in cache:
        workload = CORPUS[name].build(**_sizes(name, size))
        measured = measure(workload, config, steps=1, warmup=1)
        assert measured.peak_bytes is not None
        cache[config] = measured.peak_bytes
    return cache[config]


def _summary(tuner: Adaptive, walls: list[float], peak_of: Any) -> dict[str, Any]:
    steps = tuner.steps
    samples = sum(s.samples for s in steps)
    peak = max(peak_of(c) for c in {s.config for s in steps})
    applied = [c for c in tuner.history if c.applied]
    settled = steps[-1].config  # what the run's last steps ran under
    tail: list[float] = []
    for s, wall in zip(reversed(steps), reversed(walls), strict=True):
        if s.config != settled:
            break
        if s.peak_bytes is None and s.step >= 1:  # untracked steps only
            tail.append(s.samples / wall)
    settled_peak = peak_of(settled)
    settled_thr = statistics.median(tail) if tail else float("nan")
    return {
        "thr": samples / sum(walls),
        "peak": peak,
        "thr_gib": samples / sum(walls) / (peak / GIB),
        "settled": settled,
        "settled_steps": len(tail),
        "settled_thr": settled_thr,
        "settled_peak": settled_peak,
        "settled_gib": settled_thr / (settled_peak / GIB),
        "loss": statistics.fmean(s.loss for s in steps[-5:]),
        "changes": len(applied),
        "change_s": sum(c.seconds for c in applied),
        "final": tuner.config,
        "history": [c.to_dict() for c in tuner.history],
        "judged": [r.to_dict() for r in tuner.configs],
    }


def _compare(name: str, size: str, args: argparse.Namespace, best: TrainConfig) -> dict[str, dict[str, Any]]:
    tuners = {
        "default": _tuner(name, size, None, args.decide_every),
        "adaptive": _tuner(name, size, PolicySource(plan=args.plan), args.decide_every),
        "study-best": _tuner(name, size, best, args.decide_every),
    }
    try:
        walls = _interleaved(tuners, args.steps)
    finally:
        for tuner in tuners.values():
            tuner.close()
    for change in tuners["adaptive"].history:
        print(f"  {name} adaptive: {change.describe()}", flush=True)
    for r in tuners["adaptive"].configs:  # what each configuration it ran measured, as it judged them
        print(
            f"  {name} adaptive judged at step {r.step}: {r.config.describe()}: {r.score.throughput:.1f} "
            f"samples/s ({r.timed_steps} steps), {r.score.peak_bytes / 2**20:.2f} MiB, {r.score.per_gib:.0f} "
            "per GiB",
            flush=True,
        )
    for change in tuners["study-best"].history:
        print(f"  {name} study-best: {change.describe()}", flush=True)
    cache: dict[TrainConfig, int] = {}

    def peak_of(config: TrainConfig) -> int:
        return _exact_peak(name, size, config, cache)

    return {k: _summary(t, walls[k], peak_of) for k, t in tuners.items()}


def _row(name: str, label: str, r: dict[str, Any]) -> str:
    cell = r["settled"].describe().replace(" | ", ", ")  # a table cell: no pipes
    return (
        f"| {name} | {label} | {r['thr']:.1f} | {r['peak'] / 2**20:.2f} | {r['thr_gib']:.0f} | "
        f"{r['settled_thr']:.1f} ({r['settled_steps']}) | {r['settled_peak'] / 2**20:.2f} | "
        f"{r['settled_gib']:.0f} | {r['loss']:.4f} | {r['changes']} ({r['change_s']:.3f}) | {cell} |"
    )


# ---- the results page's record -----------------------------------------------------------------------

NUMBERS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def policy_seen(models: list[str], size: str, trained_on: list[str]) -> dict[str, str]:
    """Whether the shipped policy trained on each model (its ``trained_on`` names ``model:size``):
    ``held out``, ``another size`` or ``this size``."""
    seen = {}
    for name in models:
        sizes = {t.partition(":")[2] for t in trained_on if t == name or t.startswith(name + ":")}
        seen[name] = "held out" if not sizes else "this size" if size in sizes else "another size"
    return seen


def _seen_text(seen: dict[str, str]) -> str:
    """``hf-vit is held out from the policy's training, hf-gpt2 and lstm-lm were trained on at another size.``"""
    phrases = {
        "held out": ("is", "are", "held out from the policy's training"),
        "another size": ("was", "were", "trained on at another size"),
        "this size": ("was", "were", "trained on at this size"),
    }
    parts = []
    for kind, (one, many, what) in phrases.items():
        names = [n for n, k in seen.items() if k == kind]
        if names:
            listed = ", ".join(names[:-1]) + " and " * (len(names) > 1) + names[-1]
            parts.append(f"{listed} {one if len(names) == 1 else many} {what}")
    return ", ".join(parts) + "." if parts else ""


def config_cell(config: TrainConfig) -> str:
    """A configuration as a table cell: ``4x8x1, bf16, ckpt 3/4, ZeRO 0`` (no pipes)."""
    return config.describe().removeprefix("micro x acc x ranks ").replace(" | ", ", ")


def record_rows(results: dict[str, dict[str, dict[str, Any]]]) -> list[tuple[str, ...]]:
    """Each model's variants, settled: samples/s (steps), peak MiB, samples/s per GiB, configuration."""
    return [
        (
            name,
            label,
            f"{r['settled_thr']:.1f} ({r['settled_steps']})",
            f"{r['settled_peak'] / 2**20:.2f}",
            f"{r['settled_gib']:.0f}",
            config_cell(r["settled"]),
        )
        for name, runs in results.items()
        for label in VARIANTS
        for r in (runs[label],)
    ]


def write_record(
    path: Path,
    machine: dict[str, Any],
    results: dict[str, dict[str, dict[str, Any]]],
    command: str,
    *,
    batches: dict[str, int],
    study_trials: int,
    seen: dict[str, str],
) -> None:
    """The results page's record of the settled figures (``benchmarks/results.py``), charted per GiB.

    Args:
        results: per model, its three runs (:func:`_summary`'s figures) by variant.
        batches: each model's effective batch.
        study_trials: the trials of each model's study.
        seen: :func:`policy_seen` of the models.
    """
    from results import Chart, machine_fields, write_result

    batch = " and ".join(dict.fromkeys(str(b) for b in batches.values()))
    count = NUMBERS[len(results)] if len(results) < len(NUMBERS) else str(len(results))
    write_result(
        path,
        title="Adaptive training and a study against the PyTorch default",
        claim=(
            f"Samples/s per GiB of measured peak at the same effective batch ({batch}) and memory budget (the "
            f"PyTorch default's peak) on {count} corpus model{'s' * (len(results) != 1)}: the PyTorch default, "
            f"`Adaptive` with the shipped policy and no study, and the best configuration of a {study_trials}-trial "
            "Optuna study, run fixed. The three runs interleave their steps in one process; each figure is the run's "
            "settled configuration (its last stint: median samples/s, steps in brackets, and its exactly measured "
            f"peak). {_seen_text(seen)} README.md's results table is this one."
        ).replace("  ", " "),
        **machine_fields(machine),
        command=command,
        columns=(
            "model",
            "variant",
            "settled samples/s (steps)",
            "settled peak MiB",
            "settled samples/s per GiB",
            "settled config",
        ),
        rows=record_rows(results),
        note=(
            "The Hugging Face recipe (bf16 with every block recomputed) was not a variant of this run: the [outer "
            "precision](#the-hugging-face-recipe-against-the-pytorch-default) table has it beside the PyTorch default "
            "on four corpus models. Whole-run figures (run peak) and 300-step runs: [benchmark "
            "log](benchmark-log.md#adaptive-training-against-a-study)."
        ),
        chart=Chart(
            group="model",
            series="variant",
            value="settled samples/s per GiB",
            baseline="default",
            shown=VARIANTS,
        ),
    )


# ---- observation cost -----------------------------------------------------------------------------


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="hf-gpt2,hf-vit,lstm-lm")
    parser.add_argument("--size", choices=("tiny", "small"), default="small")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--decide-every", type=int, default=10)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--study-trials", type=int, default=24, help="trials of each model's study")
    parser.add_argument("--study-steps", type=int, default=4, help="timed steps per study trial")
    parser.add_argument("--storage", help="the studies' storage (default: SQLite in a temporary directory)")
    parser.add_argument("--out", type=Path, help="write every run's figures and decision history as JSON")
    parser.add_argument(
        "--plan",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="start the adaptive run at the calibrated simulator's best (PolicySource(plan=...); default: "
        "PolicySource's, on for CPU runs)",
    )
    parser.add_argument("--observation-only", action="store_true", help="measure only the observation cost")
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    if args.observation_only and args.result is not None:
        parser.error("--result writes the three runs' record: it cannot go with --observation-only")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads, {args.steps} steps, size {args.size}, "
        f"decide every {args.decide_every}",
        flush=True,
    )
    if args.observation_only:
        print("| model | observation cost |\n|---|---:|")
        for name in args.workloads.split(","):
            cost = _observation_cost(name, args.size, args.steps, args.decide_every)
            print(f"| {name} | {cost:+.1%} of step time |", flush=True)
        return 0
    rows, out, settled, batches = [], {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="autotune-adaptive-") as tmp:
        for name in args.workloads.split(","):
            study = _study(name, args.size, args, Path(tmp))
            print(
                f"{name}: study of {study['trials']} trials ({study['states']}) in {study['seconds']:.0f} s, "
                f"best trial {study['trial']}: {study['config'].describe()}, {study['per_gib']:.0f} samples/s "
                f"per GiB, {study['over_default'] or float('nan'):.2f}x the default's",
                flush=True,
            )
            runs = _compare(name, args.size, args, study["config"])
            rows += [_row(name, label, runs[label]) for label in VARIANTS]
            settled[name] = runs
            batches[name] = _sizes(name, args.size)["batch_size"]
            ratio = {k: runs["adaptive"][k] / runs["study-best"][k] for k in ("thr_gib", "settled_gib")}
            print(
                f"{name}: adaptive / study-best samples/s per GiB: whole run {ratio['thr_gib']:.2f}, "
                f"settled {ratio['settled_gib']:.2f}; over the default (settled): adaptive "
                f"{runs['adaptive']['settled_gib'] / runs['default']['settled_gib']:.2f}x, study-best "
                f"{runs['study-best']['settled_gib'] / runs['default']['settled_gib']:.2f}x",
                flush=True,
            )
            out[name] = {
                "study": {**study, "config": study["config"].to_dict()},
                "runs": {
                    k: {**r, "settled": r["settled"].to_dict(), "final": r["final"].to_dict()} for k, r in runs.items()
                },
            }
    print(
        "\n| model | variant | samples/s | run peak MiB | samples/s per run-peak GiB | settled samples/s "
        "(steps) | settled peak MiB | settled samples/s per GiB | loss (last 5) | reconfigs (s) | "
        "settled config |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    print("\n".join(rows))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    if args.result is not None:
        from autotune.policies.ppo import PRETRAINED_DIR, load_policy
        from results import command_line, cpu_machine

        seen = policy_seen(list(settled), args.size, list(load_policy(PRETRAINED_DIR).metadata["trained_on"]))
        command = command_line(__file__, argv)
        write_record(
            args.result,
            cpu_machine(),
            settled,
            command,
            batches=batches,
            study_trials=args.study_trials,
            seen=seen,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
