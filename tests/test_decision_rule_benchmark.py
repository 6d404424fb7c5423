"""benchmarks/decision_rule.py: its windows decided on scripted rates (no wall clock), and one run
of the script on a test-size model writing its record."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import ROOT


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("decision_rule", ROOT / "benchmarks" / "decision_rule.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Eight rounds of two steps: the machine drifts 80 -> 130 and back, the same for both sides.
MACHINE = [v for v in (80.0, 130.0, 95.0, 120.0, 85.0, 125.0, 90.0, 110.0) for _ in range(2)]


def test_a_tie_on_a_drifting_machine_is_never_called(bench: ModuleType) -> None:
    for rule in bench.RULES:
        # 3 windows of six rounds, both ways round, each run to the sixth round undecided
        assert bench.evaluate((MACHINE, MACHINE), effect=1.0, rule=rule) == {
            "decided": 0.0,
            "wrong way": 0.0,
            "rounds": 6.0,
        }


def test_a_steady_difference_under_drift_is_called_round_by_round_not_by_two_medians(bench: ModuleType) -> None:
    assert bench.evaluate((MACHINE, MACHINE), effect=1.05, rule="paired") == {
        "decided": 1.0,
        "wrong way": 0.0,
        "rounds": 3.0,
    }
    assert bench.evaluate((MACHINE, MACHINE), effect=1.05, rule="unpaired") == {
        "decided": 0.0,
        "wrong way": 0.0,
        "rounds": 6.0,
    }
    # both ways round: the windows where the scaled side is the second are decided for it too
    called, for_a = bench.decide("paired", [1.05 * v for v in MACHINE], MACHINE, 3)
    assert (called, for_a) == (True, True)


def test_a_call_for_the_slower_side_counts_as_wrong(bench: ModuleType) -> None:
    # Not an A/A pair: b is steadily 10% ahead, more than the effect put into the first side.
    a, b = [100.0] * 12, [110.0] * 12
    for rule in bench.RULES:
        # One window of six rounds, both ways round: 103 against 110 is called for 110 (wrong),
        # 113.3 against 100 for 113.3 (right); each at the third round.
        assert bench.evaluate((a, b), effect=1.03, rule=rule) == {"decided": 1.0, "wrong way": 0.5, "rounds": 3.0}
    # at 1.00 every call is wrong
    assert bench.evaluate((a, b), effect=1.0, rule="paired") == {"decided": 1.0, "wrong way": 1.0, "rounds": 3.0}


def test_the_rules_and_rounds_are_checked(bench: ModuleType) -> None:
    with pytest.raises(ValueError, match=re.escape("decide: rule must be one of ('unpaired', 'paired'), but got 'x'.")):
        bench.decide("x", MACHINE, MACHINE, 3)
    with pytest.raises(ValueError, match=re.escape("evaluate: at least 6 rounds of rates are needed, but got 5.")):
        bench.evaluate((MACHINE[:10], MACHINE[:10]), effect=1.0, rule="paired")


def test_a_run_writes_its_table_and_record(bench: ModuleType, tmp_path: Path) -> None:
    out, record = tmp_path / "out", tmp_path / "decision-rule.json"
    args = ["--out", str(out), "--models", "hf-llama", "--rounds", "6", "--sizes", "tiny", "--result", str(record)]
    assert bench.main(args) == 0
    run = json.loads((out / "decision_rule.json").read_text())["runs"][0]
    assert [len(r) for r in run["rates"]] == [12, 12]
    rows = json.loads(record.read_text())["rows"]
    assert [tuple(r[:4]) for r in rows[:4]] == [
        ("hf-llama", "tiny", "1.00", "unpaired"),
        ("hf-llama", "tiny", "1.00", "paired"),
        ("hf-llama", "tiny", "1.03", "unpaired"),
        ("hf-llama", "tiny", "1.03", "paired"),
    ]
    assert len(rows) == 2 * len(bench.EFFECTS)
