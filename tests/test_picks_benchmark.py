"""benchmarks/picks.py's planning, ratio and verdict logic on scripted re-timings (no wall clock);
the run itself needs a quiet machine and is the lead's to do (``python benchmarks/picks.py``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from autotune.config import TrainConfig
from autotune.measurement.sidebyside import Retimed, Timing
from tests.paths import ROOT

GIB = 1024**3


@pytest.fixture(scope="module")
def picks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("picks", ROOT / "benchmarks" / "picks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["picks"] = module  # dataclasses resolve the module of their annotations
    spec.loader.exec_module(module)
    return module


def test_the_plan_is_five_models_at_their_built_in_sizes_or_a_quick_one(picks: ModuleType) -> None:
    from autotune.zoo import CORPUS

    full = picks.plan(None, quick=False)
    assert full.models == ("lstm-lm", "shared-encoder", "unet-tiny", "hf-gpt2", "hf-bert")
    assert all(full.sizes[m] == dict(CORPUS[m].sizes) for m in full.models)
    assert (full.study_trials, full.tune_steps, full.fine_tune_seconds) == (12, 8, 30.0)
    quick = picks.plan(None, quick=True)
    assert quick.models == ("hf-gpt2", "lstm-lm") and quick.sizes["lstm-lm"] == dict(CORPUS["lstm-lm"].tiny)
    assert picks.plan(["hf-t5"], quick=True).models == ("hf-t5",)
    with pytest.raises(SystemExit) as refused:
        picks.plan(["gpt5"], quick=False)
    assert str(refused.value) == f"picks: --models must be corpus models ({', '.join(CORPUS)}), but got 'gpt5'"
    assert picks.grid_counts(6, coarse=False) == (0, 1, 2, 3, 4, 5, 6)
    assert picks.grid_counts(6, coarse=True) == (0, 6)
    assert picks.grid_micro((1, 2, 4, 8, 16), coarse=False) == (1, 2, 4, 8, 16)
    assert picks.grid_micro((1, 2, 4, 8, 16), coarse=True) == (1, 16)
    assert (full.coarse_grid, quick.coarse_grid) == (False, True)
    coarse = picks.plan(["hf-gpt2"], quick=False, coarse_grid=True)
    assert coarse.coarse_grid and coarse.sizes["hf-gpt2"] == dict(CORPUS["hf-gpt2"].sizes)
    assert (coarse.study_trials, coarse.tune_steps) == (12, 8)  # the real run's searches, a smaller reference


def test_the_conditions_run_in_their_order_and_an_unknown_one_is_refused(picks: ModuleType) -> None:
    assert picks.plan(None, quick=True).conditions == ("quiet", "loaded")
    assert picks.plan(None, quick=True, conditions=["loaded", "quiet"]).conditions == ("quiet", "loaded")
    assert picks.plan(None, quick=True, conditions=["loaded"]).conditions == ("loaded",)
    with pytest.raises(SystemExit) as refused:
        picks.plan(None, quick=True, conditions=["busy"])
    assert str(refused.value) == "picks: --conditions must be quiet, loaded or both, but got 'busy'"


def _retimed(*rates: float, ranking: tuple[int, ...]) -> Retimed:
    return Retimed(
        timings=tuple(Timing(rates=(r, r, r)) for r in rates),
        ranking=ranking,
        decided=True,
        rounds=3,
        warmup=(2,) * len(rates),
        other_cores=None,
    )


def test_ratios_are_per_gib_against_the_grid_best_from_one_re_timing(picks: ModuleType) -> None:
    a, b = TrainConfig(micro_batch_size=8), TrainConfig(micro_batch_size=4, grad_accum_steps=2)
    configs, index = picks.distinct({"grid": a, "study": a, "tune": b})
    assert configs == [a, b] and index == {"grid": 0, "study": 0, "tune": 1}  # the study picked the grid's best
    # tune's pick: faster (120 vs 100 samples/s) but at twice the peak: 0.6 of the grid best per GiB
    scales = [GIB / GIB, GIB / (2 * GIB)]
    r = picks.ratios(_retimed(100.0, 120.0, ranking=(0, 1)), index, scales)
    assert r == {"study": 1.0, "tune": 0.6}


def test_the_verdict_takes_medians_and_minimums_per_condition(picks: ModuleType) -> None:
    rows = [
        {"condition": "quiet", "ratios": {"study": s, "tune": t}}
        for s, t in ((1.0, 0.95), (0.97, 0.9), (0.92, 0.8), (1.0, 1.0), (0.96, 0.91))
    ] + [{"condition": "loaded", "ratios": {"study": 0.74, "tune": 0.55}}]
    v = picks.verdict(rows)
    assert v["quiet"] == {
        "models": 5,
        "study_median": 0.97,
        "study_min": 0.92,
        "tune_median": 0.91,
        "targets_met": {"study_median": True, "study_min": True, "tune_median": True},
    }
    assert v["loaded"]["targets_met"] == {"study_median": False, "study_min": False, "tune_median": False}


def _one_row_result(picks: ModuleType) -> dict[str, object]:
    pick = {"describe": "micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0"}
    row = {
        "model": "hf-gpt2",
        "condition": "quiet",
        "grid": pick,
        "study": pick,
        "tune": pick,
        "retimed": {"decided": False},
        "ratios": {"study": 1.0, "tune": 0.876},
    }
    return {
        "date": "2026-11-26T15:00:00+00:00",
        "command": "python benchmarks/picks.py --quick",
        "machine": {"cpu": "Xeon", "capability": "AVX512", "cores": 2, "torch": "2.13.0", "threads": 1},
        "plan": {"study_trials": 12, "tune_steps": 8, "grid_levels": "every count"},
        "rows": [row],
        "verdict": picks.verdict([row]),
    }


def test_the_markdown_table_names_the_machine_and_each_ratio(picks: ModuleType) -> None:
    text = picks.markdown(_one_row_result(picks))
    assert "CPU Xeon (capability AVX512), 2 cores, torch 2.13.0, threads 1" in text
    cell = "micro x acc x ranks 8x2x1 \\| fp32 \\| ckpt none \\| ZeRO 0"
    assert f"| hf-gpt2 | quiet | {cell} | {cell} | {cell} | 1.00 | 0.88 | no |" in text
    assert text.splitlines()[-1] == (
        "- quiet: study median 1.00, min 1.00; tune median 0.88 over 1 models "
        "(study_median >= 0.95: met, study_min >= 0.90: met, tune_median >= 0.90: MISSED)"
    )


def test_the_results_record_is_the_runs_table(picks: ModuleType, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # where the script finds its shared writer
    picks.write_record(tmp_path / "picks-avx512.json", _one_row_result(picks))
    record = json.loads((tmp_path / "picks-avx512.json").read_text())
    pick = "micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0"
    assert record["rows"] == [["hf-gpt2", "quiet", pick, pick, pick, "1.00", "0.88", "no"]]
    assert record["columns"] == list(picks.COLUMNS)
    assert (record["date"], record["command"]) == ("2026-11-26", "python benchmarks/picks.py --quick")
    assert record["capability"] == "CPU `AVX512`"
    assert record["machine"] == "Xeon, 2 cores, 1 torch threads; torch 2.13.0"
    assert record["note"].startswith("quiet: study median 1.00, least 1.00, tune median 0.88. ")


def test_the_background_load_is_started_and_stopped(picks: ModuleType) -> None:
    with picks.one_core_loaded(False) as none:
        assert none is None
    with picks.one_core_loaded(True) as spinner:
        assert spinner.poll() is None  # spinning
    assert spinner.returncode is not None  # stopped with the block


def test_a_kept_grid_is_reused_only_for_the_same_model_sizes_grid_budget_and_cpu(
    picks: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = picks.plan(["lstm-lm"], quick=True)
    machine = {"capability": "AVX512", "threads": 2}
    key = picks.grid_key(p, "lstm-lm", 1000, **machine)
    assert picks.kept_grid(None, key) is None and picks.kept_grid(tmp_path, key) is None  # nothing kept
    grid = {"describe": "16x1x1 | bf16 | ckpt all | ZeRO 0", "seconds": 3.0}
    assert picks.grid_path(tmp_path, key) == tmp_path / "AVX512" / "lstm-lm.json"
    (tmp_path / "AVX512").mkdir()
    (tmp_path / "AVX512" / "lstm-lm.json").write_text(json.dumps({"key": key, "grid": grid}))
    assert picks.kept_grid(tmp_path, key) == grid
    other = picks.grid_key(p, "lstm-lm", 999, **machine)  # the budget measured differently: measure again
    assert picks.kept_grid(tmp_path, other) is None
    assert "is another grid" in capsys.readouterr().err
    # Another thread count is another grid; another CPU capability is another file (kept beside).
    assert picks.kept_grid(tmp_path, picks.grid_key(p, "lstm-lm", 1000, capability="AVX512", threads=1)) is None
    avx2 = picks.grid_key(p, "lstm-lm", 1000, capability="AVX2", threads=2)
    assert picks.kept_grid(tmp_path, avx2) is None
    assert picks.grid_path(tmp_path, avx2) == tmp_path / "AVX2" / "lstm-lm.json"
    # A BatchNorm model's grid is over its whole batch in each micro-batch: another grid too.
    assert picks.grid_key(p, "lstm-lm", 1000, min_micro_batch=1, **machine) == key
    assert picks.kept_grid(tmp_path, picks.grid_key(p, "lstm-lm", 1000, min_micro_batch=None, **machine)) is None
    # A grid over fp32 points only (a CPU without fast bf16) is kept in its own file.
    fp32 = picks.plan(["lstm-lm"], quick=True, grid_precisions=["fp32"])
    only = picks.grid_key(fp32, "lstm-lm", 1000, **machine)
    assert only == key | {"grid_precisions": ["fp32"]}
    assert picks.grid_path(tmp_path, only) == tmp_path / "AVX512" / "lstm-lm-fp32.json"
    assert picks.plan(["lstm-lm"], quick=True, grid_precisions=["bf16", "fp32"]) == p
    with pytest.raises(SystemExit) as refused:
        picks.plan(["lstm-lm"], quick=True, grid_precisions=["bf16"])
    assert str(refused.value) == "picks: --grid-precisions must be fp32 or fp32,bf16, but got 'bf16'"
    assert fp32.grid_levels == "the smallest micro-batch or the whole batch x fp32 x no or all recomputed"


def test_the_kept_grids_name_the_machine_that_measured_them() -> None:
    kept = sorted((ROOT / "benchmarks" / "grids").glob("*/*.json"))
    assert kept, "benchmarks/grids holds the five models' grids"
    for path in kept:
        key = json.loads(path.read_text())["key"]
        assert path.parent.name == key["capability"] and path.stem.startswith(key["model"])


def test_a_search_that_found_nothing_within_the_budget_scores_zero(
    picks: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.measurement import sidebyside

    a, b = TrainConfig(micro_batch_size=8), TrainConfig(micro_batch_size=4, grad_accum_steps=2)
    timed: list[list[TrainConfig]] = []

    def retime_configs(
        workload: object, configs: list[TrainConfig], *, scales: list[float], rounds: int, max_rounds: int
    ) -> Retimed:
        timed.append(configs)
        assert (rounds, max_rounds) == picks.JUDGE_ROUNDS == (6, 12)
        return _retimed(100.0, 150.0, ranking=(1, 0))

    monkeypatch.setattr(sidebyside, "retime_configs", retime_configs)
    found = {"config": None, "describe": "nothing within the budget", "peak_bytes": None}
    chosen = {
        "grid": {"config": a.to_dict(), "peak_bytes": GIB},
        "study": {"config": b.to_dict(), "peak_bytes": GIB},
        "tune": found,
    }
    record, r = picks._compare(object(), chosen)
    assert timed == [[a, b]]  # only the picks that exist are re-timed
    assert r == {"study": 1.5, "tune": 0.0} and record["index"] == {"grid": 0, "study": 1}
