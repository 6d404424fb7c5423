"""The study moves the selective recompute level: its space samples it, its memory model profiles
it only where the space can produce it, and a measured selective trial checks the level's kind."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from autotune import TrainConfig, load_workload
from autotune.errors import PredictionError
from autotune.knobs import Knobs
from autotune.memory import predict as predict_module
from autotune.search.memory_checks import stored_checks
from autotune.search.opening import open_study
from autotune.search.predictor import load_memory_predictor
from autotune.search.spec import MeasureSpec, SpaceSpec, StudySpec
from autotune.search.study import RunOptions, prepare, run_study
from autotune.search.trial_record import ATTR
from autotune.units import MemoryBudget
from tests.paths import TINY_WORKLOAD


def _counting_profiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], bool]]:
    """The modes and the selective flag of every fake-tensor profile the memory model takes."""
    calls: list[tuple[tuple[str, ...], bool]] = []
    real = predict_module.fake_profile

    def counted(workload: Any, **kw: Any) -> Any:
        calls.append((tuple(kw["modes"]), kw["selective"]))
        return real(workload, **kw)

    monkeypatch.setattr(predict_module, "fake_profile", counted)
    return calls


def test_the_predictor_profiles_the_selective_runs_only_where_they_are_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = load_workload(f"{TINY_WORKLOAD}:build")
    selective = TrainConfig(micro_batch_size=8, checkpoint="selective")
    calls = _counting_profiles(monkeypatch)
    # Before any trial checked a kind, a prediction is unverified without a profile taken.
    plain = load_memory_predictor(lazy=True)
    assert plain is not None
    with pytest.raises(PredictionError, match=r"no measured trial on cpu has checked its kind of configuration yet$"):
        plain(tiny, selective)
    assert calls == []
    # A trial's measurement profiles what it checks: in a space without the level, no selective
    # runs, for plain and recomputed configurations alike.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the made-up measured peaks are off: said, not checked here
        plain.trial_measured(tiny, TrainConfig(micro_batch_size=8), 10**6, trial=0)
        plain.trial_measured(tiny, TrainConfig(micro_batch_size=8, checkpoint=True), 10**6, trial=1)
        assert calls == [(("fp32",), False)]
        # A selective trial there (an enqueued one) grows the profile by them, once.
        plain.trial_measured(tiny, selective, 10**6, trial=2)
        plain.trial_measured(
            tiny, TrainConfig(micro_batch_size=4, checkpoint=(True, "selective", False, False)), 10**6, trial=3
        )
        assert calls == [(("fp32",), False), (("fp32",), True)]
        # A space with the level: the first profile holds them, and no other is taken.
        calls.clear()
        with_level = load_memory_predictor(lazy=True, selective=True)
        assert with_level is not None
        for trial, config in enumerate((TrainConfig(micro_batch_size=8), selective)):
            with_level.trial_measured(tiny, config, 10**6, trial=trial)
    assert calls == [(("fp32",), True)]


def test_a_study_measures_an_enqueued_selective_trial_and_it_checks_the_selective_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = StudySpec(
        workload="gpt-tiny",
        trials=3,
        memory_budget=MemoryBudget(bytes=2**30),
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=300),
        policy_proposal=False,
        retime=False,
        space=SpaceSpec(precisions=("fp32",), selective=True),
    )
    options = RunOptions(storage=str(tmp_path / "s.db"), cache=None, artifact_dir=tmp_path / "a")
    prepared = prepare(spec)
    assert prepared.space.selective
    knobs = Knobs(batch_size=32, micro_batch_size=8, checkpoint_blocks=2, selective_blocks=3)
    params = prepared.space.params(knobs)
    assert params == {"micro_batch_size": 8, "checkpoint_blocks": 2, "selective_blocks": 3}
    study = open_study(prepared, options)
    study.enqueue_trial(params)  # before the baselines: trial 0
    run_study(prepared, study, options)
    first = study.trials[0]
    config = TrainConfig.from_dict(first.user_attrs[ATTR.CONFIG])
    assert config == prepared.space.config(knobs)
    assert config.checkpoint_levels(6).count("selective") == 3 and config.checkpoint_levels(6).count("full") == 2
    checks = {v.kind: v for v in stored_checks(study, "cpu")}
    assert (checks["selective"].trial, checks["selective"].config, checks["selective"].verified) == (0, config, True)
    assert checks["selective"].measured == first.user_attrs[ATTR.PEAK]
    lines = re.findall(r"^memory model checked by trial 0 .*$", capsys.readouterr().err, re.MULTILINE)
    assert [re.sub(r"[\d.]+ (KiB|MiB)|[+-]\d+\.\d%", "#", line) for line in lines] == [
        "memory model checked by trial 0 (fp32, recomputed, selectively recomputed on cpu, micro-batch 8): "
        "predicted #, measured # (#), verified"
    ]


def _sampled_params(selective: bool | str, trials: int) -> list[dict[str, Any]]:
    """The params of the sampled trials of ``trials`` of a study of the tiny workload's space, run
    by the study's own sampler and space (its baselines enqueued first) on an objective that is a
    fixed function of the point: the sampler's choices, without the seconds of measuring them."""
    import optuna

    from autotune.search.opening import _sampler

    spec = StudySpec(
        workload="gpt-tiny",
        trials=trials,
        seed=0,
        policy_proposal=False,
        space=SpaceSpec(precisions=("fp32", "bf16"), selective=selective),  # type: ignore[arg-type]
    )
    prepared = prepare(spec)
    space = prepared.space
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=_sampler(spec, RunOptions()))
    for knobs in (
        Knobs(batch_size=32, micro_batch_size=32),
        Knobs(batch_size=32, micro_batch_size=8, checkpoint_blocks=6),
    ):
        study.enqueue_trial(space.params(knobs))

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        k = space.suggest(trial)
        speed = 100 / (1 + abs(k.micro_batch_size - 8)) - k.checkpoint_blocks - 2 * k.selective_blocks
        return speed + 3 * k.low_precision_blocks, k.micro_batch_size * (7 - k.checkpoint_blocks)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.optimize(objective, n_trials=trials)
    return [t.params for t in study.trials if "fixed_params" not in t.system_attrs]


