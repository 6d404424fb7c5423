"""The policy commands' bad inputs (``train-policy``, ``fine-tune-policy``, ``tune``): one line, exit 2,
nothing written, before any training (issue 19)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from tests.paths import TINY_WORKLOAD

TINY = f"{TINY_WORKLOAD}:build"
HELD = "already holds a policy (policy.json, policy.safetensors): pass --overwrite to replace it, or another --out."


def _policy_dir(path: Path) -> Path:
    path.mkdir()
    (path / "policy.json").write_text("{}")
    (path / "policy.safetensors").write_bytes(b"weights")
    return path


@pytest.mark.parametrize(
    ("out", "why"),
    [
        ("FILE", "--out must be a directory, but 'FILE' is a file."),
        ("FILE/sub", "--out must be a directory, but 'FILE/sub' lies under 'FILE', a file."),
        ("POLICY", f"--out 'POLICY' {HELD}"),
    ],
)
@pytest.mark.parametrize("command", ["train-policy", "fine-tune-policy"])
def test_an_out_that_cannot_take_a_policy_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, why: str, command: str
) -> None:
    paths = {"FILE": str(tmp_path / "notes.txt"), "POLICY": str(_policy_dir(tmp_path / "policy"))}
    Path(paths["FILE"]).write_text("my notes\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for key, value in paths.items():
        out, why = out.replace(key, value), why.replace(key, value)
    storage = tmp_path / "s.db"
    args = {
        "train-policy": ["--timesteps", "64"],
        "fine-tune-policy": [TINY, "--study", "tiny", "--storage", str(storage)],
    }[command]
    assert main([command, *args, "--out", out]) == 2
    assert capsys.readouterr() == ("", f"autotune {command}: error: {why}\n")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing written


def test_overwrite_replaces_a_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _policy_dir(tmp_path / "policy")
    assert main(["train-policy", "--timesteps", "64", "--out", str(out), "--overwrite"]) == 0
    saved = f"\nsaved {out}/policy.safetensors and {out}/policy.json\n"
    assert capsys.readouterr().out.endswith(saved)  # after SB3's training log
    assert (out / "policy.json").read_text() != "{}"


def test_tune_refuses_a_storage_it_could_not_record_in_before_it_trains(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", TINY, "--storage", "sqlite:////nonexistent-dir/x.db"]) == 2
    line = "autotune tune: error: cannot open storage 'sqlite:////nonexistent-dir/x.db': no folder '/nonexistent-dir'\n"
    assert capsys.readouterr() == ("", line)


def test_tune_refuses_a_min_micro_batch_below_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", TINY, "--min-micro-batch", "0"]) == 2
    assert capsys.readouterr() == ("", "autotune tune: error: --min-micro-batch must be >= 1, but got 0.\n")


@pytest.mark.parametrize("seconds", ["-1", "nan", "inf"])
def test_tune_refuses_fine_tune_seconds_that_are_not_a_finite_number_at_least_0(
    seconds: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", TINY, "--fine-tune-seconds", seconds]) == 2
    value = float(seconds)
    line = f"autotune tune: error: --fine-tune-seconds must be a finite number >= 0, but got {value!r}.\n"
    assert capsys.readouterr() == ("", line)


def test_tune_refuses_an_unknown_objective_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", TINY, "--objective", "bogus"]) == 2
    line = "autotune tune: error: objective must be one of ('per-gib', 'throughput'), but got 'bogus'.\n"
    assert capsys.readouterr() == ("", line)


def test_tune_says_each_phase_and_ends_with_the_studys_recommendation_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", TINY, "--steps", "1", "--steps-per-action", "2", "--fine-tune-seconds", "0", "--no-retime"]
    assert main([*args, "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    phases = [line for line in err.splitlines() if not line.startswith("busy machine:")]
    assert phases[0].startswith("workload tiny loaded: 34,340 parameters, 4 blocks (")
    assert all(re.search(r"(\(|, )\d+\.\d s\)$", line) for line in phases), phases
    baselines = [line.split(":")[0] for line in phases[-2:]]
    assert baselines == ["baseline pytorch-default measured", "baseline hf-recipe measured"]
    last = out.splitlines()[-1]
    assert re.fullmatch(
        r"recommended: step \d: micro x acc x ranks .+: \d+\.\d samples/s, peak .+, \d+\.\d samples/s per GiB "
        r"\(\d+\.\d\dx the PyTorch default and \d+\.\d\dx the HF recipe per GiB\)",
        last,
    ), last


def test_tune_json_without_baselines_compares_with_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", TINY, "--steps", "1", "--steps-per-action", "2", "--fine-tune-seconds", "0", "--no-retime"]
    assert main([*args, "--no-baselines", "--json", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    tuned = json.loads(out)
    assert list(tuned)[-4:] == ["baselines", "ratios", "side_by_side", "recommended"]
    assert (tuned["baselines"], tuned["ratios"], tuned["side_by_side"], tuned["retimed"]) == ([], {}, False, None)
    assert "baseline" not in err and "re-timed" not in err
