"""benchmarks/gpu_check.py cannot rot: its dry run (plan, imports, report writer) runs in CI, and
one part's child process runs dry; mypy checks its calls into the library (``make typecheck``)."""

from __future__ import annotations

import dataclasses
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
    sys.path.insert(0, str(ROOT / "benchmarks"))  # it imports results.py beside it, as when run as a script
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve the module of their annotations
    spec.loader.exec_module(module)
    return module


def test_the_plan_fits_in_a_ten_minute_call(gpu_check: ModuleType) -> None:
    assert [p.name for p in gpu_check.PLAN] == NAMES
    # Each part is killed at its own limit; 30 s are left of 600 for installing and copying back.
    # The limits are the H200 runs' seconds (docs/benchmark-log.md) with room: device 17-20 s,
    # measure 70-87 s, adapt 70-99 s, DeepSpeed 49-53 s, HF 42.5 s; the real-size part gets the rest.
    assert [p.limit_s for p in gpu_check.PLAN] == [25, 225, 95, 110, 60, 55]
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
    def boom(out: Path, limit_s: int) -> dict[str, object]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    part = gpu_check.PLAN[2]
    entry = gpu_check.guarded(part, tmp_path, boom)
    assert (entry["name"], entry["ok"], entry["result"]) == ("measure", False, None)
    assert entry["error"].startswith(
        "RuntimeError: CUDA error: an illegal memory access was encountered (at test_gpu_check.py:"
    )
    fine = gpu_check.guarded(gpu_check.PLAN[0], tmp_path, lambda out, limit_s: {"summary": "H100", "rows": []})
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


def test_the_real_size_studies_share_what_a_longer_limit_leaves(gpu_check: ModuleType) -> None:
    assert gpu_check.study_seconds(gpu_check.REAL_LIMIT_S) == gpu_check.REAL_STUDY_S == 40.0
    assert gpu_check.study_seconds(480) == 40.0
    assert gpu_check.study_seconds(600) == 100.0


