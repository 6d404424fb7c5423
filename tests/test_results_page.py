"""The results page (docs/benchmarks.md), its charts and README's results table are the rendering of
docs/results/*.json (benchmarks/results.py, benchmarks/render_results.py)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.paths import ROOT


@pytest.fixture(scope="module")
def results() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))  # the scripts import their shared writer by its name
    import results

    return results


@pytest.fixture(scope="module")
def render(results: ModuleType) -> ModuleType:
    import render_results

    return render_results


def test_the_page_and_its_charts_are_the_rendering_of_the_records(render: ModuleType, results: ModuleType) -> None:
    files = render.rendered(results.load_results())
    assert sorted(p.name for p in files) == [
        "README.md",
        "benchmarks.md",
        "results-adaptive-vs-study.svg",
        "results-outer-precision.svg",
    ]
    for path, text in files.items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)}: run python benchmarks/render_results.py"
    assert render.main(["--check"]) == 0


def test_each_record_is_written_as_the_writer_writes_it(results: ModuleType) -> None:
    for path in sorted(results.RESULTS_DIR.glob("*.json")):
        if path.name == "order.json":
            continue
        record = results.Result.from_dict(json.loads(path.read_text()))
        assert record.name == path.stem
        assert results.dumps(record) == path.read_text(), path.name


def test_write_result_writes_every_cell_as_text_and_reads_back(results: ModuleType, tmp_path: Path) -> None:
    chart = results.Chart(group="model", series="variant", value="per GiB", baseline="default", shown=("default", "x"))
    written = results.write_result(
        tmp_path / "a-claim.json",
        title="T",
        claim="C",
        machine="M",
        capability="CPU `AVX2`",
        date="2026-11-29",
        command="python benchmarks/x.py",
        columns=("model", "variant", "per GiB"),
        rows=[("m", "default", 100), ("m", "x", 250.5)],
        chart=chart,
        commit="0123abc",
    )
    text = (tmp_path / "a-claim.json").read_text()
    assert '  "rows": [\n    ["m", "default", "100"],\n    ["m", "x", "250.5"]\n  ],\n' in text
    assert results.Result.from_dict(json.loads(text)) == written
    assert written.rows == (("m", "default", "100"), ("m", "x", "250.5"))


def test_the_chart_is_each_value_over_its_groups_baseline(render: ModuleType, results: ModuleType) -> None:
    record = {r.name: r for r in results.load_results()}["adaptive-vs-study"]
    groups = dict(render.bars(record))
    assert [name for name, _, _ in groups["hf-gpt2"]] == ["default", "adaptive", "study-best"]
    assert [(figure, ratio) for _, ratio, figure in groups["hf-gpt2"]] == [
        ("773", 1.0),
        ("2898", 2898 / 773),
        ("4920", 4920 / 773),
    ]
    assert "2898 (3.75x)" in render.svg(record)


def _record(results: ModuleType, **changes: object) -> object:
    fields = dict(
        name="a-claim", title="T", claim="C", machine="M", capability="CPU", date="2026-11-29", commit="0123abc",
        command="c", columns=("model", "value"), rows=(("m", "1"),),
    )  # fmt: skip
    return results.Result(**{**fields, **changes})


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "A claim"}, "Result.name must be lower-case words joined by '-', but got 'A claim'."),
        ({"date": "29/11/2026"}, "Result.date must be YYYY-MM-DD, but got '29/11/2026'."),
        ({"commit": "HEAD"}, "Result.commit must be a hexadecimal commit hash, but got 'HEAD'."),
        ({"columns": ()}, "Result.columns must name at least one column, but got none."),
        ({"rows": (("m",),)}, "Result.rows[0] must have one cell per column (2), but got 1."),
    ],
)
def test_a_record_breaking_a_rule_says_which(results: ModuleType, changes: dict[str, object], message: str) -> None:
    with pytest.raises(results.ResultError, match=f"^{re.escape(message)}$"):
        _record(results, **changes)


def test_a_chart_names_columns_of_its_table_and_shows_its_baseline(results: ModuleType) -> None:
    chart = results.Chart(group="model", series="variant", value="value", baseline="default", shown=("default",))
    with pytest.raises(
        results.ResultError, match=re.escape("Result.chart must name columns of the table, but got 'variant'.")
    ):
        _record(results, chart=chart)
    chart = results.Chart(group="model", series="model", value="value", baseline="default", shown=("x",))
    with pytest.raises(
        results.ResultError, match=re.escape("Result.chart.shown must include its baseline, but got ['x'].")
    ):
        _record(results, chart=chart)


def test_every_record_is_listed_once_in_the_order(results: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(results.dumps(_record(results, name="a")))
    (tmp_path / "order.json").write_text("[]")
    with pytest.raises(results.ResultError, match=r"order.json must list every record once, but got \[\] for \['a'\]"):
        results.load_results(tmp_path)


def test_the_readme_results_table_is_the_adaptive_records_rendering(render: ModuleType, results: ModuleType) -> None:
    record = {r.name: r for r in results.load_results()}["adaptive-vs-study"]
    assert render.readme_table(record)[2:] == [
        "| hf-gpt2 (GPT-2, 6 layers) | 773 | 2898 | 4920 | 3.7x |",
        "| hf-vit (ViT, 6 layers) | 26763 | 37915 | 34210 | 1.42x |",
        "| lstm-lm (4 LSTM blocks) | 5725 | 18685 | 20366 | 3.3x |",
    ]
    readme = (ROOT / "README.md").read_text()
    table = "\n".join([render.README_BEGIN, *render.readme_table(record), render.README_END])
    assert table in readme  # the committed README holds the rendering (the page test checks it whole)
    assert record.command in readme  # the command README gives for its table is the record's
    stale = readme.replace("| 3.7x |", "| 3.8x |")
    assert render.readme(stale, [record]) == readme  # only the text between the markers is rendered


def _script(name: str) -> ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve the module of their annotations
    spec.loader.exec_module(module)
    return module


def test_setup_cost_writes_the_sizes_that_ran(results: ModuleType, tmp_path: Path) -> None:
    machine = {"date": "2026-11-29", "cpu": "x86_64", "capability": "AVX2", "cores": 2, "device": "cpu"}
    rows = [
        {"size": "10m", "ok": True, "seconds": 13.7, "peak_rss_bytes": 504_658_329, "parameters": 10_347_840},
        {"size": "100m", "ok": False, "error": "timed out after 1200 s", "parameters": 124_439_808},
    ]
    _script("setup_cost").write_record(tmp_path / "setup-cost.json", machine, rows, "python benchmarks/setup_cost.py")
    record = results.Result.from_dict(json.loads((tmp_path / "setup-cost.json").read_text()))
    assert record.rows == (("10m (6 x 320)", "10,347,840", "13.7", "0.47"),)
    assert (record.machine, record.capability) == ("x86_64, 2 cores; the study's device: CPU", "CPU `AVX2`")


def test_outer_precision_writes_its_first_table_with_the_recipe_charted(results: ModuleType, tmp_path: Path) -> None:
    machine = {"date": "2026-11-29", "capability": "AVX512", "threads": 2, "cores": 2}
    configs = [
        ("fp32 (PyTorch default)", 30.75, 532_466_483, 61.99),
        ("blocks bf16 recomputed, outer bf16", 17.23, None, None),
    ]
    rows = [{"config": c, "samples/s": s, "spread": 0.025, "peak_bytes": b, "per GiB": g} for c, s, b, g in configs]
    script = _script("outer_precision")
    script.write_record(tmp_path / "outer.json", machine, [{"model": "hf-gpt2", "rows": rows}], "python x.py")
    record = results.Result.from_dict(json.loads((tmp_path / "outer.json").read_text()))
    assert record.rows == (
        ("hf-gpt2", "fp32 (PyTorch default)", "30.75 (2.5%)", "507.8", "61.99"),
        ("hf-gpt2", "blocks bf16 recomputed, outer bf16", "17.23 (2.5%)", "-", "None"),
    )
    assert record.chart is not None and record.chart.baseline == "fp32 (PyTorch default)"


def _compile_check_rows() -> list[dict[str, object]]:
    """Fake figures in the shape ``benchmarks/compile_check.py``'s run returns."""

    def row(label: str, saved: int, peak: int | None, rate: float, compile_s: float | None) -> dict[str, object]:
        return {
            "configuration": label,
            "saved_bytes": saved,
            "allocated_peak_bytes": peak,
            "samples_per_s": rate,
            "spread": 0.0125,
            "compile_seconds": compile_s,
        }

    return [
        row("eager, no recompute", 37_748_736, 41_943_040, 40.0, None),
        row("compiled, budget 0.1", 5_242_880, None, 52.5, 31.25),
    ]


