"""How often a side-by-side verdict is wrong: the paired rule (round by round) against the unpaired
one (two medians and their spreads), on this machine's own step times.

For each model, two configurations that cost exactly the same (one configuration, the second with
another data order, so the loop reconfigures between them as between any two) are re-timed side
by side for ``--rounds`` rounds (:func:`autotune.measurement.sidebyside.retime_configs`, two
steps each per round). Each window of six consecutive rounds, both ways round, is then decided as
a study decides (three rounds, a round more while undecided, at most six), after multiplying the
first side's rates by an effect of 1.00 (a tie), 1.03, 1.05, 1.10 or 1.20: real noise around a
known difference.

* ``decided``: the share of windows called;
* ``wrong way``: the share called for the slower side (at an effect of 1.00 every call is one);
* ``rounds``: the mean rounds the calls took (the time a verdict costs).

Each model runs at the corpus' size (steps of 0.1-1 s on a 2-core CPU) and at its test size (steps
of milliseconds, where a step's jitter is a larger share of it).

Run (nothing else on the machine; ~2 minutes per model at the corpus' sizes, seconds at the tiny):

    python benchmarks/decision_rule.py --out build/decision-rule [--models hf-llama,hf-vit] [--sizes tiny]

Writes ``decision_rule.json`` and ``decision_rule.md`` to ``--out``; with ``--result
docs/results/decision-rule.json`` the results page's record (then ``python
benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.measurement.sidebyside import Timing, round_values, separated, separated_by_rounds

MODELS = ("hf-llama", "hf-vit", "hf-gpt2")
EFFECTS = (1.0, 1.03, 1.05, 1.10, 1.20)
RULES = ("unpaired", "paired")
STEPS_PER_ROUND = 2
FIRST, LAST = 3, 6  # the study's rounds: three, then one more while undecided, at most six
SIZES = ("corpus", "tiny")  # the corpus' sizes (steps of 0.1-1 s here) and its test sizes (milliseconds)
COLUMNS = ("model", "size", "effect", "rule", "decided", "wrong way", "rounds")


def decide(rule: str, a: Sequence[float], b: Sequence[float], rounds: int) -> tuple[bool, bool]:
    """(decided, for ``a``) by ``rule`` on the first ``rounds`` rounds of both sides' rates."""
    n = rounds * STEPS_PER_ROUND
    ta, tb = Timing(rates=tuple(a[:n])), Timing(rates=tuple(b[:n]))
    a_leads = ta.median >= tb.median
    lead, runner = (ta, tb) if a_leads else (tb, ta)
    if rule == "unpaired":
        return separated(lead, runner), a_leads
    if rule == "paired":
        return separated_by_rounds(lead, runner, rounds=rounds), a_leads
    raise ValueError(f"decide: rule must be one of {RULES}, but got {rule!r}.")


def evaluate(rates: tuple[Sequence[float], Sequence[float]], *, effect: float, rule: str) -> dict[str, float]:
    """Every window of :data:`LAST` consecutive rounds of an A/A pair, both ways round, with the
    first side's rates times ``effect``, decided as a study does: the share decided, the share
    decided for the slower side (every decision when ``effect`` is 1) and the mean rounds used."""
    per = STEPS_PER_ROUND
    total = min(len(rates[0]), len(rates[1])) // per
    if total < LAST:
        raise ValueError(f"evaluate: at least {LAST} rounds of rates are needed, but got {total}.")
    decided = wrong = rounds_used = windows = 0
    for start in range(total - LAST + 1):
        window = [list(r[start * per : (start + LAST) * per]) for r in rates]
        for first, second in ((0, 1), (1, 0)):
            a = [effect * v for v in window[first]]
            b = window[second]
            for rounds in range(FIRST, LAST + 1):
                called, a_wins = decide(rule, a, b, rounds)
                if called:
                    break
            windows += 1
            rounds_used += rounds
            if called:
                decided += 1
                wrong += effect == 1.0 or not a_wins
    return {"decided": decided / windows, "wrong way": wrong / windows, "rounds": rounds_used / windows}


def spreads(rates: tuple[Sequence[float], Sequence[float]]) -> dict[str, float]:
    """Each side's relative median absolute deviation over all its steps, and that of the round
    by round log-ratio of the two: what pairing removes."""
    sides = [Timing(rates=tuple(r)) for r in rates]
    rounds = min(len(r) for r in rates) // STEPS_PER_ROUND
    a, b = (round_values(t, rounds) for t in sides)
    log_ratios = Timing(rates=tuple(math.log(x / y) for x, y in zip(a, b, strict=True)))
    return {"side spread": max(t.relative_spread for t in sides), "paired spread": log_ratios.mad}


