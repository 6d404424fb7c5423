"""Does adding the selective recompute level help the study's pick, and never hurt it?

For each model (``--models``, default the corpus language models hf-gpt2, hf-llama, lstm-lm and
hf-vit at their built-in sizes; ``--tiny``: test sizes), at the workload's effective batch and
one memory budget between the peak of every block recomputed whole and the peak of none
recomputed (their midpoint, measured: where selective can matter), and for each objective
(``--objectives``, default ``per-gib,throughput``):

1. the same study (``--trials``, default 12; same budget, same space) with the selective level
   allowed and without it (``SearchSpace.selective``, ``--no-selective``), each with the sampler
   seeds 0 to ``--seeds`` - 1 (default 3): every (side, seed) its own study, in its own storage,
   so that nothing is reused across seeds or sides; each study's recommendation after its
   finalists' re-timing;
2. all the distinct picks of both sides and every seed re-timed side by side in one independent
   loop (:func:`autotune.measurement.sidebyside.retime_configs`: interleaved rounds, median of
   repeats), valued by the objective (samples/s, or samples/s per GiB of each pick's measured peak);
3. the ratio with / without: the median over seeds of the picks' values with the level over the
   median without it, and beside it the worst and the best per-seed ratio (seed s with over seed s
   without, round by round: the geometric mean of the judge's rounds' ratios).

At 12 trials the study's pick can vary from seed to seed by more than the level's effect, so one
seed per side cannot judge the goal the issue states: where selective sits on the Pareto front,
the study finds it; nowhere does adding the level make a pick worse (every median ratio >= 1
within the judge's spread).

Run: python benchmarks/selective_study.py [--models hf-gpt2,hf-llama,lstm-lm,hf-vit] [--tiny]
     [--seeds 3] [--trials 12] [--objectives per-gib,throughput] [--steps 3] --out DIR
     -> selective_study.json (one progress line per study, with its seconds)
     [--result docs/results/NAME.json]: also the results page's record (benchmarks/results.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))  # picks.py, results.py beside this file

from picks import GIB, JUDGE_ROUNDS, _source, distinct, machine

if TYPE_CHECKING:
    from autotune.search.trial_record import TrialRecord
    from autotune.workload import Workload

MODELS = ("hf-gpt2", "hf-llama", "lstm-lm", "hf-vit")
OBJECTIVES = ("per-gib", "throughput")
SIDES = ("without", "with")  # the study without the selective level, then with it
SEEDS = 3
# The "with" side's space: the level sampled in every trial, or reached only by the refinement's
# enqueued neighbours (SpaceSpec.selective = "refine"), the sampled trials then those without it.
LEVELS: dict[str, bool | Literal["refine"]] = {"sampled": True, "refine": "refine"}

COLUMNS = (
    "model",
    "objective",
    "seed",
    "pick without",
    "pick with",
    "samples/s without",
    "samples/s with",
    "peak MiB without",
    "peak MiB with",
    "per GiB without",
    "per GiB with",
    "with / without",
    "per-seed range",
)


def label(side: str, seed: int) -> str:
    """The key of one study's pick: ``with 0``, ``without 2``."""
    return f"{side} {seed}"


