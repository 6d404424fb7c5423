"""benchmarks/selective_study.py's record rows from scripted picks and re-timings of two seeds (no
wall clock); the run itself is the lead's to do (``python benchmarks/selective_study.py``)."""

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
def study() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports picks.py beside it, as when run as a script
    spec = importlib.util.spec_from_file_location("selective_study", ROOT / "benchmarks" / "selective_study.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Seed 0: the level's pick is faster and larger; seed 1: both sides pick the same configuration.
PICKS = {
    "without 0": {"describe": "full", "peak_bytes": 512 * MIB},
    "with 0": {"describe": "selective", "peak_bytes": 768 * MIB},
    "without 1": {"describe": "none", "peak_bytes": 1024 * MIB},
    "with 1": {"describe": "none", "peak_bytes": 1024 * MIB},
}
JUDGED = {
    "without 0": {"samples/s": 10.0, "spread": 0.01, "per round": [10.0, 10.0]},
    "with 0": {"samples/s": 20.0, "spread": 0.02, "per round": [20.0, 20.0]},
    "without 1": {"samples/s": 30.0, "spread": 0.01, "per round": [30.0, 30.0]},
    "with 1": {"samples/s": 30.0, "spread": 0.01, "per round": [30.0, 30.0]},
    "rounds": 6,
    "decided": True,
    "distinct": 3,
}


def test_a_throughput_row_takes_the_median_of_each_sides_seeds_and_their_ratio(study: ModuleType) -> None:
    row = study.row("hf-gpt2", "throughput", 2, PICKS, JUDGED)
    assert row["seeds"] == [
        {
            "seed": 0,
            "without": {"pick": "full", "samples/s": 10.0, "peak MiB": 512.0, "per GiB": 20.0},
            "with": {"pick": "selective", "samples/s": 20.0, "peak MiB": 768.0, "per GiB": 20.0 / 0.75},
            "ratio": 2.0,
        },
        {
            "seed": 1,
            "without": {"pick": "none", "samples/s": 30.0, "peak MiB": 1024.0, "per GiB": 30.0},
            "with": {"pick": "none", "samples/s": 30.0, "peak MiB": 1024.0, "per GiB": 30.0},
            "ratio": 1.0,
        },
    ]
    # median of (10, 30) = 20 without, of (20, 30) = 25 with
    assert row["median"] == {"without": 20.0, "with": 25.0}
    assert row["ratio"] == 1.25
    assert (row["worst"], row["best"]) == (1.0, 2.0)
    head = ("hf-gpt2", "throughput")
    assert study.table([row]) == [
        (*head, "0", "full", "selective", "10.00", "20.00", "512.0", "768.0", "20.00", "26.67", "2.000", "-"),
        (*head, "1", "none", "none", "30.00", "30.00", "1024.0", "1024.0", "30.00", "30.00", "1.000", "-"),
        (*head, "median", "-", "-", "20.00", "25.00", "-", "-", "-", "-", "1.250", "1.000-2.000"),
    ]
    assert all(len(cells) == len(study.COLUMNS) for cells in study.table([row]))


def test_a_per_gib_row_values_each_pick_per_gib_of_its_own_peak(study: ModuleType) -> None:
    row = study.row("hf-gpt2", "per-gib", 2, PICKS, JUDGED)
    assert [e["ratio"] for e in row["seeds"]] == [pytest.approx(4 / 3), 1.0]
    # median of (20, 30) = 25 without, of (26.67, 30) = 28.33 with
    assert row["median"] == {"without": 25.0, "with": pytest.approx((20.0 / 0.75 + 30.0) / 2)}
    assert row["ratio"] == pytest.approx((20.0 / 0.75 + 30.0) / 2 / 25.0)
    assert (row["worst"], row["best"]) == (1.0, pytest.approx(4 / 3))
    assert study.table([row])[-1] == (
        "hf-gpt2", "per-gib", "median", "-", "-", "-", "-", "-", "-", "25.00", "28.33", "1.133", "1.000-1.333"
    )  # fmt: skip


def test_a_seeds_ratio_is_taken_round_by_round_from_the_judge(study: ModuleType) -> None:
    # Medians 13 and 12 (1.083x), but round by round 1.3x, 1.0x, 0.833x: the machine drifted.
    judged = JUDGED | {
        "without 0": {"samples/s": 12.0, "spread": 0.1, "per round": [10.0, 20.0, 12.0]},
        "with 0": {"samples/s": 13.0, "spread": 0.1, "per round": [13.0, 20.0, 10.0]},
    }
    row = study.row("hf-gpt2", "throughput", 1, PICKS, judged)
    assert row["seeds"][0]["ratio"] == pytest.approx((1.3 * 1.0 * 10.0 / 12.0) ** (1 / 3))
    assert row["median"] == {"without": 12.0, "with": 13.0}  # the seeds' values stay the judge's medians


def test_the_claim_states_the_median_and_the_per_seed_ratio_ranges(study: ModuleType, tmp_path: Path) -> None:
    rows = [study.row("hf-gpt2", o, 2, PICKS, JUDGED) for o in ("per-gib", "throughput")]
    assert study.ratio_ranges(rows) == "median ratio 1.13-1.25 over 2 rows; per seed 1.00-2.00"
    assert study.ratio_ranges(rows[:1]) == "median ratio 1.13 over 1 row; per seed 1.00-1.33"
    info = {"cpu": "CPU X", "cores": 2, "threads": 2, "capability": "AVX2", "date": "2026-12-01"}
    study.write_record(tmp_path / "selective-study.json", info, 2, rows, "python benchmarks/selective_study.py")
    record = json.loads((tmp_path / "selective-study.json").read_text())
    assert record["claim"].endswith("seed s without: median ratio 1.13-1.25 over 2 rows; per seed 1.00-2.00 here.")
    assert "sampler seeds 0-1" in record["claim"]
    assert record["columns"] == list(study.COLUMNS)
    assert len(record["rows"]) == 6
    study.write_record(tmp_path / "one-seed.json", info, 1, rows, "python benchmarks/selective_study.py")
    assert "with the sampler seed 0; " in json.loads((tmp_path / "one-seed.json").read_text())["claim"]
    assert "level (sampled in every trial) and without it" in record["claim"]
    refine = info | {"with_level": "refine"}
    study.write_record(tmp_path / "refine.json", refine, 2, rows, "python benchmarks/selective_study.py")
    refined = json.loads((tmp_path / "refine.json").read_text())
    words = "level (reached only by the refinement's enqueued neighbours, never sampled) and without it"
    assert words in refined["claim"]
    assert refined["title"] == "The study's pick with and without selective recompute, the level by refinement only"
    assert record["title"] == "The study's pick with and without selective recompute"
    study.write_record(tmp_path / "one.json", info, 2, rows[1:], "python benchmarks/selective_study.py")
    one = json.loads((tmp_path / "one.json").read_text())
    assert one["title"] == "The study's pick with and without selective recompute, objective throughput"


def test_the_judge_retimes_the_distinct_knobs_of_every_seed_and_side_in_one_loop(
    study: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.config import TrainConfig
    from autotune.measurement import sidebyside

    loops: list[list[TrainConfig]] = []

    def retime_configs(workload: object, configs: list[TrainConfig], **_: int) -> sidebyside.Retimed:
        loops.append(list(configs))
        timings = tuple(sidebyside.Timing(rates=(10.0 * (i + 1),) * 12) for i in range(len(configs)))
        return sidebyside.Retimed(
            timings=timings, ranking=(1, 0), decided=True, rounds=6, warmup=(1, 1), other_cores=None
        )

    monkeypatch.setattr(sidebyside, "retime_configs", retime_configs)
    # The study's seed is its picks' data-order seed too: seed 1's micro-batch 2 is seed 0's.
    picks = {
        key: {"config": TrainConfig(micro_batch_size=m, seed=s).to_dict()}
        for key, m, s in (("without 0", 2, 0), ("with 0", 4, 0), ("without 1", 2, 1), ("with 1", 2, 1))
    }
    judged = study.judge(object(), picks)
    assert loops == [[TrainConfig(micro_batch_size=2), TrainConfig(micro_batch_size=4)]]
    assert judged == {
        "without 0": {"samples/s": 10.0, "spread": 0.0, "per round": [10.0] * 6},
        "with 0": {"samples/s": 20.0, "spread": 0.0, "per round": [20.0] * 6},
        "without 1": {"samples/s": 10.0, "spread": 0.0, "per round": [10.0] * 6},
        "with 1": {"samples/s": 10.0, "spread": 0.0, "per round": [10.0] * 6},
        "rounds": 6,
        "decided": True,
        "distinct": 2,
    }


def test_seeds_below_one_are_refused_in_one_line(
    study: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        study.main(["--out", str(tmp_path / "out"), "--seeds", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --seeds must be at least 1, but got 0")
    assert not (tmp_path / "out").exists()
