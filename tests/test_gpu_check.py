"""benchmarks/gpu_check.py cannot rot: its dry run (plan, imports, report writer) runs in CI, and
one part's child process runs dry; mypy checks its calls into the library (``make typecheck``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from tests.paths import ROOT

NAMES = ["device", "realsize", "measure", "adapt", "deepspeed", "hf"]


@pytest.fixture(scope="module")
def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve the module of their annotations
    spec.loader.exec_module(module)
    return module


def test_the_plan_fits_in_a_ten_minute_call(gpu_check: ModuleType) -> None:
    assert [p.name for p in gpu_check.PLAN] == NAMES
    # Each part is killed at its own limit; 30 s are left of 600 for installing and copying back.
    # The limits are the H200 runs' seconds (docs/benchmark-log.md) with room: device 17-18 s,
    # measure 70-87 s, adapt 70-99 s, DeepSpeed 49-53 s, HF 31-32 s; the real-size part gets the rest.
    assert [p.limit_s for p in gpu_check.PLAN] == [25, 240, 95, 110, 60, 40]
    assert sum(p.limit_s for p in gpu_check.PLAN) == 570


def test_some_parts_run_alone_and_an_unknown_one_is_refused(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--parts", "measure,hf"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert [p["name"] for p in report["parts"]] == ["measure", "hf"]
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path), "--dry-run", "--parts", "measure,gpu"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("error: unknown part 'gpu' (parts: device, realsize, measure, adapt, deepspeed, hf)")
    )


def test_the_dry_run_writes_both_reports(gpu_check: ModuleType, tmp_path: Path) -> None:
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run"]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["machine"]["device"] == "dry run" and report["machine"]["dry_run"] is True
    assert [p["name"] for p in report["parts"]] == NAMES
    for part in report["parts"]:
        assert (part["ok"], part["error"]) == (True, None)
        assert part["result"]["summary"] == f"dry run of {part['name']}"
        # An optional package that is not installed is named; everything autotune's own imports.
        assert set(part["result"]["missing"]) <= {"deepspeed", "transformers"}
    lines = (tmp_path / "report.md").read_text().splitlines()
    assert lines[:4] == [
        "# autotune GPU check: dry run",
        "",
        "| part | status | seconds (limit) | result |",
        "|---|---|---|---|",
    ]
    assert lines[4].startswith("| device and machine probe | ok | ")


def test_a_failing_part_is_reported_with_its_exception_and_the_report_still_written(
    gpu_check: ModuleType, tmp_path: Path
) -> None:
    def boom(out: Path) -> dict[str, object]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    part = gpu_check.PLAN[2]
    entry = gpu_check.guarded(part, tmp_path, boom)
    assert (entry["name"], entry["ok"], entry["result"]) == ("measure", False, None)
    assert entry["error"].startswith(
        "RuntimeError: CUDA error: an illegal memory access was encountered (at test_gpu_check.py:"
    )
    fine = gpu_check.guarded(gpu_check.PLAN[0], tmp_path, lambda out: {"summary": "H100", "rows": []})
    gpu_check.write_report(tmp_path, {"device": "H100"}, [fine, entry])
    table = (tmp_path / "report.md").read_text().splitlines()
    assert table[5].startswith("| measure vs the memory model | FAILED | ")
    assert table[5].endswith(
        " (95) | RuntimeError: CUDA error: an illegal memory access was encountered "
        f"(at test_gpu_check.py:{entry['error'].rsplit(':', 1)[1]} |"
    )


def test_one_part_runs_dry_in_its_own_process(gpu_check: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "parts").mkdir()
    entry = gpu_check.run_part(gpu_check.PLAN[0], tmp_path, dry_run=True)
    assert (entry["name"], entry["ok"], entry["result"]["summary"]) == ("device", True, "dry run of device")
    assert (tmp_path / "parts" / "device.log").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_says_so_in_one_line(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_check.main(["--out", str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out == "gpu_check: no CUDA device on this machine: nothing to check.\n"
    assert not (tmp_path / "out").exists()


def test_the_real_size_judge_runs_every_recipe_and_a_pick_through_its_snippet_on_the_cpu(
    gpu_check: ModuleType,
) -> None:
    """The check's own loop, at the corpus' tiny GPT-2 on the CPU: the Hugging Face recipes as a
    user sets them and an autotune pick applied by its exported snippet all train (the GPU run
    adds the allocator's peaks, which the CPU has not)."""
    from autotune import TrainConfig
    from autotune.zoo import CORPUS

    entry = CORPUS["hf-gpt2"]
    pick = TrainConfig(micro_batch_size=4, grad_accum_steps=2, precision="bf16", checkpoint=(True, False))
    recipes = [*gpu_check.hf_recipes(8), gpu_check.pick_recipe("study pick (per-gib)", pick)]
    rows = gpu_check.judge(lambda: entry.build(**entry.tiny), recipes, device="cpu", steps=2, warmup=1)
    assert [(r["recipe"], r["split"], r["config"], r["peak"]) for r in rows] == [
        ("pytorch-default", "8x1", None, None),
        ("hf bf16", "8x1", None, None),
        ("hf bf16+gc", "8x1", None, None),
        ("hf bf16 4x2", "4x2", None, None),
        ("hf bf16 2x4", "2x4", None, None),
        ("study pick (per-gib)", "4x2", pick.describe(), None),
    ]
    assert all(r["samples/s"] > 0 for r in rows)


def test_the_real_size_predictions_are_verified_where_they_were_checked(gpu_check: ModuleType) -> None:
    """Each judged recipe as a TrainConfig (HF's bf16 is the whole model, its checkpointing every
    block), predicted from one profile checked on the device the check runs on."""
    from autotune import TrainConfig
    from autotune.zoo import CORPUS

    entry = CORPUS["hf-gpt2"]
    recipes = gpu_check.hf_recipes(8)
    gc = recipes[2].as_config()
    assert gc == TrainConfig(micro_batch_size=8, precision="bf16", outer_precision="bf16", checkpoint=True)
    predicted = gpu_check.predicted_peaks(lambda: entry.build(**entry.tiny), recipes, device="cpu")
    assert list(predicted) == [r.name for r in recipes]
    assert all(p["verified"] and p["predicted"] > 0 for p in predicted.values())