def budget_between(workload: Workload) -> dict[str, int]:
    """The measured peaks of no block and every block recomputed whole, and the budget between them."""
    from autotune import measure
    from autotune.config import TrainConfig

    peaks = {}
    for name, checkpoint in (("none", False), ("full", True)):
        m = measure(workload, TrainConfig(micro_batch_size=workload.batch_size, checkpoint=checkpoint), steps=1)
        assert m.peak_bytes is not None, f"{workload.name}: {name} recompute did not run ({m.status})"
        peaks[name] = m.peak_bytes
    return {"none": peaks["none"], "full": peaks["full"], "budget": (peaks["none"] + peaks["full"]) // 2}


def model_setup(model: str, *, tiny: bool, workdir: Path) -> tuple[Workload, dict[str, int], str]:
    """A corpus model's workload (its test size if ``tiny``), its budget between recompute's
    peaks (:func:`budget_between`) and the ``file.py:build`` reference its studies load."""
    from autotune.zoo import CORPUS

    entry = CORPUS[model]
    sizes = dict(entry.tiny if tiny else entry.sizes)
    workload = entry.build(**sizes)
    return workload, budget_between(workload), _source(workdir, model, sizes)


def run_study(
    reference: str,
    name: str,
    *,
    selective: bool | Literal["refine"],
    objective: str,
    budget: int,
    trials: int,
    steps: int,
    seed: int,
    workdir: Path,
) -> dict[str, Any]:
    """One study (the sampler's ``seed``, the given space's selective level: False, True, or
    ``"refine"``, in enqueued trials only), stored in ``workdir``
    alone: its recommendation after its finalists, and every trial's knobs, first measurement
    and duels (``trials``: where two runs of a study part)."""
    from autotune.search import MeasureSpec, RunOptions, SpaceSpec, StudySpec, open_study, prepare, run_study
    from autotune.search.results import require_recommended, summarize
    from autotune.units import MemoryBudget

    spec = StudySpec(
        workload=reference,
        name=name,
        trials=trials,
        memory_budget=MemoryBudget(bytes=budget),
        seed=seed,
        objective=objective,  # type: ignore[arg-type]  # checked by StudySpec
        policy_proposal=False,  # the same baselines on both sides: the level is the only difference
        space=SpaceSpec(precisions=("fp32", "bf16"), selective=selective),
        measure=MeasureSpec(steps=steps, warmup=1, trial_timeout=600.0),
    )
    workdir.mkdir(parents=True, exist_ok=True)
    options = RunOptions(
        storage=str(workdir / "studies.db"), cache=None, artifact_dir=workdir / "artifacts", dashboard=False
    )
    prepared = prepare(spec)
    start = time.perf_counter()
    run_study(prepared, open_study(prepared, options), options)
    study = open_study(prepared, options)
    summary = summarize(study)
    best = require_recommended(summary)
    assert best.config is not None and best.peak_bytes is not None
    return {
        "config": best.config.to_dict(),
        "describe": best.config.describe(),
        "peak_bytes": best.peak_bytes,
        "seconds": time.perf_counter() - start,
        "trials": [trace(t.user_attrs, r, objective) for t, r in zip(study.trials, summary.trials, strict=True)],
    }


def trace(attrs: dict[str, Any], record: TrialRecord, objective: str) -> dict[str, Any]:
    """One trial as a study's trace records it: its knobs, first samples/s and value under
    ``objective``, the trial it refined (``refined from``) and the one a duel showed better."""
    return {
        "trial": record.number,
        "knobs": None if record.config is None else record.config.describe(),
        "samples/s": record.throughput,
        "value": record.under(objective),  # type: ignore[arg-type]  # one of OBJECTIVES
        "refined from": attrs.get("refined_from"),
        "beaten by": record.beaten_by,
    }


def judge(workload: Workload, picks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """All the distinct picks re-timed side by side in this process, in one loop: each label's
    median samples/s."""
    from autotune.config import TrainConfig
    from autotune.measurement.sidebyside import retime_configs, round_values

    # The study's seed is also its configurations' data-order seed: the same knobs picked by two
    # seeds are one configuration to re-time.
    configs, index = distinct(
        {key: dataclasses.replace(TrainConfig.from_dict(pick["config"]), seed=0) for key, pick in picks.items()}
    )
    retimed = retime_configs(workload, configs, rounds=JUDGE_ROUNDS[0], max_rounds=JUDGE_ROUNDS[1])
    timings = retimed.timings
    return {
        key: {
            "samples/s": timings[i].median,
            "spread": timings[i].relative_spread,
            "per round": list(round_values(timings[i], retimed.rounds)),
        }
        for key, i in index.items()
    } | {"rounds": retimed.rounds, "decided": retimed.decided, "distinct": len(configs)}


def _value(cell: dict[str, Any], objective: str) -> float:
    """A pick's value in the objective: samples/s, or samples/s per GiB of its peak."""
    value: float = cell["samples/s"] if objective == "throughput" else cell["per GiB"]
    return value


def _ratio(with_: float, without: float) -> float:
    return with_ / without if without > 0 else 0.0


def pick_scale(pick: dict[str, Any], objective: str) -> float:
    """What turns a pick's judged samples/s into its value under ``objective``: 1, or per GiB of
    its measured peak."""
    return 1.0 if objective == "throughput" else GIB / pick["peak_bytes"]


def judged_ratio(picks: dict[str, dict[str, Any]], judged: dict[str, Any], a: str, b: str, objective: str) -> float:
    """Pick ``a``'s value over pick ``b``'s under ``objective``, round by round (the judge timed
    both in the same rounds: the geometric mean of the rounds' ratios)."""
    from autotune.measurement.sidebyside import Timing, paired_ratio

    rounds = judged[a]["per round"], judged[b]["per round"]
    return paired_ratio(
        Timing(rates=tuple(rounds[0])),
        Timing(rates=tuple(rounds[1])),
        rounds=len(rounds[0]),
        scale_a=pick_scale(picks[a], objective),
        scale_b=pick_scale(picks[b], objective),
    )


def row(
    model: str, objective: str, seeds: int, picks: dict[str, dict[str, Any]], judged: dict[str, Any]
) -> dict[str, Any]:
    """One (model, objective)'s record: per seed each side's pick, its re-timed samples/s, measured
    peak and per GiB and the ratio with / without in the objective's value, round by round (the
    judge timed both in the same rounds); the median over seeds of each side's values, their ratio,
    and the worst and best per-seed ratio."""
    per_seed = []
    for seed in range(seeds):
        entry: dict[str, Any] = {"seed": seed}
        for side in SIDES:
            key = label(side, seed)
            speed, peak = judged[key]["samples/s"], picks[key]["peak_bytes"]
            entry[side] = {
                "pick": picks[key]["describe"],
                "samples/s": speed,
                "peak MiB": peak / 2**20,
                "per GiB": speed * GIB / peak,
            }
        entry["ratio"] = judged_ratio(picks, judged, label("with", seed), label("without", seed), objective)
        per_seed.append(entry)
    median = {side: statistics.median(_value(e[side], objective) for e in per_seed) for side in SIDES}
    ratios = [e["ratio"] for e in per_seed]
    return {
        "model": model,
        "objective": objective,
        "seeds": per_seed,
        "median": median,
        "ratio": _ratio(median["with"], median["without"]),
        "worst": min(ratios),
        "best": max(ratios),
    }


def table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The record's rows, in :data:`COLUMNS`' order: each seed's, then the medians' (its values in
    the objective's columns, the per-seed ratios' range beside the median ratio)."""
    out: list[tuple[str, ...]] = []
    for r in rows:
        for e in r["seeds"]:
            out.append(
                (
                    r["model"],
                    r["objective"],
                    str(e["seed"]),
                    e["without"]["pick"],
                    e["with"]["pick"],
                    *(f"{e[side]['samples/s']:.2f}" for side in SIDES),
                    *(f"{e[side]['peak MiB']:.1f}" for side in SIDES),
                    *(f"{e[side]['per GiB']:.2f}" for side in SIDES),
                    f"{e['ratio']:.3f}",
                    "-",
                )
            )
        medians = tuple(f"{r['median'][side]:.2f}" for side in SIDES)
        speeds, per_gib = (medians, ("-", "-")) if r["objective"] == "throughput" else (("-", "-"), medians)
        out.append(
            (
                r["model"],
                r["objective"],
                "median",
                "-",
                "-",
                *speeds,
                "-",
                "-",
                *per_gib,
                f"{r['ratio']:.3f}",
                f"{r['worst']:.3f}-{r['best']:.3f}",
            )
        )
    return out


def _span(values: list[float]) -> str:
    """``0.98-1.10``, or one figure where both ends print alike."""
    low, high = f"{min(values):.2f}", f"{max(values):.2f}"
    return low if low == high else f"{low}-{high}"


def ratio_ranges(rows: list[dict[str, Any]]) -> str:
    """The median ratios' range and the per-seed ratios' range in words, e.g. ``median ratio
    0.98-1.04 over 4 rows; per seed 0.87-1.12``."""
    if not rows:
        return "no row"
    medians = [r["ratio"] for r in rows]
    per_seed = [e["ratio"] for r in rows for e in r["seeds"]]
    count = f"{len(rows)} {'row' if len(rows) == 1 else 'rows'}"
    return f"median ratio {_span(medians)} over {count}; per seed {_span(per_seed)}"


def write_record(path: Path, info: dict[str, Any], seeds: int, rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record (``benchmarks/results.py``)."""
    from results import write_result

    seed_words = "seed 0" if seeds == 1 else f"seeds 0-{seeds - 1}"
    refine = info.get("with_level") == "refine"
    level = (
        "reached only by the refinement's enqueued neighbours, never sampled" if refine else "sampled in every trial"
    )
    objectives = sorted({r["objective"] for r in rows})
    write_result(
        path,
        title="The study's pick with and without selective recompute"
        + (", the level by refinement only" if refine else "")
        + (f", objective {objectives[0]}" if len(objectives) == 1 else ""),
        claim=(
            f"The same study (same trials and budget, between the peaks of every block recomputed whole and none) "
            f"run with the selective recompute level ({level}) and without it, each with the sampler "
            f"{seed_words}; "
            "all the distinct picks of both sides and every seed re-timed side by side in one loop per model and "
            "objective (interleaved rounds, median), the peaks measured. The ratio is the median over seeds of the "
            "picks' values with the level over the median without it, in the objective's value (samples/s per GiB, "
            "or samples/s under `throughput`); the per-seed range is the worst and best of seed s with over seed s "
            f"without: {ratio_ranges(rows)} here."
        ),
        machine=f"{info['cpu']}, {info['cores']} cores, {info['threads']} torch threads",
        capability=f"CPU `{info['capability']}`",
        date=info["date"],
        command=command,
        columns=COLUMNS,
        rows=table(rows),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--objectives", default=",".join(OBJECTIVES))
    parser.add_argument("--seeds", type=int, default=SEEDS, help="each side's studies, with sampler seeds 0..N-1")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trial")
    parser.add_argument("--tiny", action="store_true", help="each model at its test size")
    parser.add_argument(
        "--with-level",
        choices=LEVELS,
        default="sampled",
        help='how the "with" side has the level: sampled in every trial (--selective), or only in the '
        "refinement's enqueued trials (--selective-refine)",
    )
    args = parser.parse_args(argv)
    from results import corpus_models

    models = corpus_models(parser, args.models)
    objectives = args.objectives.split(",")
    if any(o not in OBJECTIVES for o in objectives):
        parser.error(f"--objectives must be of {OBJECTIVES}, but got {args.objectives!r}")
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, but got {args.seeds}")
    import torch

    info = machine(torch.get_num_threads()) | {
        "date": time.strftime("%Y-%m-%d"),
        "tiny": args.tiny,
        "with_level": args.with_level,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="selective-study-") as tmp:
        workdir = Path(tmp)
        for model in models:
            workload, peaks, reference = model_setup(model, tiny=args.tiny, workdir=workdir)
            for objective in objectives:
                picks = {}
                for seed in range(args.seeds):
                    for side in SIDES:
                        name = f"{model}-{objective}-{side}-seed{seed}"
                        picks[label(side, seed)] = pick = run_study(
                            reference,
                            name,
                            selective=LEVELS[args.with_level] if side == "with" else False,
                            objective=objective,
                            budget=peaks["budget"],
                            trials=args.trials,
                            steps=args.steps,
                            seed=seed,
                            workdir=workdir / name,
                        )
                        print(f"{name}: {pick['describe']} ({pick['seconds']:.0f} s)", flush=True)
                judged = judge(workload, picks)
                rows.append(row(model, objective, args.seeds, picks, judged))
                runs.append({"model": model, "objective": objective, "peaks": peaks, "picks": picks, "judged": judged})
                r, n = rows[-1], judged["distinct"]
                print(
                    f"{model} {objective}: with / without {r['ratio']:.3f} (median of {args.seeds} seeds; "
                    f"per seed {r['worst']:.3f}-{r['best']:.3f}; {n} distinct pick{'' if n == 1 else 's'} re-timed)",
                    flush=True,
                )
                (args.out / "selective_study.json").write_text(
                    json.dumps({"machine": info, "seeds": args.seeds, "rows": rows, "runs": runs}, indent=2)
                )
    if args.result is not None:
        from results import command_line

        write_record(args.result, info, args.seeds, rows, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