def test_compile_check_writes_its_table_and_record(results: ModuleType, tmp_path: Path) -> None:
    machine = {
        "date": "2026-11-29",
        "cpu": "x86_64",
        "capability": "AVX512",
        "cores": 2,
        "threads": 2,
        "model": "stream-lm",
        "tiny": False,
    }
    script = _script("compile_check")
    rows = _compile_check_rows()
    script.write(tmp_path / "out", machine, rows)
    assert json.loads((tmp_path / "out" / "compile_check.json").read_text()) == {"machine": machine, "rows": rows}
    table = (tmp_path / "out" / "compile_check.md").read_text().splitlines()
    assert table[0] == (
        "# activation_memory_budget against per-block recompute (2026-11-29, stream-lm, CPU capability AVX512, "
        "2 threads, built-in size)"
    )
    assert table[-2:] == [
        "| eager, no recompute | 36.00 | 40.00 | 40.00 (1.2%) | - |",
        "| compiled, budget 0.1 | 5.00 | - | 52.50 (1.2%) | 31.2 |",
    ]
    script.write_record(tmp_path / "compile-check.json", machine, rows, "python benchmarks/compile_check.py --out x")
    record = results.Result.from_dict(json.loads((tmp_path / "compile-check.json").read_text()))
    assert record.columns == (
        "configuration",
        "saved for backward, MiB",
        "step peak, MiB",
        "samples/s (spread)",
        "compile, s",
    )
    assert record.rows == (
        ("eager, no recompute", "36.00", "40.00", "40.00 (1.2%)", "-"),
        ("compiled, budget 0.1", "5.00", "-", "52.50 (1.2%)", "31.2"),
    )
    assert (record.machine, record.capability) == ("x86_64, 2 cores, 2 threads", "CPU `AVX512`")
    assert record.command == "python benchmarks/compile_check.py --out x"


