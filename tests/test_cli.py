"""The CLI as users run it: subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
USER = ROOT / "tests" / "data" / "my_workload.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see conftest: no thread oversubscription
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )


def test_measure_a_user_file_workload_as_json() -> None:
    proc = _run(
        "measure",
        "--workload",
        f"{USER}:build",
        "--micro-batch",
        "16",
        "--accum",
        "2",
        "--checkpoint",
        "0,2",
        "--precision",
        "bf16",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workload"] == "my-net"
    assert data["status"] == "ok"
    assert data["config"]["checkpoint"] == [True, False, True]
    assert data["config"]["precision"] == "bf16"
    assert data["memory"]["parameters"] == (3 * (32 * 32 + 32) + 32 * 2 + 2) * 4
    assert data["throughput"] > 0
    assert data["noise"]["steps"] == 4


def test_measure_prints_a_table() -> None:
    proc = _run("measure", "--workload", f"{USER}:build", "--steps", "2", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    for row in ("throughput", "peak memory", "optimizer state", "gradient noise scale", "loss slope"):
        assert row in proc.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("measure", "--workload", "nope.py:build"),
            "autotune measure: error: workload 'nope.py:build': file 'nope.py' does not exist",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--micro-batch", "0"),
            "autotune measure: error: TrainConfig.micro_batch_size must be >= 1, but got 0.",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--checkpoint", "0,7"),
            "autotune measure: error: --checkpoint block indices must be in [0, 2], but got 7.",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--memory-budget", "lots"),
            "autotune measure: error: --memory-budget must be a number with an optional unit "
            "(B, KB, MB, GB, KiB, MiB, GiB, ...), but got 'lots'.",
        ),
        (("tune", f"{USER}:build", "--ranks", "0"), "autotune tune: error: ranks must be an int >= 1, but got 0."),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args: tuple[str, ...], line: str) -> None:
    proc = _run(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == line
    assert proc.stdout == ""


def test_over_budget_is_reported_not_an_error() -> None:
    proc = _run(
        "measure", "--workload", f"{USER}:build", "--memory-budget", "10KiB", "--json", "--steps", "1", "--warmup", "1"
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "over_budget"
    assert data["memory_budget"] == 10240


def test_import_autotune_is_light() -> None:
    heavy = "('torch', 'deepspeed', 'optuna', 'stable_baselines3')"
    code = f"import sys, autotune; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


def test_workloads_without_transformers_lists_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process, to make `import transformers` fail; a subset of the built-ins keeps it fast.
    from autotune import cli, zoo
    from autotune.zoo.corpus import installed_version

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(zoo, "BUILTINS", {name: zoo.BUILTINS[name] for name in ("gpt-tiny", "hf-gpt2", "lstm-lm")})
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line
    assert cli.main(["workloads"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("│")}
    assert list(rows) == ["gpt-tiny", "hf-gpt2", "lstm-lm"]
    assert "autotune" in rows["gpt-tiny"] and "1,263,616" in rows["gpt-tiny"]
    assert "GPT2LMHeadModel" in rows["hf-gpt2"] and "pip install 'autotune[hf]'" in rows["hf-gpt2"]
    assert f"torch {installed_version('torch')} nn.LSTM" in rows["lstm-lm"] and "2,238,976" in rows["lstm-lm"]