def collect(model: str, *, rounds: int, size: str) -> dict[str, Any]:
    """The A/A pair of ``model`` at ``size`` re-timed side by side for ``rounds`` rounds."""
    from autotune.config import TrainConfig
    from autotune.measurement.sidebyside import retime_configs
    from autotune.zoo import CORPUS

    entry = CORPUS[model]
    workload = entry.build(**dict(entry.tiny if size == "tiny" else entry.sizes))
    blocks = len(workload.block_names())
    micro = 4 if workload.batch_size % 4 == 0 else 1
    config = TrainConfig(
        micro_batch_size=micro,
        grad_accum_steps=workload.batch_size // micro,
        outer_precision="bf16",
        checkpoint=tuple(i < blocks // 3 for i in range(blocks)),
    )
    pair = [config, dataclasses.replace(config, seed=1)]
    retimed = retime_configs(workload, pair, rounds=rounds, max_rounds=rounds, steps_per_round=STEPS_PER_ROUND)
    return {
        "model": model,
        "size": size,
        "config": config.describe(),
        "rates": [list(t.rates) for t in retimed.timings],
        "other_cores": retimed.other_cores,
    }


def rows_of(run: dict[str, Any]) -> list[tuple[str, ...]]:
    rates = (run["rates"][0], run["rates"][1])
    rows: list[tuple[str, ...]] = []
    for effect in EFFECTS:
        for rule in RULES:
            e = evaluate(rates, effect=effect, rule=rule)
            rows.append(
                (
                    run["model"],
                    run["size"],
                    f"{effect:.2f}",
                    rule,
                    f"{e['decided']:.2f}",
                    f"{e['wrong way']:.3f}",
                    f"{e['rounds']:.1f}",
                )
            )
    return rows


def markdown(rows: list[tuple[str, ...]]) -> str:
    from results import markdown_table

    return "\n".join(markdown_table(COLUMNS, rows)) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=60, help="side-by-side rounds per model (default 60)")
    parser.add_argument("--sizes", default=",".join(SIZES), help="corpus (its sizes), tiny (its test sizes) or both")
    args = parser.parse_args(argv)
    from results import corpus_models

    models = corpus_models(parser, args.models)
    sizes = args.sizes.split(",")
    if any(size not in SIZES for size in sizes):
        parser.error(f"--sizes must be of {SIZES}, but got {args.sizes!r}")
    if args.rounds < LAST:
        parser.error(f"--rounds must be at least {LAST}, but got {args.rounds}")
    from results import command_line, cpu_machine, machine_fields, write_result

    machine = cpu_machine()
    args.out.mkdir(parents=True, exist_ok=True)
    runs, rows = [], []
    for model, size in ((m, z) for z in sizes for m in models):
        run = collect(model, rounds=args.rounds, size=size)
        run["spreads"] = spreads((run["rates"][0], run["rates"][1]))
        runs.append(run)
        rows += rows_of(run)
        s = run["spreads"]
        print(
            f"{model} ({size}): {args.rounds} rounds of {run['config']}; each side's spread {s['side spread']:.1%}, "
            f"round by round {s['paired spread']:.1%}",
            flush=True,
        )
        (args.out / "decision_rule.json").write_text(json.dumps({"machine": machine, "runs": runs}, indent=2) + "\n")
        (args.out / "decision_rule.md").write_text(markdown(rows))
    print(markdown(rows), end="")
    if args.result:
        spread_words = "; ".join(
            f"{r['model']} ({r['size']}) {r['spreads']['side spread']:.1%} per side, "
            f"{r['spreads']['paired spread']:.1%} round by round"
            for r in runs
        )
        write_result(
            args.result,
            title="Side-by-side verdicts: paired round by round, or two medians and their spreads",
            claim=(
                f"Two configurations that cost the same (one, and itself with another data order) re-timed side "
                f"by side for {args.rounds} rounds per model; every window of six rounds, both ways round, decided "
                "as a study decides (three rounds, more while undecided, at most six) after multiplying one side's "
                "rates by the effect: this machine's own noise around a known difference. `unpaired`: the leader's "
                "median above the runner-up's by more than both spreads (the rule before); `paired`: a one-sided "
                "95% t-test on the round-by-round log-ratios (`separated_by_rounds`, the rule now). `wrong way`: "
                "the share of windows called for the slower side (at 1.00, every call). Spreads (median absolute "
                f"deviation): {spread_words}."
            ),
            **machine_fields(machine),
            command=command_line(__file__, argv),
            columns=COLUMNS,
            rows=rows,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
