"""``autotune tune --json``: the episode as a record (run_episode), on a real training loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.config import TrainConfig
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD


def test_tune_json_is_the_episode(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", f"{TINY}:build", "--steps", "2", "--steps-per-action", "2", "--fine-tune-seconds", "0",
                 "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    episode = json.loads(out)
    steps = episode["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["action"] is None and steps[0]["reward"] is None
    assert all(len(s["action"]) == 5 and isinstance(s["reward"], float) for s in steps[1:])
    assert episode["return"] == pytest.approx(sum(s["reward"] for s in steps[1:]))
    assert TrainConfig.from_dict(episode["start_config"]) == TrainConfig.from_dict(steps[0]["config"])
    assert TrainConfig.from_dict(episode["final_config"]) == TrainConfig.from_dict(steps[-1]["config"])
    # The default budget is 75% of the starting configuration's measured peak.
    assert episode["budget_bytes"] == int(0.75 * steps[0]["peak_bytes"])
    assert all(s["peak_bytes"] > 0 and s["throughput"] > 0 for s in steps)
    assert all(s["batch"] == steps[0]["batch"] for s in steps)  # the user's batch, held
    best = steps[episode["best_step"]]
    assert TrainConfig.from_dict(episode["best_config"]) == TrainConfig.from_dict(best["config"])


def test_tune_records_its_best_step_as_a_study_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    from autotune.search.record import ATTR

    storage = f"sqlite:///{tmp_path / 's.db'}"
    code = main(["tune", f"{TINY}:build", "--steps", "2", "--steps-per-action", "2", "--fine-tune-seconds", "0",
                 "--memory-budget", "90%", "--storage", storage, "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    episode = json.loads(out)
    (summary,) = optuna.get_all_study_summaries(storage)
    (trial,) = optuna.load_study(study_name=summary.study_name, storage=storage).trials
    best = episode["steps"][episode["best_step"]]
    assert trial.state.name == "COMPLETE" and trial.user_attrs[ATTR.BASELINE] == "policy"
    assert trial.values == [best["throughput"], best["peak_bytes"] / 2**20]
    assert TrainConfig.from_dict(trial.user_attrs[ATTR.CONFIG]) == TrainConfig.from_dict(episode["best_config"])


def test_the_best_step_is_the_objective_s_goodput_when_the_batch_was_a_knob() -> None:
    from autotune.policies.episode import Episode, EpisodeStep

    def step(i: int, batch: int, throughput: float) -> EpisodeStep:
        return EpisodeStep(step=i, action=None, knobs="", batch=batch, config=TrainConfig(micro_batch_size=batch),
                           throughput=throughput, peak_bytes=2**30, b_noise=10.0, loss=1.0, reward=None)  # fmt: skip

    steps = (step(0, 32, 100.0), step(1, 64, 150.0))
    # At batch 64 against 32 with a noise scale of 10 samples: efficiency 42/74, goodput 85 < 100.
    assert Episode(workload="w", budget_bytes=2**30, steps=steps).best.step == 1
    assert Episode(workload="w", budget_bytes=2**30, steps=steps, adapt_batch=True).best.step == 0
