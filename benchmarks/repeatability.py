"""Run to run: how alike are two runs of the same study on this machine?

For each model (``--models``, default the corpus language models hf-gpt2 and hf-llama and the
ViT hf-vit at their built-in sizes; ``--tiny``: test sizes), at the workload's effective batch
and the budget between the measured peaks of every block recomputed whole and none
(``selective_study.budget_between``: where the knobs trade most), under one objective
(``--objective``, default ``per-gib``):

1. the same study (``--trials``, default 12; same space, budget and sampler seed) run twice for
   each sampler seed 0 to ``--seeds`` - 1 (default 3), every run in its own storage: nothing is
   reused between the two, so what differs is what the machine did while they measured;
2. every distinct pick of the model re-timed side by side in one independent loop
   (``selective_study.judge``: interleaved rounds, medians);
3. per seed: whether the two runs picked the same configuration, and the worse run's pick's value
   over the better's, round by round (the geometric mean of the judge's per-round ratios: 1.0
   where they picked alike); per model: how many seeds picked alike, the median and the worst of
   those ratios, and the worst pick's value over the best pick's (what running the study once
   can cost, against the best any run here found).

Each run's trials (knobs, first measurement, refinement and duels) are in the JSON output, to
find where two runs part.

Run: python benchmarks/repeatability.py [--models hf-gpt2,hf-llama,hf-vit] [--tiny] [--seeds 3]
     [--trials 12] [--objective per-gib] [--steps 3] --out DIR
     -> repeatability.json (one progress line per study, with its seconds)
     [--result docs/results/NAME.json]: also the results page's record (benchmarks/results.py)

Two runs of it (before and after a change to the study, say) judged against each other:
     python benchmarks/repeatability.py --compare BEFORE.json AFTER.json --out DIR
     -> compare.json: per model, every distinct pick of both re-timed side by side in one loop, and
     the median of AFTER's picks' values over the median of BEFORE's (no study runs)
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # picks.py, results.py beside this file

from picks import machine
from selective_study import (  # label: ``run 1 0``
    OBJECTIVES,
    judge,
    judged_ratio,
    label,
    model_setup,
    pick_scale,
    run_study,
)

MODELS = ("hf-gpt2", "hf-llama", "hf-vit")
SEEDS = 3
RUNS = ("run 1", "run 2")

COLUMNS = (
    "model",
    "seed",
    "pick run 1",
    "pick run 2",
    "alike",
    "value run 1",
    "value run 2",
    "worse / better",
)


def row(
    model: str, objective: str, seeds: int, picks: dict[str, dict[str, Any]], judged: dict[str, Any]
) -> dict[str, Any]:
    """One model's record: per seed both runs' picks, their judged values under ``objective``
    (samples/s, or samples/s per GiB of each pick's measured peak) and the worse over the better
    round by round; the seeds alike, the median and worst of those ratios, and the worst pick's
    value over the best pick's, round by round."""

    def scale(key: str) -> float:
        return pick_scale(picks[key], objective)

    def ratio(a: str, b: str) -> float:
        return judged_ratio(picks, judged, a, b, objective)

    per_seed = []
    for seed in range(seeds):
        one, two = label(RUNS[0], seed), label(RUNS[1], seed)
        alike = picks[one]["describe"] == picks[two]["describe"]
        second = 1.0 if alike else ratio(two, one)
        per_seed.append(
            {
                "seed": seed,
                "picks": [picks[one]["describe"], picks[two]["describe"]],
                "values": [judged[k]["samples/s"] * scale(k) for k in (one, two)],
                "alike": alike,
                "worse / better": min(second, 1 / second) if second > 0 else 0.0,
            }
        )
    keys = [label(run, seed) for seed in range(seeds) for run in RUNS]
    value = {k: judged[k]["samples/s"] * scale(k) for k in keys}
    best, worst = max(keys, key=value.__getitem__), min(keys, key=value.__getitem__)
    ratios = [e["worse / better"] for e in per_seed]
    return {
        "model": model,
        "objective": objective,
        "seeds": per_seed,
        "alike": sum(e["alike"] for e in per_seed),
        "median": statistics.median(ratios),
        "worst": min(ratios),
        "worst pick / best pick": 1.0 if picks[best]["describe"] == picks[worst]["describe"] else ratio(worst, best),
    }


def table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The record's rows, in :data:`COLUMNS`' order: each seed's, then the model's summary (the
    seeds alike, the median and worst of the seeds' worse / better, the worst pick over the best)."""
    out: list[tuple[str, ...]] = []
    for r in rows:
        for e in r["seeds"]:
            out.append(
                (
                    r["model"],
                    str(e["seed"]),
                    *e["picks"],
                    "yes" if e["alike"] else "no",
                    *(f"{v:.2f}" for v in e["values"]),
                    f"{e['worse / better']:.3f}",
                )
            )
        seeds = len(r["seeds"])
        out.append(
            (
                r["model"],
                "all",
                "-",
                "-",
                f"{r['alike']} of {seeds}",
                "-",
                "-",
                f"median {r['median']:.3f}, worst {r['worst']:.3f}; "
                f"worst pick / best {r['worst pick / best pick']:.3f}",
            )
        )
    return out


def summary(rows: list[dict[str, Any]]) -> str:
    """The record in words, e.g. ``alike in 5 of 9 seeds; worse / better per seed 0.91-1.00;
    worst pick / best 0.85-0.97``."""
    if not rows:
        return "no row"
    seeds = sum(len(r["seeds"]) for r in rows)
    per_seed = [e["worse / better"] for r in rows for e in r["seeds"]]
    worst = [r["worst pick / best pick"] for r in rows]
    return (
        f"alike in {sum(r['alike'] for r in rows)} of {seeds} seeds; worse / better per seed "
        f"{min(per_seed):.2f}-{max(per_seed):.2f}; worst pick / best per model {min(worst):.2f}-{max(worst):.2f}"
    )


def write_record(
    path: Path, info: dict[str, Any], seeds: int, trials: int, rows: list[dict[str, Any]], command: str
) -> None:
    """The results page's record (``benchmarks/results.py``)."""
    from results import write_result

    seed_words = "seed 0" if seeds == 1 else f"seeds 0-{seeds - 1}"
    objective = rows[0]["objective"] if rows else "per-gib"
    write_result(
        path,
        title=f"Run to run: the same study twice, objective {objective}",
        claim=(
            f"The same {trials}-trial study (same space, budget between the peaks of every block recomputed whole "
            f"and none, sampler {seed_words}) run twice per seed, each run in its own storage; every distinct pick "
            "re-timed side by side in one loop per model (interleaved rounds, median), the peaks measured. Per seed, "
            "the worse run's pick over the better's in the objective's value, round by round (1.0 where they picked "
            f"alike); per model, the worst pick over the best pick any run found: {summary(rows)} here."
        ),
        machine=f"{info['cpu']}, {info['cores']} cores, {info['threads']} torch threads",
        capability=f"CPU `{info['capability']}`",
        date=info["date"],
        command=command,
        columns=COLUMNS,
        rows=table(rows),
    )


def compare(before: dict[str, Any], after: dict[str, Any], judged: dict[str, Any], objective: str) -> dict[str, Any]:
    """One model's picks of two runs of this benchmark (``before`` and ``after``: their ``runs``
    entries), judged in one loop (``judged``, keyed ``before run 1 0`` ...): each side's median
    value under ``objective`` and the ratio after / before."""
    medians = {}
    for side, run in (("before", before), ("after", after)):
        values = []
        for key, pick in run["picks"].items():
            values.append(judged[f"{side} {key}"]["samples/s"] * pick_scale(pick, objective))
        medians[side] = statistics.median(values)
    return {"median": medians, "after / before": medians["after"] / medians["before"]}


def compare_runs(before_path: Path, after_path: Path, out: Path) -> int:
    """``--compare``: every model both files ran, its picks of both judged side by side."""
    from autotune.zoo import CORPUS

    before, after = (json.loads(p.read_text()) for p in (before_path, after_path))
    objective = after["rows"][0]["objective"] if after["rows"] else "per-gib"
    tiny = bool(after["machine"].get("tiny"))
    earlier = {r["model"]: r for r in before["runs"]}
    rows = []
    out.mkdir(parents=True, exist_ok=True)
    for run in after["runs"]:
        model = run["model"]
        if model not in earlier:
            continue
        entry = CORPUS[model]
        workload = entry.build(**dict(entry.tiny if tiny else entry.sizes))
        picks = {
            f"{side} {key}": pick
            for side, r in (("before", earlier[model]), ("after", run))
            for key, pick in r["picks"].items()
        }
        judged = judge(workload, picks)
        rows.append({"model": model, "judged": judged} | compare(earlier[model], run, judged, objective))
        r = rows[-1]
        print(
            f"{model}: median {objective} after / before {r['after / before']:.3f} "
            f"({r['median']['after']:.2f} / {r['median']['before']:.2f}; {judged['distinct']} distinct picks re-timed)",
            flush=True,
        )
        (out / "compare.json").write_text(
            json.dumps({"before": str(before_path), "after": str(after_path), "rows": rows}, indent=2)
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--objective", choices=OBJECTIVES, default="per-gib")
    parser.add_argument("--seeds", type=int, default=SEEDS, help="sampler seeds 0..N-1, each run twice")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trial")
    parser.add_argument("--tiny", action="store_true", help="each model at its test size")
    parser.add_argument(
        "--compare",
        nargs=2,
        type=Path,
        metavar=("BEFORE", "AFTER"),
        help="judge two runs' repeatability.json picks against each other instead of running studies",
    )
    args = parser.parse_args(argv)
    if args.compare is not None:
        before, after = args.compare
        return compare_runs(before, after, args.out)
    from results import corpus_models

    models = corpus_models(parser, args.models)
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, but got {args.seeds}")
    import torch

    info = machine(torch.get_num_threads()) | {"date": time.strftime("%Y-%m-%d"), "tiny": args.tiny}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="repeatability-") as tmp:
        workdir = Path(tmp)
        for model in models:
            workload, peaks, reference = model_setup(model, tiny=args.tiny, workdir=workdir)
            picks = {}
            for seed in range(args.seeds):
                for run in RUNS:
                    name = f"{model}-{args.objective}-seed{seed}-{run.replace(' ', '')}"
                    picks[label(run, seed)] = pick = run_study(
                        reference,
                        name,
                        selective=False,
                        objective=args.objective,
                        budget=peaks["budget"],
                        trials=args.trials,
                        steps=args.steps,
                        seed=seed,
                        workdir=workdir / name,
                    )
                    print(f"{name}: {pick['describe']} ({pick['seconds']:.0f} s)", flush=True)
            judged = judge(workload, picks)
            rows.append(row(model, args.objective, args.seeds, picks, judged))
            runs.append({"model": model, "peaks": peaks, "picks": picks, "judged": judged})
            r = rows[-1]
            print(
                f"{model}: alike in {r['alike']} of {args.seeds} seeds; worse / better median {r['median']:.3f}, "
                f"worst {r['worst']:.3f}; worst pick / best {r['worst pick / best pick']:.3f}",
                flush=True,
            )
            (args.out / "repeatability.json").write_text(
                json.dumps({"machine": info, "seeds": args.seeds, "rows": rows, "runs": runs}, indent=2)
            )
    if args.result is not None:
        from results import command_line

        write_record(args.result, info, args.seeds, args.trials, rows, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
