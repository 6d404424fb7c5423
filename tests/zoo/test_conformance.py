"""The conformance matrix: every command on every model of the real-model corpus (tiny sizes).

``measure`` (memory repeats exactly), checkpointing and ``predict`` against the measured peak are
in test_corpus.py. Here, for each corpus model (Hugging Face transformers, vision, recurrent; see
:mod:`autotune.zoo`): ``study`` for a few trials (the two baselines, the measurement cache) and its
exports (``best --format json|deepspeed|python``, the Python
``apply()`` run on a fresh copy of the model), and ``tune`` for two steps. The CLI runs in this
process (``autotune.cli.main``); study trials run in their measuring child as they do for users,
which rebuilds the tiny model from its reference, ``tests/zoo/tiny_corpus.py:NAME``.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import optuna
import pytest
import torch

from autotune import TrainConfig
from autotune.cli import main
from autotune.search.cache import MeasurementCache
from autotune.zoo import CORPUS
from tests.zoo import tiny_corpus

NAMES = sorted(CORPUS)
MEASURE = ("--steps", "2", "--warmup", "1", "--threads", "1")


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0, f"autotune {' '.join(args)} exited {code}: {err}"
    return out


@pytest.mark.parametrize("name", NAMES)
def test_study_exports_and_tune(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref, storage = tiny_corpus.reference(name), f"sqlite:///{tmp_path / 'study.db'}"
    common = ("--storage", storage, "--cache", str(tmp_path / "cache.db"), "--artifact-dir", str(tmp_path / "art"))
    # No policy proposal: its profile would add seconds per model (tests/policies covers it).
    _cli(capsys, "study", ref, "--trials", "3", "--no-progress", "--no-policy-proposal", *MEASURE, *common)
    study = optuna.load_study(study_name=tiny_corpus.build(name).name, storage=storage)
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 3
    assert [t.user_attrs.get("baseline") for t in trials[:2]] == ["pytorch-default", "seed-recipe"]
    statuses = {t.user_attrs.get("status") for t in trials}
    assert statuses <= {"ok", "failed", "over_budget", "predicted_over_budget"}, statuses
    assert trials[0].user_attrs["status"] == "ok", trials[0].user_attrs
    measured = [t for t in trials if t.user_attrs.get("status") in ("ok", "over_budget")]
    assert len(MeasurementCache(tmp_path / "cache.db")) == len(measured)

    config = TrainConfig.from_json(_cli(capsys, "best", study.study_name, "--storage", storage, "--format", "json"))
    ds = json.loads(_cli(capsys, "best", study.study_name, "--storage", storage, "--format", "deepspeed"))
    assert ds["train_micro_batch_size_per_gpu"] == config.micro_batch_size
    snippet = _cli(capsys, "best", study.study_name, "--storage", storage, "--format", "python")
    namespace: dict[str, object] = {}
    exec(compile(snippet, "best.py", "exec"), namespace)
    fresh = tiny_corpus.build(name)
    before = {k: v.detach().clone() for k, v in fresh.model.named_parameters()}
    handle = namespace["apply"](fresh.model)  # type: ignore[operator]
    two = list(itertools.islice(fresh.dataset, 2)) if fresh.iterable else [fresh.dataset[i] for i in range(2)]
    batch = fresh.collate(two)  # with the workload's collate: varlen-lm pads
    loss = fresh.loss_fn(fresh.model, batch)
    loss.backward()
    assert torch.isfinite(loss)
    handle.remove()
    assert "forward" not in vars(fresh.model.get_submodule(fresh.block_names()[0]))
    assert all(torch.equal(before[k], v) for k, v in fresh.model.named_parameters())

    # No fine-tuning (profile + 30 s per model by default; tests/policies/test_transfer.py covers
    # it): the real environment's reset, its probes and two real steps are what this checks.
    out = _cli(
        capsys,
        "tune",
        ref,
        "--steps",
        "2",
        "--steps-per-action",
        "2",
        "--memory-budget",
        "75%",
        "--fine-tune-seconds",
        "0",
        "--no-baselines",  # tests/policies/test_tune.py measures them; here they would add seconds per model
    )
    assert "final config" in out
