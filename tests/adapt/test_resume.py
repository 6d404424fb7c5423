"""Adaptive.state_dict / load_state_dict: an interrupted run resumed is the run never interrupted."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from autotune import TrainConfig
from autotune.adapt import Adaptive
from autotune.errors import ConfigError
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp

BATCH = 32


def _fp32(micro: int) -> TrainConfig:
    return TrainConfig(micro_batch_size=micro, grad_accum_steps=BATCH // micro, grad_clip=None)


FAST, SLOW, SMALL = _fp32(32), _fp32(8), _fp32(16)
#: Step times by configuration (the steps themselves are real): SLOW measures far worse per GiB and
#: is left after its side-by-side trial; SMALL measures better and is kept.
SECONDS = {FAST: 0.01, SLOW: 1.0, SMALL: 0.002}


def _build(script: list[TrainConfig], state: dict[str, Any] | None = None, **kwargs: Any) -> Adaptive:
    wl = make_resmlp(n=256)  # seeded: every call builds the same model and data
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    if state is not None:
        wl.model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
    tuner = Adaptive(
        wl.model,
        opt,
        wl.loss_fn,
        wl.dataset,
        batch_size=BATCH,
        policy=Scripted(script),
        decide_every=5,
        track_memory=True,
        **kwargs,
    )
    if state is not None:
        tuner.load_state_dict(state["tuner"])
    real_step = tuner.trainer.step

    def step(**kw: Any) -> Any:
        return dataclasses.replace(real_step(**kw), seconds=SECONDS[tuner.config])

    tuner.trainer.step = step  # type: ignore[method-assign]
    return tuner


def _decisions(tuner: Adaptive) -> list[dict[str, Any]]:
    """The history without the reconfigurations' wall time."""
    return [c.to_dict() | {"seconds": None} for c in tuner.history]


def _save(tuner: Adaptive, path: Path) -> None:
    torch.save(
        {"model": tuner.model.state_dict(), "optimizer": tuner.optimizer.state_dict(), "tuner": tuner.state_dict()},
        path,
    )


@pytest.mark.parametrize("stop", [8, 15])  # in SLOW's side-by-side trial; after SMALL was applied
def test_an_interrupted_and_resumed_run_is_the_uninterrupted_run(stop: int, tmp_path: Path) -> None:
    script = [SLOW, SMALL, SLOW]
    whole = _build(script)
    for _ in range(25):
        whole.step()
    whole.close()
    first = _build(script)
    for _ in range(stop):
        first.step()
    first.close()
    _save(first, tmp_path / "run.pt")
    resumed = _build(script, torch.load(tmp_path / "run.pt", weights_only=True))
    assert resumed.config == first.config
    for _ in range(25 - stop):
        resumed.step()
    resumed.close()
    # SLOW is tried once and left; SMALL is kept; SLOW proposed again is refused on its measurement.
    assert [s.config for s in resumed.steps] == [s.config for s in whole.steps]
    assert [s.step for s in resumed.steps] == list(range(25))
    assert [s.loss for s in resumed.steps] == [s.loss for s in whole.steps]
    assert _decisions(resumed) == _decisions(whole) and resumed.config == whole.config == SMALL
    assert [(r.config, r.timed_steps) for r in resumed.configs] == [(r.config, r.timed_steps) for r in whole.configs]


def test_a_resumed_run_under_a_smaller_budget_re_gates_the_restored_configuration(tmp_path: Path) -> None:
    first = _build([SMALL], memory_budget=None)
    for _ in range(10):
        first.step()
    first.close()
    assert first.config == SMALL
    _save(first, tmp_path / "run.pt")
    state = torch.load(tmp_path / "run.pt", weights_only=True)
    small_peak = first.gate.measured[SMALL]
    resumed = _build([SMALL], state, memory_budget=small_peak - 1)
    resumed.close()
    start = resumed.history[-1].after
    assert start.micro_batch_size < SMALL.micro_batch_size  # where this run's own budget starts it
    last = resumed.history[-1]
    assert (last.step, last.source, last.before, last.applied) == (10, "budget", SMALL, True)
    assert last.reason.startswith("resumed under a budget it is over (")
    assert resumed.config == start


def test_a_state_of_another_batch_or_version_is_refused() -> None:
    first = _build([])
    first.step()
    first.close()
    state = first.state_dict()
    resumed = _build([])
    other_batch = state | {"config": _fp32(16).to_dict() | {"grad_accum_steps": 4}}
    message = (
        "Adaptive state's effective batch must be this run's (32), but got 64: resume it with the batch_size "
        "it was saved at, or with adapt_batch=True."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        resumed.load_state_dict(other_batch)
    with pytest.raises(ConfigError, match=f"^{re.escape('Adaptive state must be version 1, 2 or 3, but got 0.')}$"):
        resumed.load_state_dict(state | {"version": 0})
    resumed.close()
    assert resumed.steps == [] and resumed.config == FAST


def test_the_pretrained_policy_s_state_survives_a_resume(tmp_path: Path) -> None:
    wl = make_resmlp(n=256)
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    first = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy="pretrained", decide_every=2)
    for _ in range(6):
        first.step()
    first.close()
    assert first.source is not None
    saved = first.source.state_dict()
    assert saved["first"]["step"] == 2  # the first decision's observation: what later ones are relative to
    torch.save(first.state_dict(), tmp_path / "tuner.pt")
    resumed = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy="pretrained", decide_every=2)
    resumed.load_state_dict(torch.load(tmp_path / "tuner.pt", weights_only=True))
    resumed.close()
    assert resumed.source is not None and resumed.source.state_dict() == saved
    assert resumed.config == first.config and resumed.history == first.history


def test_a_run_at_the_default_under_the_whole_default_budget_resumes_there(tmp_path: Path) -> None:
    """A budget of 100% is the default's own peak: the start admits the default without the
    prediction's headroom, and so does the resume (it re-gated it with the headroom and moved)."""
    first = _build([], memory_budget="100%")
    for _ in range(3):
        first.step()
    first.close()
    assert first.config == FAST and first.history == ()
    _save(first, tmp_path / "run.pt")
    resumed = _build([], torch.load(tmp_path / "run.pt", weights_only=True), memory_budget="100%")
    resumed.close()
    assert resumed.config == FAST and resumed.history == ()


def _resmlp_tuner(d: int) -> Adaptive:
    wl = make_resmlp(d=d, n=64)
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    return Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=Scripted([]), decide_every=5)


def test_a_state_saved_for_another_model_is_refused() -> None:
    first = _resmlp_tuner(64)
    first.step()
    first.close()
    state = first.state_dict()
    assert state["model"] == {"fingerprint": "525c70f587c2", "parameters": 134212}
    narrower = _resmlp_tuner(32)
    message = (
        "Adaptive state was saved for another model (134,212 parameters, fingerprint 525c70f587c2), but this run's "
        "model has 34,340 parameters (fingerprint 5f66120be0e2): load it into an Adaptive over the model it was "
        "saved from."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        narrower.load_state_dict(state)
    assert narrower.steps == [] and narrower.config == FAST  # nothing of the state applied
    # A state saved before the model was kept (version 2) loads unchecked, as it did.
    narrower.load_state_dict({k: v for k, v in state.items() if k != "model"} | {"version": 2})
    narrower.close()
    assert [s.step for s in narrower.steps] == [0]
    same = _resmlp_tuner(64)
    same.load_state_dict(state)  # the same layout, other weights: the state is this model's
    same.close()
    assert same.trainer.step_count == 1