def test_a_part_runs_under_another_limit_and_a_wrong_one_is_refused_in_one_line(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = gpu_check.with_limits(gpu_check.PLAN, ["realsize=420", "hf=41"])
    assert [p.limit_s for p in plan] == [25, 420, 95, 110, 60, 41]
    # The child is told its limit: the real-size part's deadline for its compiled rows is that limit.
    (tmp_path / "parts").mkdir()
    entry = gpu_check.run_part(plan[1], tmp_path, dry_run=True)
    assert (entry["name"], entry["limit_s"], entry["ok"]) == ("realsize", 420, True)
    assert gpu_check.main(["--out", str(tmp_path), "--dry-run", "--parts", "hf", "--limit", "hf=41"]) == 0
    assert json.loads((tmp_path / "report.json").read_text())["parts"][0]["limit_s"] == 41
    for wrong in ("gpu=10", "hf=0", "hf=ten", "hf"):
        with pytest.raises(SystemExit) as exit_:
            gpu_check.main(["--out", str(tmp_path), "--dry-run", "--limit", wrong])
        assert exit_.value.code == 2
        assert (
            capsys.readouterr()
            .err.splitlines()[-1]
            .endswith(
                "error: --limit takes PART=SECONDS with a part of device, realsize, measure, adapt, deepspeed, hf, "
                f"got {wrong!r}"
            )
        )


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
    recipes = [*gpu_check.hf_recipes(8), gpu_check.pick_recipe(gpu_check.PICK_PER_GIB, pick)]
    rows = gpu_check.judge(lambda: entry.build(**entry.tiny), recipes, device="cpu", steps=2, warmup=1)
    assert [(r["recipe"], r["split"], r["config"], r["compiled"], r["peak"]) for r in rows] == [
        ("pytorch-default", "8x1", None, False, None),
        ("hf bf16", "8x1", None, False, None),
        ("hf bf16+gc", "8x1", None, False, None),
        ("hf bf16 4x2", "4x2", None, False, None),
        ("hf bf16 2x4", "2x4", None, False, None),
        ("study pick (per-gib, selective allowed)", "4x2", pick.describe(), False, None),
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


def test_the_real_size_compiled_rows_compile_the_model_once_each_as_hf_and_the_snippet_do(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HF's ``torch_compile=True`` and the pick compiled (its snippet's ``model.compile()``) each
    compile the model in place, default mode, after the checkpointing and the pick's wrappers; the
    compile is recorded here, not run (a real one costs the CPU a minute)."""
    from autotune import TrainConfig
    from autotune.zoo import CORPUS

    compiled: list[tuple[str, tuple[object, ...], dict[str, object], bool]] = []

    def fake_compile(self: torch.nn.Module, *args: object, **kwargs: object) -> None:
        wrapped = any(getattr(m, "gradient_checkpointing", False) for m in self.modules())
        compiled.append((type(self).__name__, args, kwargs, wrapped))

    monkeypatch.setattr(torch.nn.Module, "compile", fake_compile)
    entry = CORPUS["hf-gpt2"]
    pick = TrainConfig(micro_batch_size=4, grad_accum_steps=2, precision="bf16", checkpoint=("selective", False))
    recipes = [
        gpu_check.compiled_pick_recipe(gpu_check.pick_recipe(gpu_check.PICK_PER_GIB, pick)),
        gpu_check.hf_compiled_recipe(8),
    ]
    assert recipes[0].config == dataclasses.replace(pick, compile="default")
    assert recipes[1].as_config() == TrainConfig(
        micro_batch_size=8, precision="bf16", outer_precision="bf16", checkpoint=True, compile="default"
    )
    rows = gpu_check.judge(lambda: entry.build(**entry.tiny), recipes, device="cpu", steps=2, warmup=1)
    assert [(r["recipe"], r["split"], r["config"], r["compiled"]) for r in rows] == [
        ("study pick (per-gib, selective allowed) compiled", "4x2", recipes[0].config.describe(), True),
        ("hf bf16+gc+compile", "8x1", None, True),
    ]
    assert recipes[0].config.describe().endswith(" | compile default")
    # The pick's snippet compiles without HF's checkpointing flag; HF's recipe compiles after setting it.
    assert compiled == [("GPT2LMHeadModel", (), {}, False), ("GPT2LMHeadModel", (), {}, True)]


def test_a_compiled_row_without_the_time_left_or_that_fails_is_a_row_saying_so(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.zoo import CORPUS

    entry = CORPUS["hf-gpt2"]
    recipes = [gpu_check.hf_compiled_recipe(8)]

    def judge_in_time(now: float) -> list[dict[str, object]]:
        return gpu_check.judge_in_time(
            lambda: entry.build(**entry.tiny), recipes, device="cpu", deadline=100.0, row_s=75.0, clock=lambda: now
        )

    assert judge_in_time(60.0) == [{"recipe": "hf bf16+gc+compile", "status": "skipped: 40 s left, a row needs 75 s"}]

    def failing_compile(self: torch.nn.Module) -> None:
        raise RuntimeError("Dynamo failed to trace")

    monkeypatch.setattr(torch.nn.Module, "compile", failing_compile)
    assert judge_in_time(0.0) == [
        {"recipe": "hf bf16+gc+compile", "status": "error: RuntimeError: Dynamo failed to trace"}
    ]


def test_the_real_size_verdicts_set_each_pick_beside_its_hf_recipe(gpu_check: ModuleType) -> None:
    gib = 2**30

    def row(name: str, samples: float, peak_gib: float, *, config: str | None = None, compiled: bool = False) -> dict:
        peak = int(peak_gib * gib)
        return {
            "recipe": name,
            "config": config,
            "compiled": compiled,
            "samples/s": samples,
            "peak": peak,
            "per GiB": round(samples / peak_gib, 3),
        }

    rows = [
        row("pytorch-default", 40.0, 30.0),  # over the 20 GiB budget
        row("hf bf16", 60.0, 18.0),
        row("hf bf16+gc", 45.0, 9.0),
        row(gpu_check.PICK_PER_GIB, 50.0, 8.0, config="pick"),
        row(gpu_check.PICK_THROUGHPUT, 66.0, 19.0, config="pick"),
        row(f"{gpu_check.PICK_PER_GIB} compiled", 60.0, 8.0, config="pick", compiled=True),
        row("hf bf16+gc+compile", 75.0, 10.0, compiled=True),  # the fastest, but compiled: not an eager HF recipe
    ]
    verdicts = gpu_check.realsize_verdicts(rows, [])
    assert {k: v for k, v in verdicts.items() if k not in ("judged", "studies")} == {
        "per_gib_pick_vs_hf_gc": round(6.25 / 5.0, 3),
        "per_gib_pick_compiled_vs_hf_gc_compiled": round(7.5 / 7.5, 3),
        "fastest_hf_within_budget": "hf bf16",
        "throughput_pick_vs_fastest_hf": 1.1,
    }
    skipped = [*rows[:-1], {"recipe": "hf bf16+gc+compile", "status": "skipped: 30 s left, a row needs 75 s"}]
    assert gpu_check.realsize_verdicts(skipped, [])["per_gib_pick_compiled_vs_hf_gc_compiled"] is None
    # A peak the CPU stand-in does not know is not within the budget: no verdict on it.
    unknown = [{**r, "peak": None, "per GiB": None} for r in rows]
    assert gpu_check.realsize_verdicts(unknown, [])["fastest_hf_within_budget"] is None


def test_the_real_size_record_is_written_from_a_gpu_run_s_report(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import results

    gib = 2**30
    judged = [
        {"recipe": "hf bf16+gc", "config": None, "compiled": False, "split": "32x1", "samples/s": 125.62,
         "peak": 22719355392, "per GiB": 5.937, "predicted": 22717244504, "predicted/measured": 1.0},
        {"recipe": gpu_check.PICK_PER_GIB, "config": "16x2 bf16", "compiled": False, "split": "16x2",
         "samples/s": 120.84, "peak": 12 * gib, "per GiB": 10.07, "predicted/measured": 0.999},
        {"recipe": "hf bf16+gc+compile", "status": "skipped: 69 s left, a row needs 75 s", "predicted": 1},
    ]  # fmt: skip
    study = {"objective": "per-gib", "states": {"COMPLETE": 2, "PRUNED": 3}, "seconds_to_first_trial": 40.4}
    result = {
        "judged": judged,
        "studies": [{**study, "pick": "16x2 bf16"}],
        "per_gib_pick_vs_hf_gc": 1.727,
        "fastest_hf_within_budget": "hf bf16 8x4",
        "throughput_pick_vs_fastest_hf": 0.893,
    }
    machine = {"device": "NVIDIA H200", "capability": "9.0", "date": "2026-11-30", "torch": "2.11.0+cu130"}
    entry = {"name": "realsize", "ok": True, "limit_s": 300, "result": result}
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"machine": machine, "parts": [entry]}))
    out = tmp_path / "gpu-realsize.json"
    args = ["--out", str(tmp_path), "--from-report", str(report), "--realsize-result", str(out)]
    assert gpu_check.main([*args, "--commit", "ca6b83c"]) == 0
    record = results.Result.from_dict(json.loads(out.read_text()))
    assert (record.commit, record.date, record.machine) == (
        "ca6b83c",
        "2026-11-30",
        "One NVIDIA H200; torch 2.11.0+cu130",
    )
    assert (
        record.command == "python benchmarks/gpu_check.py --out build/gpu-check --parts realsize --limit realsize=300"
    )
    assert record.rows == (
        ("hf bf16+gc", "32x1", "125.6", "21.2", "5.94", "1.000"),
        (f"{gpu_check.PICK_PER_GIB}: 16x2 bf16", "16x2", "120.8", "12.0", "10.07", "0.999"),
    )
    assert "1.727x" in record.claim and "(hf bf16 8x4): 0.893x" in record.claim
    assert "per-gib: 2 measured, first at 40.4 s, pick 16x2 bf16" in record.note
    # A report whose real-size part failed writes nothing; --from-report needs the commit it measured.
    report.write_text(json.dumps({"machine": machine, "parts": [{**entry, "ok": False}]}))
    out.unlink()
    assert gpu_check.main([*args, "--commit", "ca6b83c"]) == 1
    assert not out.exists()
    assert capsys.readouterr().out.splitlines()[-1] == f"no record written to {out}: {report} holds no real-size result"
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(args)
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .endswith("error: --from-report writes --realsize-result, with the --commit its run measured")
    )


def _measured(model: str, config: object, predicted: int, tracked: int) -> dict[str, object]:
    """A row as the measure part writes it (the figures the record reads, the others left out)."""
    return {"model": model, "config": config, "status": "ok", "tracked": tracked, "predicted": predicted}


def test_the_record_is_the_memory_model_over_each_tracked_peak(gpu_check: ModuleType, tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports its shared writer by its name
    import results

    decoder = [c.describe() for c in gpu_check._configs(16)]
    lstm = [c.describe() for c in gpu_check._configs(32)]
    rows = [
        _measured("decoder_lm", decoder[0], 864, 1000),
        _measured("decoder_lm", decoder[1], 2**30, 2**30),
        _measured("decoder_lm", decoder[2], 1910, 2000),
        _measured("decoder_lm", decoder[3], 5000, 5000),
        _measured("lstm_lm", lstm[0], 14_764, 10_000),
        {"model": "lstm_lm", "config": lstm[1], "status": "error: CUDA out of memory"},
        _measured("lstm_lm", lstm[2], 3, 3),
    ]
    machine = {
        "device": "NVIDIA H200",
        "capability": "9.0",
        "date": "2026-11-27",
        "torch": "2.11.0+cu130",
        "transformers": "5.17.0",
        "deepspeed": "0.19.8",
    }
    path = tmp_path / "memory-model-gpu.json"
    gpu_check.write_memory_record(path, machine, rows, "python benchmarks/gpu_check.py --out /tmp/gc")
    record = results.Result.from_dict(json.loads(path.read_text()))
    stored = {r.name: r for r in results.load_results()}["memory-model-gpu"]
    assert (record.title, record.columns, record.chart) == (stored.title, stored.columns, stored.chart)
    assert record.rows == (
        ("decoder (hf-llama, 8 x 768)", "0.864", "1.000", "0.955", "1.000"),
        ("LSTM (lstm-lm)", "1.476", "-", "1.000", "-"),
    )
    assert record.claim == (
        "The memory model (profiled on the host, under fake tensors) over the tracked peak of the real CUDA step, "
        "micro-batch 16 (decoder), 64 (ViT, 64 px images, patch 4) and 32 (LSTM 4 x 1024, 256 tokens): 1.000 is "
        "exact, under 1 a prediction below the real step."
    )
    assert (record.machine, record.capability, record.date) == (
        "One NVIDIA H200; torch 2.11.0+cu130, transformers 5.17.0, deepspeed 0.19.8",
        "GPU: NVIDIA H200 (capability 9.0)",
        "2026-11-27",
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--parts", "device", "--result", "r.json"],
            "--result writes the measure part's record, but --parts is 'device'",
        ),
        (["--dry-run", "--result", "r.json"], "--result writes measured figures: it cannot go with --dry-run"),
    ],
)
def test_a_result_without_the_measure_part_is_refused_in_one_line(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path / "out"), *arguments])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")
    assert not (tmp_path / "out").exists()


def test_the_record_is_written_from_the_measure_part_after_the_run_and_not_when_it_failed(
    gpu_check: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import results

    rows = [_measured("decoder_lm", c.describe(), 3, 4) for c in gpu_check._configs(16)]
    machine = {"device": "NVIDIA H200", "capability": "9.0", "date": "2026-11-27", "torch": "2.11.0+cu130"}
    part = next(p for p in gpu_check.PLAN if p.name == "measure")
    outcome = {"ok": True}

    def run_part(part_: object, out: Path) -> dict[str, object]:  # the part as its child would report it
        if outcome["ok"]:
            return gpu_check._entry(part, seconds=1.0, result={"summary": "4/4", "rows": rows})
        return gpu_check._entry(part, seconds=1.0, error="timed out after 95 s")

    for name in results.RUN_ENVIRONMENT:  # the command names them where set
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_check, "run_part", run_part)
    monkeypatch.setattr(gpu_check, "_machine", lambda dry_run: machine)
    path = tmp_path / "memory-model-gpu.json"
    arguments = ["--out", str(tmp_path / "out"), "--parts", "measure", "--result", str(path)]
    assert gpu_check.main(arguments) == 0
    record = results.Result.from_dict(json.loads(path.read_text()))
    assert record.rows == (("decoder (hf-llama, 8 x 768)", "0.750", "0.750", "0.750", "0.750"),)
    assert record.command == "python benchmarks/gpu_check.py " + " ".join(arguments)
    path.unlink()
    outcome["ok"] = False
    capsys.readouterr()
    assert gpu_check.main(arguments) == 1
    assert capsys.readouterr().out.splitlines()[-1] == f"no record written to {path}: the measure part failed"
    assert not path.exists()