def test_compile_check_refuses_rounds_below_one_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _script("compile_check").main(["--out", str(tmp_path / "out"), "--rounds", "0"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith("error: --rounds must be >= 1, but got 0")
    assert not (tmp_path / "out").exists()


# A machine as results.cpu_machine() takes it: the records' machine fields are built from it alone.
CPU_MACHINE = {
    "date": "2026-11-29",
    "cpu": "AMD EPYC 7B13",
    "cores": 2,
    "threads": 1,
    "torch": "2.13.0+cpu",
    "capability": "AVX512",
    "bf16_units": ["avx512_bf16"],
}


def test_the_machine_fields_name_the_cpu_threads_torch_and_bf16_units(results: ModuleType) -> None:
    assert results.machine_fields(CPU_MACHINE) == {
        "machine": "AMD EPYC 7B13, 2 cores, 1 torch thread; torch 2.13.0+cpu",
        "capability": "CPU `AVX512` (avx512_bf16)",
        "date": "2026-11-29",
    }
    avx2 = results.machine_fields(CPU_MACHINE | {"threads": 2, "capability": "AVX2", "bf16_units": []})
    assert (avx2["machine"], avx2["capability"]) == (
        "AMD EPYC 7B13, 2 cores, 2 torch threads; torch 2.13.0+cpu",
        "CPU `AVX2` (no bf16 units)",
    )


def test_the_command_names_the_environment_that_shapes_the_run(results: ModuleType) -> None:
    environ = {"OMP_NUM_THREADS": "1", "HOME": "/root", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert results.command_line("/x/benchmarks/overhead.py", ["--steps", "3"], environ) == (
        "OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/overhead.py --steps 3"
    )
    assert results.command_line("overhead.py", [], {}) == "python benchmarks/overhead.py"


def _written(results: ModuleType, path: Path) -> Any:
    return results.Result.from_dict(json.loads(path.read_text()))


def test_overhead_writes_each_variant_over_the_plain_step(results: ModuleType, tmp_path: Path) -> None:
    rows = [
        {"workload": "mlp-digits", "config": "micro 32, accum 1", "plain_ms": 6.94, "noise": 1.0604, "memory": 10.97},
        {"workload": "gpt-tiny", "config": "micro 8, accum 4", "plain_ms": 611.87, "noise": 0.9112, "memory": 4.41},
    ]
    path = tmp_path / "instrumentation-overhead.json"
    _script("overhead").write_record(path, CPU_MACHINE, rows, "python benchmarks/overhead.py --steps 40")
    record = _written(results, path)
    stored = {r.name: r for r in results.load_results()}["instrumentation-overhead"]
    assert (record.name, record.title, record.claim, record.columns, record.chart) == (
        stored.name,
        stored.title,
        stored.claim,
        stored.columns,
        stored.chart,
    )
    assert record.rows == (
        ("mlp-digits", "micro 32, accum 1", "6.9 ms", "1.060x", "11.0x"),
        ("gpt-tiny", "micro 8, accum 4", "611.9 ms", "0.911x", "4.4x"),
    )
    assert (record.machine, record.capability, record.date, record.command) == (
        "AMD EPYC 7B13, 2 cores, 1 torch thread; torch 2.13.0+cpu",
        "CPU `AVX512` (avx512_bf16)",
        "2026-11-29",
        "python benchmarks/overhead.py --steps 40",
    )


def test_prediction_error_writes_the_errors_as_percentages_and_names_its_grid(
    results: ModuleType, tmp_path: Path
) -> None:
    rows = [
        {"workload": "hf-gpt2", "configs": 24, "median": 0.0004, "p90": 0.0019, "max": 0.00264, "verified": "yes"},
        {"workload": "hf-llama", "configs": 24, "median": 0.0157, "p90": 0.0362, "max": 0.0492, "verified": "yes"},
        {"workload": "hf-t5", "configs": 0, "verified": "no: the fake pass failed"},
    ]
    script = _script("prediction_error")
    path = tmp_path / "memory-model-corpus.json"
    script.write_record(
        path, CPU_MACHINE, rows, "python benchmarks/prediction_error.py --bf16", micro=[2, 8], bf16=True
    )
    record = _written(results, path)
    stored = {r.name: r for r in results.load_results()}["memory-model-corpus"]
    assert (record.title, record.claim, record.columns) == (stored.title, stored.claim, stored.columns)
    assert record.rows == (
        ("hf-gpt2", "0.04%", "0.19%", "0.26%", "yes"),
        ("hf-llama", "1.57%", "3.62%", "4.92%", "yes"),
        ("hf-t5", "-", "-", "-", "no: the fake pass failed"),
    )
    assert record.note.startswith("hf-llama's predictions sit over its measured peak")
    assert script.markdown_row(rows[0]) == "| hf-gpt2 | 24 | 0.04% | 0.19% | 0.26% | yes |"
    script.write_record(path, CPU_MACHINE, rows[2:], "python x.py", micro=[2], bf16=False)
    other = _written(results, path)
    assert other.title == "The memory model on the corpus models (CPU)"
    assert (
        "6 configurations each (micro-batch 2 x no, alternate or every block checkpointed x accumulation 1 and 2, fp32)"
        in other.claim
    )
    assert not other.note.startswith("hf-llama")


def test_adaptive_writes_the_settled_figures_of_its_three_runs(results: ModuleType, tmp_path: Path) -> None:
    from autotune import TrainConfig

    def run(thr: float, steps: int, peak: int, config: TrainConfig) -> dict[str, object]:
        return {
            "settled_thr": thr,
            "settled_steps": steps,
            "settled_peak": peak,
            "settled_gib": thr / (peak / 2**30),
            "settled": config,
        }

    default = TrainConfig(micro_batch_size=32)
    bf16 = TrainConfig(micro_batch_size=4, grad_accum_steps=8, precision="bf16", checkpoint=(True, True, True, False))
    runs = {
        "default": run(165.84, 79, 171_000_000, default),
        "adaptive": run(174.2, 41, 18_412_000, bf16),
        "study-best": run(207.25, 79, 23_080_000, bf16),
    }
    script = _script("adaptive")
    seen = script.policy_seen(["hf-gpt2", "hf-vit", "lstm-lm"], "small", ["hf-gpt2:tiny", "lstm-lm:tiny", "gpt-tiny"])
    assert seen == {"hf-gpt2": "another size", "hf-vit": "held out", "lstm-lm": "another size"}
    path = tmp_path / "adaptive-vs-study.json"
    command = "OMP_NUM_THREADS=1 python benchmarks/adaptive.py --size small"
    results_by_model = {"hf-gpt2": runs, "hf-vit": runs, "lstm-lm": runs}
    batches = {"hf-gpt2": 32, "hf-vit": 32, "lstm-lm": 32}
    script.write_record(path, CPU_MACHINE, results_by_model, command, batches=batches, study_trials=24, seen=seen)
    record = _written(results, path)
    stored = {r.name: r for r in results.load_results()}["adaptive-vs-study"]
    assert (record.title, record.claim, record.columns, record.chart) == (
        stored.title,
        stored.claim,
        stored.columns,
        stored.chart,
    )
    assert record.rows[:3] == (
        ("hf-gpt2", "default", "165.8 (79)", "163.08", "1041", "32x1x1, fp32, ckpt none, ZeRO 0"),
        ("hf-gpt2", "adaptive", "174.2 (41)", "17.56", "10159", "4x8x1, bf16, ckpt 3/4, ZeRO 0"),
        ("hf-gpt2", "study-best", "207.2 (79)", "22.01", "9642", "4x8x1, bf16, ckpt 3/4, ZeRO 0"),
    )
    assert len(record.rows) == 9 and record.command == command


def test_transfer_writes_each_model_and_the_median_and_min(results: ModuleType, tmp_path: Path) -> None:
    def row(model: str, policy: float, optuna: float, *, batch: int = 16, over: int = 0) -> dict[str, object]:
        return {
            "model": model,
            "batch": batch,
            "policy_over_optimum": policy,
            "optuna_over_optimum": optuna,
            "policy_steps_over_budget": over,
            "batch_held": batch == 16,
        }

    rows = [
        row("hf-llama", 1.0, 0.434),
        row("random:3", 0.8612, 0.6249, over=1),
        row("random:7", 0.94, 0.57, batch=128),
    ]
    script = _script("transfer")
    path = tmp_path / "policy-held-out.json"
    command = "OMP_NUM_THREADS=1 python benchmarks/transfer.py --fine-tune-seconds 20"
    script.write_record(path, CPU_MACHINE, rows, command, fine_tune_seconds=20.0, dominance_margin=None)
    record = _written(results, path)
    stored = {r.name: r for r in results.load_results()}["policy-held-out"]
    assert (record.title, record.claim, record.columns, record.chart) == (
        stored.title,
        stored.claim,
        stored.columns,
        stored.chart,
    )
    # The hand transcription's note said whose commit it named; the rest the script writes.
    assert record.note == stored.note.removeprefix("The commit is the one that recorded these figures. ")
    assert record.rows == (
        ("hf-llama", "1.00", "0.43", "0", "yes"),
        ("random:3", "0.86", "0.62", "1", "yes"),
        ("random:7 (batch 128)", "0.94", "0.57", "0", "no"),
        ("**median / min**", "**0.94 / 0.86**", "**0.57 / 0.43**", "", ""),
    )
    script.write_record(path, CPU_MACHINE, rows, command, fine_tune_seconds=20.0, dominance_margin=2.0)
    assert "a grid (configurations under 1/2 of the best so far left as dominated)" in _written(results, path).claim
