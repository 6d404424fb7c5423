"""Does adding the selective recompute level help the study's pick, and never hurt it?

For each model (``--models``, default the corpus language models hf-gpt2, hf-llama, lstm-lm and
hf-vit at their built-in sizes; ``--tiny``: test sizes), at the workload's effective batch and
one memory budget between the peak of every block recomputed whole and the peak of none
recomputed (their midpoint, measured: where selective can matter), and for each objective
(``--objectives``, default ``per-gib,throughput``):

1. the same study twice (``--trials``, default 12; seed 0; same budget, same space), once with
   the selective level allowed and once without (``SearchSpace.selective``, ``--no-selective``):
   each study's recommendation after its finalists' re-timing;
2. both picks re-timed side by side in one independent loop
   (:func:`autotune.measurement.sidebyside.retime_configs`: interleaved rounds, median of
   repeats), valued by the objective (samples/s, or samples/s per GiB of each pick's measured peak);
   the ratio with / without (1.0 where both studies picked the same configuration).

The goal the issue states: where selective sits on the Pareto front, the study finds it; nowhere
does adding the level make a pick worse (every ratio >= 1 within the judge's spread).

Run: python benchmarks/selective_study.py [--models hf-gpt2,hf-llama,lstm-lm,hf-vit] [--tiny]
     [--trials 12] [--objectives per-gib,throughput] [--steps 3] --out DIR -> selective_study.json
     [--result docs/results/NAME.json]: also the results page's record (benchmarks/results.py)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # picks.py, results.py beside this file

from picks import GIB, JUDGE_ROUNDS, _source, distinct, machine

if TYPE_CHECKING:
    from autotune.workload import Workload

MODELS = ("hf-gpt2", "hf-llama", "lstm-lm", "hf-vit")
OBJECTIVES = ("per-gib", "throughput")
SIDES = ("without", "with")  # the study without the selective level, then with it

COLUMNS = (
    "model",
    "objective",
    "pick without",
    "pick with",
    "samples/s without",
    "samples/s with",
    "peak MiB without",
    "peak MiB with",
    "per GiB without",
    "per GiB with",
    "with / without",
)


def budget_between(workload: Workload) -> dict[str, int]:
    """The measured peaks of no block and every block recomputed whole, and the budget between them."""
    from autotune import measure
    from autotune.config import TrainConfig

    peaks = {}
    for label, checkpoint in (("none", False), ("full", True)):
        m = measure(workload, TrainConfig(micro_batch_size=workload.batch_size, checkpoint=checkpoint), steps=1)
        assert m.peak_bytes is not None, f"{workload.name}: {label} recompute did not run ({m.status})"
        peaks[label] = m.peak_bytes
    return {"none": peaks["none"], "full": peaks["full"], "budget": (peaks["none"] + peaks["full"]) // 2}


def run_study(
    reference: str, name: str, *, selective: bool, objective: str, budget: int, trials: int, steps: int, workdir: Path
) -> dict[str, Any]:
    """One study (seed 0, the given space's selective level): its recommendation after its finalists."""
    from autotune.search import MeasureSpec, RunOptions, SpaceSpec, StudySpec, open_study, prepare, run_study
    from autotune.search.results import require_recommended, summarize
    from autotune.units import MemoryBudget

    spec = StudySpec(
        workload=reference,
        name=name,
        trials=trials,
        memory_budget=MemoryBudget(bytes=budget),
        seed=0,
        objective=objective,  # type: ignore[arg-type]  # checked by StudySpec
        policy_proposal=False,  # the same baselines on both sides: the level is the only difference
        space=SpaceSpec(precisions=("fp32", "bf16"), selective=selective),
        measure=MeasureSpec(steps=steps, warmup=1, trial_timeout=600.0),
    )
    options = RunOptions(
        storage=str(workdir / "studies.db"), cache=None, artifact_dir=workdir / "artifacts", dashboard=False
    )
    prepared = prepare(spec)
    start = time.perf_counter()
    run_study(prepared, open_study(prepared, options), options)
    best = require_recommended(summarize(open_study(prepared, options)))
    assert best.config is not None and best.peak_bytes is not None
    return {
        "config": best.config.to_dict(),
        "describe": best.config.describe(),
        "peak_bytes": best.peak_bytes,
        "seconds": time.perf_counter() - start,
    }


def judge(workload: Workload, picks: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Both picks re-timed side by side in this process: each one's median samples/s."""
    from autotune.config import TrainConfig
    from autotune.measurement.sidebyside import retime_configs

    configs, index = distinct({side: TrainConfig.from_dict(picks[side]["config"]) for side in SIDES})
    retimed = retime_configs(workload, configs, rounds=JUDGE_ROUNDS[0], max_rounds=JUDGE_ROUNDS[1])
    return {
        side: {"samples/s": retimed.timings[i].median, "spread": retimed.timings[i].relative_spread}
        for side, i in index.items()
    } | {"rounds": retimed.rounds, "decided": retimed.decided}


def row(model: str, objective: str, picks: dict[str, dict[str, Any]], judged: dict[str, Any]) -> dict[str, Any]:
    """One record row: each side's pick, its re-timed samples/s, measured peak and per GiB, and the
    ratio with / without in the objective's value."""
    out: dict[str, Any] = {"model": model, "objective": objective}
    for side in SIDES:
        speed, peak = judged[side]["samples/s"], picks[side]["peak_bytes"]
        out[side] = {
            "pick": picks[side]["describe"],
            "samples/s": speed,
            "peak MiB": peak / 2**20,
            "per GiB": speed * GIB / peak,
        }
    key = "samples/s" if objective == "throughput" else "per GiB"
    without = out["without"][key]
    out["ratio"] = out["with"][key] / without if without > 0 else 0.0
    return out


def table(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The record's rows, in :data:`COLUMNS`' order."""
    return [
        (
            r["model"],
            r["objective"],
            r["without"]["pick"],
            r["with"]["pick"],
            *(f"{r[side]['samples/s']:.2f}" for side in SIDES),
            *(f"{r[side]['peak MiB']:.1f}" for side in SIDES),
            *(f"{r[side]['per GiB']:.2f}" for side in SIDES),
            f"{r['ratio']:.3f}",
        )
        for r in rows
    ]


def _ratio_range(rows: list[dict[str, Any]]) -> str:
    """The ratios' range in words, e.g. ``0.98-1.10 over 4 rows``."""
    ratios = [r["ratio"] for r in rows]
    if not ratios:
        return "no row"
    low, high = min(ratios), max(ratios)
    span = f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"
    return f"{span} over {len(ratios)} {'row' if len(ratios) == 1 else 'rows'}"


def write_record(path: Path, info: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record (``benchmarks/results.py``)."""
    from results import write_result

    write_result(
        path,
        title="The study's pick with and without selective recompute",
        claim=(
            "The same study (same seed, trials and budget, between the peaks of every block recomputed whole and "
            "none) run with the selective recompute level and without it; both picks re-timed side by side in one "
            "loop (interleaved rounds, median), the peaks measured. The ratio is the pick with the level over the "
            "pick without it in the objective's value (samples/s per GiB, or samples/s under `throughput`): "
            f"{_ratio_range(rows)} here."
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
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trial")
    parser.add_argument("--tiny", action="store_true", help="each model at its test size")
    args = parser.parse_args(argv)
    from autotune.zoo import CORPUS

    models = args.models.split(",")
    unknown = [m for m in models if m not in CORPUS]
    if unknown:
        parser.error(f"--models must be corpus models ({', '.join(CORPUS)}), but got {unknown[0]!r}")
    objectives = args.objectives.split(",")
    if any(o not in OBJECTIVES for o in objectives):
        parser.error(f"--objectives must be of {OBJECTIVES}, but got {args.objectives!r}")
    import torch

    info = machine(torch.get_num_threads()) | {"date": time.strftime("%Y-%m-%d"), "tiny": args.tiny}
    args.out.mkdir(parents=True, exist_ok=True)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="selective-study-") as tmp:
        workdir = Path(tmp)
        for model in models:
            entry = CORPUS[model]
            sizes = dict(entry.tiny if args.tiny else entry.sizes)
            workload = entry.build(**sizes)
            peaks = budget_between(workload)
            reference = _source(workdir, model, sizes)
            for objective in objectives:
                picks = {
                    side: run_study(
                        reference,
                        f"{model}-{objective}-{side}",
                        selective=side == "with",
                        objective=objective,
                        budget=peaks["budget"],
                        trials=args.trials,
                        steps=args.steps,
                        workdir=workdir,
                    )
                    for side in SIDES
                }
                judged = judge(workload, picks)
                rows.append(row(model, objective, picks, judged))
                runs.append({"model": model, "objective": objective, "peaks": peaks, "picks": picks, "judged": judged})
                print(f"{model} {objective}: with / without {rows[-1]['ratio']:.3f}", flush=True)
                (args.out / "selective_study.json").write_text(
                    json.dumps({"machine": info, "rows": rows, "runs": runs}, indent=2)
                )
    if args.result is not None:
        from results import command_line

        write_record(args.result, info, rows, command_line(__file__, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
