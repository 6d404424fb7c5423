"""scripts/regenerate_profiles.py: its list is the shipped profiles, each made as the file records.

No profile is regenerated here (it times real steps): the list, the workloads it builds and the
one-line refusals are checked.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("regenerate_profiles", ROOT / "scripts" / "regenerate_profiles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


script = _load()


def test_the_list_is_every_shipped_profile_file() -> None:
    files = sorted(p.name for p in (ROOT / "envs" / "profiles").glob("*.json"))
    assert sorted(s.file for s in script.SHIPPED) == files


def test_each_entry_records_the_workload_the_shipped_file_names() -> None:
    for s in script.SHIPPED:
        shipped = json.loads((ROOT / "envs" / "profiles" / s.file).read_text())
        assert s.workload == shipped["workload"], s.file


@pytest.mark.parametrize("name", ["mlp-digits", "random-10", "random-14", "hf-gpt2-tiny", "lstm-lm-tiny"])
def test_each_workload_is_built_at_the_shipped_batch(name: str) -> None:
    if name.startswith("hf-"):
        pytest.importorskip("transformers")
    s = next(s for s in script.SHIPPED if s.file == f"{name}.json")
    shipped = json.loads((ROOT / "envs" / "profiles" / s.file).read_text())
    wl = s.build()
    assert (wl.source, wl.batch_size) == (shipped["workload"], shipped["batch_size"])


def test_curve_lengths_are_the_shipped_ones() -> None:
    for s in script.SHIPPED:
        shipped = json.loads((ROOT / "envs" / "profiles" / s.file).read_text())
        assert s.curve_steps == len(shipped["curve_samples"]), s.file


def test_an_unknown_name_or_a_missing_directory_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert script.main(["--only", "gpt-small", "--out", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("regenerate_profiles: --only must name shipped profiles (gpt-tiny, resnet-tiny, ")
    assert out.endswith(", but got 'gpt-small'\n") and out.count("\n") == 1
    assert script.main(["--only", "gpt-tiny", "--out", "/nonexistent/dir"]) == 2
    assert capsys.readouterr().out == "regenerate_profiles: --out '/nonexistent/dir' is not a directory\n"
