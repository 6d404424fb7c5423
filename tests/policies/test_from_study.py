"""``autotune fine-tune-policy``: a finished study's trials calibrate the simulator the policy is
fine-tuned on; the saved policy runs in ``tune --policy DIR`` and ``Adaptive(policy=DIR)``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from autotune.policies.ppo import load_policy

from autotune.adapt import decision_source
from autotune.cli import main
from autotune.search.opening import open_study
from autotune.search.spec import MeasureSpec, StudySpec
from autotune.search.study import RunOptions, prepare, run_study
from tests.paths import TINY_WORKLOAD

TINY = f"{TINY_WORKLOAD}:build"


def _study(tmp_path: Path, *, name: str, trials: int, create_only: bool = False) -> str:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec(
        workload=TINY,
        name=name,
        trials=trials,
        policy_proposal=False,
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=120),
    )
    options = RunOptions(
        storage=str(tmp_path / "s.db"),
        cache=None,
        artifact_dir=tmp_path / "artifacts",
        memory_model=None,
        create_only=create_only,
    )
    prepared = prepare(spec)
    run_study(prepared, open_study(prepared, options), options)
    return f"sqlite:///{tmp_path / 's.db'}"


def test_the_fitted_simulator_is_closer_and_the_saved_policy_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = _study(tmp_path, name="tiny", trials=6)
    out = tmp_path / "policy"
    args = ["fine-tune-policy", TINY, "--study", "tiny", "--storage", storage, "--out", str(out), "--seconds", "1"]
    assert main(args) == 0
    printed = capsys.readouterr().out
    meta = json.loads((out / "policy.json").read_text())["fine_tuned"]
    error = meta["throughput_error"]
    # The simulator's throughput at the trials' configurations, before and after the fit.
    assert error["fitted"] < error["calibrated"], error
    assert (meta["from_study"], meta["on"], meta["trials"]) == ("tiny", TINY, 6)
    before, after = math.exp(error["calibrated"]), math.exp(error["fitted"])
    assert printed == (
        f"saved {out}: fitted to 6 trials of study 'tiny' (simulated throughput off by x{before:.2f} calibrated "
        f"-> x{after:.2f} fitted, geometric RMS), fine-tuned {meta['steps']} steps\n"
    )
    assert load_policy(out).metadata["fine_tuned"] == meta
    assert decision_source(out).policy.metadata["fine_tuned"] == meta  # type: ignore[union-attr]
    code = main(
        [
            "tune",
            TINY,
            "--policy",
            str(out),
            "--steps",
            "1",
            "--steps-per-action",
            "2",
            "--fine-tune-seconds",
            "0",
            "--json",
        ]
    )
    tuned, err = capsys.readouterr()
    assert code == 0, err
    assert len(json.loads(tuned)["steps"]) == 2


def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    storage = _study(tmp_path, name="empty", trials=4, create_only=True)  # baselines enqueued, none measured
    capsys.readouterr()  # the study's setup lines
    out = tmp_path / "policy"
    cases = {
        ("nope", TINY): f"study 'nope' does not exist in '{storage}'",
        ("empty", TINY): "study 'empty' has 0 completed one-rank trials with a measured throughput; "
        "fine-tuning from a study needs at least 3",
        ("empty", "mlp-digits"): f"study 'empty' measured workload {TINY!r}, not 'mlp-digits' (another model, "
        "weights, data or batch): fine-tune from a study of this workload",
    }
    for (study, workload), message in cases.items():
        code = main(["fine-tune-policy", workload, "--study", study, "--storage", storage, "--out", str(out)])
        out_text, err = capsys.readouterr()
        assert (code, out_text, err) == (2, "", f"autotune fine-tune-policy: error: {message}\n")
        assert not out.exists()
