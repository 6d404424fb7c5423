"""Every sampler the CLI offers runs our space, two objectives and the legacy constraints list
(written the way optuna-dashboard 0.21 reads it) without a warning."""

from __future__ import annotations

import optuna
import pytest

from autotune.search.opening import _sampler
from autotune.search.space import SearchSpace
from autotune.search.spec import StudySpec
from autotune.search.study import RunOptions
from autotune.search.trial import set_constraints


@pytest.mark.parametrize("name", ["tpe", "nsga2", "gp", "random"])
def test_sampler_runs_the_space_with_constraints(name: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = SearchSpace(batch_sizes=(16,), ranking=(1, 0, 2, 3), max_micro_batch=64)
    spec = StudySpec(workload="x", sampler=name, trials=12)  # type: ignore[arg-type]
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=_sampler(spec, RunOptions()))
    for i in range(12):
        trial = study.ask()
        knobs = space.suggest(trial)
        config = space.config(knobs)
        peak = 100.0 * config.micro_batch_size - 10 * knobs.checkpoint_blocks
        set_constraints(trial, [peak - 800.0])
        study.tell(trial, [float(config.micro_batch_size + i % 3), peak])
    assert len(study.trials) == 12
    assert all(len(t.constraints) == 1 for t in study.trials)
    feasible = [t for t in study.best_trials if t.constraints["0"] <= 0]
    assert feasible == study.best_trials  # constrained studies report only feasible trials as best
