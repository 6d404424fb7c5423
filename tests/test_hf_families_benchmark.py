"""benchmarks/hf_families.py: its record's speech recognizer row run for real (CTC and LayerDrop,
which could not be profiled before), and a failure said in a cell."""

from __future__ import annotations

import json

import pytest

from tests.paths import ROOT, benchmark_module

pytest.importorskip("transformers")


def test_the_record_s_hubert_row_is_what_the_script_gives() -> None:
    bench = benchmark_module("hf_families")
    family = "HuBERT (CTC, LayerDrop)"
    record = json.loads((ROOT / "docs" / "results" / "hf-families.json").read_text())
    (row,) = [r for r in record["rows"] if r[0] == family]
    wl = bench.FAMILIES[family]()
    cell = benchmark_module("peft_adapters").cell
    assert [cell(wl, knobs) for knobs in bench._CONFIGS.values()] == row[2:]


def test_a_configuration_that_fails_is_a_cell_saying_why() -> None:
    bench = benchmark_module("hf_families")
    wl = bench.FAMILIES["Mamba"]()
    cell = benchmark_module("peft_adapters").cell
    assert cell(wl, {"precision": "fp16", "outer_precision": "bf16"}).startswith("fails: ConfigError: ")
