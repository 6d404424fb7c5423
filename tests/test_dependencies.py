"""The base install and the extras: a missing extra is one line naming what to install, exit 2."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

import pytest
import tomllib

from autotune.dependencies import BASE_MODULES, EXTRA_OF, install_command, missing_dependency
from autotune.errors import MissingDependencyError
from autotune.search.spec import SpaceSpec, StudySpec
from autotune.search.study import prepare
from tests.paths import ROOT

# The module, not the function `autotune.cli.main` that the package re-exports under its name.
cli_main = importlib.import_module("autotune.cli.main")


def test_the_searchers_are_in_the_base_install_and_the_rest_are_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {r.split(">")[0].split("=")[0] for r in project["dependencies"]}
    assert {"optuna", "gymnasium", "stable-baselines3", "safetensors", "torch"} <= base
    extras = {name: reqs for name, reqs in project["optional-dependencies"].items() if name not in ("all", "dev")}
    assert extras == {
        "dashboard": ["optuna-dashboard>=0.21", "plotly>=5"],
        "zero": ["deepspeed>=0.16"],
        "hf": ["transformers>=4.45", "accelerate>=1.1"],
        "lightning": ["lightning>=2.4"],
    }
    assert set(EXTRA_OF.values()) == set(extras)


def test_missing_dependency_names_the_extra_or_the_base_install() -> None:
    extra = missing_dependency(ModuleNotFoundError("No module named 'deepspeed'", name="deepspeed.comm"))
    base = missing_dependency(ModuleNotFoundError("No module named 'optuna'", name="optuna"))
    assert isinstance(extra, MissingDependencyError) and isinstance(base, MissingDependencyError)
    assert str(extra) == "this needs deepspeed, which is not installed: pip install 'torch-autotune[zero]'"
    assert (
        str(base)
        == "optuna is not installed, and every autotune command needs it: pip install torch-autotune installs it"
    )
    assert missing_dependency(ModuleNotFoundError("No module named 'my_lib'", name="my_lib")) is None
    assert "stable_baselines3" in BASE_MODULES and install_command("hf") == "pip install 'torch-autotune[hf]'"


def _failing_command(error: BaseException) -> argparse.ArgumentParser:
    def func(args: argparse.Namespace) -> int:
        raise error

    parser = argparse.ArgumentParser(prog="autotune")
    parser.set_defaults(func=func, command="measure")
    return parser


def test_the_cli_says_a_missing_extra_in_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    error = ModuleNotFoundError("No module named 'transformers'", name="transformers")
    monkeypatch.setattr(cli_main, "_parser", lambda: _failing_command(error))
    assert cli_main.main([]) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "autotune measure: error: this needs transformers, which is not installed: pip install 'torch-autotune[hf]'\n",
    )


def test_the_cli_shows_the_traceback_of_a_module_that_is_none_of_its_dependencies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    error = ModuleNotFoundError("No module named 'my_lib'", name="my_lib")
    monkeypatch.setattr(cli_main, "_parser", lambda: _failing_command(error))
    with pytest.raises(ModuleNotFoundError, match="my_lib"):
        cli_main.main([])


def test_a_study_on_ranks_without_deepspeed_is_refused_before_it_loads_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    spec = StudySpec(workload="no-such-workload", space=SpaceSpec(ranks=(1, 2)))
    with pytest.raises(MissingDependencyError) as info:
        prepare(spec)  # the workload reference is bad too: the refusal comes first, nothing loaded
    assert (
        str(info.value)
        == "ranks 2: several ranks run on DeepSpeed, which is not installed: pip install 'torch-autotune[zero]'"
    )
