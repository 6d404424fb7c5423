"""benchmarks/repeatability.py's record rows from scripted picks and re-timings of two seeds (no
wall clock); the run itself is the lead's to do (``python benchmarks/repeatability.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import ROOT

MIB = 2**20


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports picks.py and selective_study.py beside it
    spec = importlib.util.spec_from_file_location("repeatability", ROOT / "benchmarks" / "repeatability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Seed 0: the two runs picked alike; seed 1: run 2 picked a faster but larger configuration.
PICKS = {
    "run 1 0": {"describe": "a", "peak_bytes": 1024 * MIB},
    "run 2 0": {"describe": "a", "peak_bytes": 1024 * MIB},
    "run 1 1": {"describe": "b", "peak_bytes": 512 * MIB},
    "run 2 1": {"describe": "c", "peak_bytes": 2048 * MIB},
}
JUDGED = {
    "run 1 0": {"samples/s": 30.0, "spread": 0.01, "per round": [30.0, 30.0]},
    "run 2 0": {"samples/s": 30.0, "spread": 0.01, "per round": [30.0, 30.0]},
    # Medians 12 and 40, but round by round 40 / 10 and 40 / 14: the machine drifted.
    "run 1 1": {"samples/s": 12.0, "spread": 0.1, "per round": [10.0, 14.0]},
    "run 2 1": {"samples/s": 40.0, "spread": 0.01, "per round": [40.0, 40.0]},
    "rounds": 2,
    "decided": True,
    "distinct": 3,
}


def test_a_throughput_row_compares_the_two_runs_of_each_seed_round_by_round(bench: ModuleType) -> None:
    row = bench.row("hf-gpt2", "throughput", 2, PICKS, JUDGED)
    assert row["seeds"] == [
        {"seed": 0, "picks": ["a", "a"], "values": [30.0, 30.0], "alike": True, "worse / better": 1.0},
        {
            "seed": 1,
            "picks": ["b", "c"],
            "values": [12.0, 40.0],
            "alike": False,
            "worse / better": pytest.approx((10 / 40 * 14 / 40) ** 0.5),
        },
    ]
    assert row["alike"] == 1
    assert row["median"] == pytest.approx((1.0 + (10 / 40 * 14 / 40) ** 0.5) / 2)
    assert row["worst"] == pytest.approx((10 / 40 * 14 / 40) ** 0.5)
    # the worst pick (b, 12 samples/s) over the best (c, 40), round by round
    assert row["worst pick / best pick"] == pytest.approx((10 / 40 * 14 / 40) ** 0.5)


def test_a_per_gib_row_values_each_pick_per_gib_of_its_own_peak(bench: ModuleType) -> None:
    row = bench.row("hf-gpt2", "per-gib", 2, PICKS, JUDGED)
    # per GiB: b 12 / 0.5 = 24 (rounds 20, 28), c 40 / 2 = 20 (rounds 20, 20): b is the better now
    assert row["seeds"][1]["values"] == [24.0, 20.0]
    assert row["seeds"][1]["worse / better"] == pytest.approx((20 / 20 * 20 / 28) ** 0.5)
    # a: 30 per GiB, the best; c: 20, the worst
    assert row["worst pick / best pick"] == pytest.approx(20 / 30)
    cells = bench.table([row])
    assert cells == [
        ("hf-gpt2", "0", "a", "a", "yes", "30.00", "30.00", "1.000"),
        ("hf-gpt2", "1", "b", "c", "no", "24.00", "20.00", "0.845"),
        ("hf-gpt2", "all", "-", "-", "1 of 2", "-", "-", "median 0.923, worst 0.845; worst pick / best 0.667"),
    ]
    assert all(len(c) == len(bench.COLUMNS) for c in cells)


def test_the_record_states_the_seeds_alike_and_the_ranges(bench: ModuleType, tmp_path: Path) -> None:
    rows = [bench.row(m, "per-gib", 2, PICKS, JUDGED) for m in ("hf-gpt2", "hf-llama")]
    assert bench.summary(rows) == (
        "alike in 2 of 4 seeds; worse / better per seed 0.85-1.00; worst pick / best per model 0.67-0.67"
    )
    info = {"cpu": "CPU X", "cores": 2, "threads": 2, "capability": "AVX512", "date": "2026-11-29"}
    bench.write_record(tmp_path / "rep.json", info, 2, 12, rows, "python benchmarks/repeatability.py")
    record = json.loads((tmp_path / "rep.json").read_text())
    assert record["title"] == "Run to run: the same study twice, objective per-gib"
    assert record["claim"].startswith("The same 12-trial study (same space, budget")
    assert "sampler seeds 0-1) run twice per seed" in record["claim"]
    assert record["claim"].endswith("worst pick / best per model 0.67-0.67 here.")
    assert record["columns"] == list(bench.COLUMNS) and len(record["rows"]) == 6
    assert bench.summary([]) == "no row"


def test_two_runs_picks_compare_by_their_median_values_judged_in_one_loop(bench: ModuleType) -> None:
    before = {"picks": {"run 1 0": PICKS["run 1 1"], "run 2 0": PICKS["run 2 1"], "run 1 1": PICKS["run 1 0"]}}
    after = {"picks": {"run 1 0": PICKS["run 1 0"], "run 2 0": PICKS["run 2 0"]}}
    judged = {
        f"before {k}": JUDGED[v] for k, v in (("run 1 0", "run 1 1"), ("run 2 0", "run 2 1"), ("run 1 1", "run 1 0"))
    }
    judged |= {f"after {k}": JUDGED[k] for k in after["picks"]}
    # per GiB: before b 24, c 20, a 30 (median 24); after a 30, a 30 (median 30)
    result = bench.compare(before, after, judged, "per-gib")
    assert result == {"median": {"before": 24.0, "after": 30.0}, "after / before": 1.25}
    # samples/s: before 12, 40, 30 (median 30); after 30, 30
    assert bench.compare(before, after, judged, "throughput")["after / before"] == 1.0
