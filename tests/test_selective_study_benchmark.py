"""benchmarks/selective_study.py's record rows from scripted picks and re-timings (no wall clock);
the run itself is the lead's to do (``python benchmarks/selective_study.py``)."""

from __future__ import annotations

import importlib.util
import sys
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


PICKS = {
    "without": {"describe": "full", "peak_bytes": 512 * MIB},
    "with": {"describe": "selective", "peak_bytes": 768 * MIB},
}
JUDGED = {"without": {"samples/s": 10.0, "spread": 0.01}, "with": {"samples/s": 20.0, "spread": 0.02}}


@pytest.mark.parametrize(("objective", "ratio"), [("throughput", 2.0), ("per-gib", 20.0 / 0.75 / 20.0)])
def test_a_row_values_both_picks_and_their_ratio_by_the_objective(
    study: ModuleType, objective: str, ratio: float
) -> None:
    row = study.row("hf-gpt2", objective, PICKS, JUDGED)
    assert row["with"] == {"pick": "selective", "samples/s": 20.0, "peak MiB": 768.0, "per GiB": 20.0 / 0.75}
    assert row["without"] == {"pick": "full", "samples/s": 10.0, "peak MiB": 512.0, "per GiB": 20.0}
    assert row["ratio"] == pytest.approx(ratio)
    assert study.table([row]) == [
        (
            "hf-gpt2",
            objective,
            "full",
            "selective",
            "10.00",
            "20.00",
            "512.0",
            "768.0",
            "20.00",
            "26.67",
            f"{ratio:.3f}",
        )
    ]
    assert len(study.COLUMNS) == len(study.table([row])[0])
