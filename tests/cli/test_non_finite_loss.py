"""A workload whose loss is NaN, through every command that trains it: a study prunes, ``tune`` and
``train --adapt`` stop with one line and exit 3, ``train`` warns once (issue 19)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.cli.main import EXIT_NON_FINITE_LOSS
from tests.paths import NAN_WORKLOAD
from tests.phase_lines import without_phase_lines

NAN = f"{NAN_WORKLOAD}:build"
CALIBRATION = "the default configuration's loss is nan at step 1: nothing to calibrate"


def test_a_study_prunes_every_trial_and_goes_on_without_the_proposal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    where = ("--storage", str(db), "--no-cache", "--artifact-dir", str(tmp_path / "art"))
    assert (
        main(
            ["study", NAN, "--trials", "4", *where, "--steps", "2", "--warmup", "1", "--threads", "1", "--no-progress"]
        )
        == 0
    )
    assert re.search(
        f"^no policy proposal: nan-net: {re.escape(CALIBRATION)} \\(\\d+\\.\\d s\\)$", capsys.readouterr().err, re.M
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="nan-net", storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.PRUNED] * 4  # none left WAITING
    # After the baselines, no proposal: the sampler's trial.
    baselines = [t.user_attrs.get("baseline") for t in study.trials]
    assert baselines == ["pytorch-default", "seed-recipe", "hf-recipe", None]


@pytest.mark.parametrize(
    ("seconds", "line"),
    [
        ("0", "the loss is nan at the episode's start (16x1): a policy cannot act on a diverged run"),
        ("1", f"nan-net: {CALIBRATION}"),  # fine-tuning profiles the model first
    ],
)
def test_tune_stops_with_one_line(seconds: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", NAN, "--steps", "2", "--fine-tune-seconds", seconds]) == EXIT_NON_FINITE_LOSS == 3
    out = capsys.readouterr()
    # The setup phases said their lines before the NaN was found; the stop is one line after them.
    assert (out.out, without_phase_lines(out.err)) == ("", f"autotune tune: {line}\n")
    assert out.err.startswith("workload nan-net loaded: 578 parameters, 2 blocks (")


def test_train_adapt_stops_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # The policy's start plan profiles the model: its calibration sees the NaN before any step.
    assert main(["train", NAN, "--steps", "4", "--adapt"]) == EXIT_NON_FINITE_LOSS
    out = capsys.readouterr()
    assert (out.out, without_phase_lines(out.err)) == ("", f"autotune train: nan-net: {CALIBRATION}\n")


def test_fixed_train_warns_once_at_the_first_nan_and_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", NAN, "--steps", "3", "--json"]) == 0
    warning = (
        "autotune train: warning: step 0: the loss is nan under micro x acc x ranks 16x1x1 | fp32 | ckpt none "
        "| ZeRO 0 (its update skipped: the weights and optimizer state are the step before's); training goes on"
    )
    out = capsys.readouterr()
    # The progress bar leaves a blank line.
    assert [line for line in without_phase_lines(out.err).splitlines() if line] == [warning]
    assert [s["loss"] for s in json.loads(out.out)["steps"]] == [pytest.approx(math.nan, nan_ok=True)] * 3
