"""The policy's proposal for a model it never saw, as ``autotune study --policy-proposal`` enqueues it."""

from __future__ import annotations

from pathlib import Path

from autotune.policies.transfer import propose

from autotune import Knobs
from autotune.search.baselines import PYTORCH_DEFAULT, SEED_RECIPE
from autotune.search.record import ATTR
from autotune.search.spec import MeasureSpec, StudySpec
from autotune.search.study import RunOptions, open_study, prepare, run_study
from tests.conftest import make_resmlp
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD


def test_the_proposal_keeps_the_batch_and_fits_the_budget_in_the_simulator() -> None:
    workload = make_resmlp(n=256)
    knobs = propose(workload, memory_budget=None, seconds=0)
    assert isinstance(knobs, Knobs)
    assert knobs.batch_size == workload.batch_size  # the user's batch


def test_a_study_with_the_policy_proposal_measures_it_as_one_more_baseline(tmp_path: Path) -> None:
    spec = StudySpec(
        workload=f"{TINY}:build", trials=3, measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=120)
    )
    options = RunOptions(storage=str(tmp_path / "s.db"), cache=None, artifact_dir=tmp_path / "artifacts",
                         memory_model=None, policy_proposal=True)  # fmt: skip
    prepared = prepare(spec)
    study = open_study(prepared, options)
    run_study(prepared, study, options)
    baselines = [t.user_attrs.get(ATTR.BASELINE) for t in study.trials]
    assert baselines[:3] == [PYTORCH_DEFAULT, SEED_RECIPE, "policy"]
    assert study.trials[2].state.name == "COMPLETE"
    assert "micro_batch_size" in study.trials[2].params  # a point of the study's space
