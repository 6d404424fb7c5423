"""``autotune tune --json``: the episode as a record (run_episode), on a real training loop."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.units import format_bytes
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD


def test_tune_json_is_the_episode(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["tune", f"{TINY}:build", "--steps", "2", "--steps-per-action", "2", "--fine-tune-seconds", "0", "--json"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    episode = json.loads(out)
    steps = episode["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert steps[0]["action"] is None and steps[0]["reward"] is None
    assert all(len(s["action"]) == 7 and isinstance(s["reward"], float) for s in steps[1:])
    assert episode["return"] == pytest.approx(sum(s["reward"] for s in steps[1:]))
    assert TrainConfig.from_dict(episode["start_config"]) == TrainConfig.from_dict(steps[0]["config"])
    assert TrainConfig.from_dict(episode["final_config"]) == TrainConfig.from_dict(steps[-1]["config"])
    # The default budget is 75% of the default's measured peak: the episode starts within it
    # (where an adaptive run would: the first smaller micro-batch that fits).
    assert steps[0]["peak_bytes"] <= episode["budget_bytes"] and steps[0]["knobs"] == "8x2"
    assert all(s["peak_bytes"] > 0 and s["throughput"] > 0 for s in steps)
    assert all(s["batch"] == steps[0]["batch"] for s in steps)  # the user's batch, held
    best = steps[episode["best_step"]]
    assert TrainConfig.from_dict(episode["best_config"]) == TrainConfig.from_dict(best["config"])
    # Step 1 is the policy's unless it proposed to stay; step 2, the last quarter, the climb's
    # unless no neighbour of the best step was left to try (tests/policies/test_climb.py: exact).
    assert steps[0]["source"] is None and {s["source"] for s in steps[1:]} <= {"policy", "climb"}
    # Then the baselines (within the budget here), re-timed in the best steps' run, and the ratios from it.
    assert list(episode)[-4:] == ["baselines", "ratios", "side_by_side", "recommended"]
    baselines = episode["baselines"]
    assert [b["name"] for b in baselines] == ["pytorch-default", "hf-recipe"]
    keys = ["name", "config", "throughput", "peak_bytes", "per_gib", "within_budget", "reason"]
    assert all(list(b) == [*keys, "retimed_throughput", "retimed_spread", "retimed_per_gib"] for b in baselines)
    assert all(b["within_budget"] is True and b["peak_bytes"] <= episode["budget_bytes"] for b in baselines)
    assert all(b["retimed_throughput"] > 0 and b["reason"] is None for b in baselines)
    assert episode["side_by_side"] is True
    mine = episode["retimed"]["retimed_per_gib"][episode["retimed"]["steps"].index(episode["best_step"])]
    assert episode["ratios"] == {b["name"]: mine / b["retimed_per_gib"] for b in baselines}


def test_tune_no_refine_is_the_policy_alone(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["tune", f"{TINY}:build", "--steps", "2", "--steps-per-action", "2", "--fine-tune-seconds", "0"]
    code = main([*args, "--no-refine", "--no-retime", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert [s["source"] for s in json.loads(out)["steps"]] == [None, "policy", "policy"]


def test_tune_records_its_best_step_as_a_study_trial(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import optuna

    from autotune.search.trial_record import ATTR

    storage = f"sqlite:///{tmp_path / 's.db'}"
    code = main(
        [
            "tune",
            f"{TINY}:build",
            "--steps",
            "2",
            "--steps-per-action",
            "2",
            "--fine-tune-seconds",
            "0",
            "--memory-budget",
            "90%",
            "--storage",
            storage,
            "--json",
        ]
    )
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
        return EpisodeStep(
            step=i,
            action=None,
            knobs="",
            batch=batch,
            config=TrainConfig(micro_batch_size=batch),
            throughput=throughput,
            peak_bytes=2**30,
            b_noise=10.0,
            loss=1.0,
            reward=None,
        )

    steps = (step(0, 32, 100.0), step(1, 64, 150.0))
    # At batch 64 against 32 with a noise scale of 10 samples: efficiency 42/74, goodput 85 < 100.
    assert Episode(workload="w", budget_bytes=2**30, steps=steps).best.step == 1
    assert Episode(workload="w", budget_bytes=2**30, steps=steps, adapt_batch=True).best.step == 0


def _step(i: int, peak: int, loss: float = 1.0) -> Any:
    from autotune.policies.episode import EpisodeStep

    return EpisodeStep(
        step=i,
        action=None,
        knobs="16x1",
        batch=16,
        config=TrainConfig(micro_batch_size=16),
        throughput=100.0 * (i + 1),
        peak_bytes=peak,
        b_noise=None,
        loss=loss,
        reward=None,
    )


def test_a_start_over_the_budget_with_every_action_refused_is_no_best() -> None:
    from autotune.policies.episode import Episode

    # Seen (issue 19): step 0 peaked at 9.30 MB against a 6.98 MB budget, every action refused.
    episode = Episode(workload="w", budget_bytes=6_980_000, steps=(_step(0, 9_300_000), _step(1, 9_300_000)))
    assert episode.best is None
    line = "nothing measured fitted the budget of 6.657 MiB: the lowest peak was 8.869 MiB (step 0, 16x1)"
    assert episode.nothing_fits == line
    data = episode.to_dict()
    assert (data["best_step"], data["best_config"], data["nothing_fits"]) == (None, None, line)


def test_a_step_whose_loss_is_not_finite_is_never_the_best() -> None:
    from autotune.policies.episode import Episode

    episode = Episode(workload="w", budget_bytes=2**20, steps=(_step(0, 2**19), _step(1, 2**19, loss=math.nan)))
    assert episode.best is not None and episode.best.step == 0 and episode.nothing_fits is None


def test_tune_says_nothing_fitted_and_records_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    code = main(
        [
            "tune",
            f"{TINY}:build",
            "--steps",
            "2",
            "--steps-per-action",
            "2",
            "--fine-tune-seconds",
            "0",
            "--memory-budget",
            "1%",
            "--storage",
            f"sqlite:///{db}",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    episode = json.loads(out)
    low = min(s["peak_bytes"] for s in episode["steps"])
    assert all(s["peak_bytes"] > episode["budget_bytes"] for s in episode["steps"])
    assert (episode["best_step"], episode["best_config"]) == (None, None)
    line = (
        f"nothing measured fitted the budget of {format_bytes(episode['budget_bytes'])}: the lowest peak was "
        f"{format_bytes(low)} (step 0, 16x1)"
    )
    assert episode["nothing_fits"] == line
    # After the phases' lines (tests/policies/test_tune.py), the one that says nothing was recorded.
    assert err.splitlines()[-1] == f"nothing recorded in sqlite:///{db}: {line}"
    assert not db.exists()


def test_tune_stops_with_exit_3_at_a_step_whose_loss_is_not_finite(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from autotune.envs.training import TrainingEnv

    train = TrainingEnv._train
    calls = []

    def diverging(self: TrainingEnv, knobs: Any) -> Any:
        result = train(self, knobs)
        calls.append(knobs)
        return result._replace(loss=math.nan) if len(calls) == 2 else result  # the first action's interval

    monkeypatch.setattr(TrainingEnv, "_train", diverging)
    code = main(
        [
            "tune",
            f"{TINY}:build",
            "--steps",
            "3",
            "--steps-per-action",
            "2",
            "--fine-tune-seconds",
            "0",
            "--memory-budget",
            "200%",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    episode = json.loads(out)  # what ran before is still reported
    last = episode["steps"][-1]
    assert code == 3 and last["step"] == 1 and math.isnan(last["loss"])
    assert episode["best_step"] == 0  # the diverged step is not the best, whatever its throughput
    ended = f"autotune tune: the loss was nan at step 1 ({last['knobs']}): the episode ended there"
    assert err.splitlines()[-1] == ended
    assert not any(line.startswith("baseline ") for line in err.splitlines())  # a diverged run measures none


def test_the_best_step_is_the_most_per_gib_or_the_fastest_within_the_budget() -> None:
    from autotune.policies.episode import Episode, EpisodeStep

    def step(i: int, throughput: float, gib: int) -> EpisodeStep:
        return EpisodeStep(
            step=i,
            action=None,
            knobs="",
            batch=16,
            config=TrainConfig(micro_batch_size=2**i),
            throughput=throughput,
            peak_bytes=gib * 2**30,
            b_noise=None,
            loss=1.0,
            reward=None,
        )

    # 100 per GiB, 75 per GiB (150 samples/s), and 300 samples/s over the 3 GiB budget.
    steps = (step(0, 100.0, 1), step(1, 150.0, 2), step(2, 300.0, 4))
    per_gib = Episode(workload="w", budget_bytes=3 * 2**30, steps=steps)
    fastest = Episode(workload="w", budget_bytes=3 * 2**30, steps=steps, objective="throughput")
    assert [s.step for s in per_gib.ranked()] == [0, 1] and [s.step for s in fastest.ranked()] == [1, 0]
    assert (per_gib.value(steps[1]), fastest.value(steps[1]), fastest.per_gib(steps[1])) == (75.0, 150.0, 75.0)
    assert per_gib.best is not None and fastest.best is not None
    assert (per_gib.best.step, fastest.best.step) == (0, 1)
    assert "objective" not in per_gib.to_dict() and fastest.to_dict()["objective"] == "throughput"


def test_one_best_step_is_re_timed_only_beside_other_configurations(monkeypatch: pytest.MonkeyPatch) -> None:
    """``retime_best``'s ``beside`` (``tune``'s baselines): timed in the best steps' run, a
    configuration equal to a best step's timed once for both; the side-by-side run faked."""
    from autotune.policies.episode import Episode, retime_best

    from autotune.measurement import sidebyside
    from autotune.measurement.sidebyside import Retimed, Timing

    calls: list[list[TrainConfig]] = []

    def retime_configs(workload: Any, configs: Any, *, scales: Any, device: Any) -> Retimed:
        calls.append(list(configs))
        timings = tuple(Timing(rates=(10.0 * (i + 1),)) for i in range(len(configs)))
        return Retimed(timings=timings, ranking=(0,), decided=True, rounds=3, warmup=(1,), other_cores=None)

    monkeypatch.setattr(sidebyside, "retime_configs", retime_configs)
    episode = Episode(workload="w", budget_bytes=2**30, steps=(_step(0, 2**29),))
    assert retime_best(episode, None) == (episode, ())  # type: ignore[arg-type]  # one step alone: nothing to time
    other = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    same = episode.steps[0].config
    retimed, timings = retime_best(episode, None, beside=[(other, 1.0), (same, 2.0)])  # type: ignore[arg-type]
    assert calls == [[same, other]]
    assert timings == (Timing(rates=(20.0,)), Timing(rates=(10.0,)))  # the step's own timing for `same`
    assert retimed.retimed is not None and (retimed.retimed["steps"], retimed.retimed["winner"]) == ([0], 0)