def test_a_study_reaching_the_level_by_refinement_only_samples_the_trials_of_the_study_without_it() -> None:
    # The property that keeps the level from spreading the sampler's trials: the same seed, the
    # same sampled trials, none with the parameter, through TPE's model-based phase (after its
    # ten random trials) too.
    refine = _sampled_params("refine", 20)
    assert len(refine) == 18
    assert refine == _sampled_params(False, 20)
    assert all("selective_blocks" not in params for params in refine)
    # Sampled, the level is in every trial and the trials are others.
    sampled = _sampled_params(True, 20)
    assert all("selective_blocks" in params for params in sampled) and sampled != refine


def test_a_trial_enqueued_with_the_level_runs_it_where_the_study_reaches_it_by_refinement_only(
    tmp_path: Path,
) -> None:
    spec = StudySpec(
        workload="gpt-tiny",
        trials=1,
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=300),
        policy_proposal=False,
        retime=False,
        space=SpaceSpec(precisions=("fp32",), selective="refine"),
    )
    options = RunOptions(storage=str(tmp_path / "s.db"), cache=None, artifact_dir=tmp_path / "a")
    prepared = prepare(spec)
    assert prepared.space.selective and not prepared.space.samples_selective
    knobs = Knobs(batch_size=32, micro_batch_size=8, checkpoint_blocks=2, selective_blocks=3, low_precision="fp32")
    study = open_study(prepared, options)
    study.enqueue_trial(prepared.space.params(knobs))
    run_study(prepared, study, options)
    trial = study.trials[0]  # the baselines wait behind it
    assert trial.params == {"micro_batch_size": 8, "checkpoint_blocks": 2, "selective_blocks": 3}
    assert trial.user_attrs[ATTR.STATUS] == "ok"
    config = TrainConfig.from_dict(trial.user_attrs[ATTR.CONFIG])
    assert config == prepared.space.config(knobs)
    assert config.checkpoint_levels(6).count("selective") == 3 and config.checkpoint_levels(6).count("full") == 2
    assert prepared.space.knobs_of(trial.params) == knobs
