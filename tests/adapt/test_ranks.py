"""Adaptive.on_ranks: the adaptive run on 2 real DeepSpeed ranks (gloo, CPU), ZeRO stage included.

The trajectory test shares one session between its two runs (a start costs ~10 s); the command's
tests (``test_train_command.py``) start their own, as a run does by default, and check that no
process is left after the run or Ctrl-C. That a failing rank ends every process is the session's
(``tests/procs/test_session.py``); here, what the run makes of it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator

import pytest

from autotune import TrainConfig, load_workload
from autotune.adapt import Adaptive
from autotune.adapt.ranks import RankLoop
from autotune.errors import ConfigError, RankFailed, TrainingError, UnsupportedError
from autotune.memory.predict import predict_memory
from autotune.procs.session import RankSession
from tests.adapt.scripted import Scripted
from tests.paths import ZERO_WORKLOADS

TINY = f"{ZERO_WORKLOADS}:build"  # batch 32: 16 per rank
#: Bytes per rank: the default (ZeRO 0, predicted 66,888 B, +5% headroom) is over it; ZeRO 1-3,
#: which partition Adam's state over the 2 ranks, fit (predicted 57-60 kB, measured within 3%).
BUDGET = 70_000
STEPS = 10


@pytest.fixture(scope="module")
def session() -> Iterator[RankSession]:
    with RankSession(ranks=2, timeout=300) as s:
        yield s


def _config(**changes: object) -> TrainConfig:
    return TrainConfig(**({"micro_batch_size": 16, "ranks": 2, "grad_clip": None} | changes))  # type: ignore[arg-type]


def _run(session: RankSession, policy: Scripted | None) -> tuple[Adaptive, list[float]]:
    tuner = Adaptive.on_ranks(TINY, ranks=2, memory_budget=BUDGET, policy=policy, decide_every=2, session=session)
    losses = [tuner.step().loss for _ in range(STEPS)]
    tuner.close()
    return tuner, losses


def test_zero_stage_changes_keep_the_loss_of_a_run_that_never_changed_stage(session: RankSession) -> None:
    split = {"micro_batch_size": 8, "grad_accum_steps": 2, "checkpoint": True}
    script = [_config(zero_stage=3), _config(), _config(zero_stage=1, **split), _config(zero_stage=2)]
    changing, losses = _run(session, Scripted(script))
    staying, fixed = _run(session, None)
    assert not session.closed  # a given session stays open for its owner
    # Same data (each rank's stream keeps its place), same updates: only the reduction order may differ.
    assert losses == pytest.approx(fixed, rel=1e-6, abs=0)
    start = _config(zero_stage=1)  # the first fp32 config of the full micro-batch that fits, per rank
    assert [s.config for s in staying.steps] == [start] * STEPS
    assert [s.config.zero_stage for s in changing.steps] == [1, 1, 3, 3, 3, 3, 1, 1, 2, 2]
    assert {s.samples for s in changing.steps} == {32}  # the effective batch over both ranks, kept
    first, *decisions = changing.history
    assert (first.step, first.source, first.after, first.applied) == (0, "budget", start, True)
    assert [(c.step, c.after, c.applied) for c in decisions] == [
        (2, script[0], True),
        (4, script[1], False),
        (6, script[2], True),
        (8, script[3], True),
    ]
    applied = [c for c in decisions if c.applied]
    assert [c.reason.rpartition("; ")[2] for c in applied] == [
        "new engines: ZeRO stage 1 -> 3",
        "new engines: ZeRO stage 3 -> 1",
        "new engines: ZeRO stage 1 -> 2",
    ]
    assert all(c.seconds > 0 for c in applied)
    # Refused on the memory model's prediction per rank, before the ranks ever ran it.
    refused = decisions[1]
    per_rank = predict_memory(load_workload(TINY), script[1], profile=changing.gate.profile).total
    assert per_rank == predict_memory(load_workload(TINY), script[1], profile=changing.gate.profile, ranks=2).total
    assert refused.predicted_bytes == per_rank and refused.measured_bytes is None
    assert refused.reason == f"scripted; predicted {per_rank} B (+5% headroom) > budget {BUDGET} B"
    assert all(s.config.zero_stage != 0 for s in changing.steps)
    tracked = [s.peak_bytes for s in changing.steps if s.peak_bytes is not None]
    assert len(tracked) == 4 and max(tracked) <= BUDGET  # each config's first step, the highest rank's bytes


def test_a_user_s_batch_and_resuming_are_refused_on_ranks_in_one_line(session: RankSession) -> None:
    tuner = Adaptive.on_ranks(TINY, ranks=2, memory_budget=BUDGET, policy=None, session=session)
    batch = tuner.workload.dataset[:32]  # type: ignore[index]
    message = (
        "Adaptive.on_ranks trains each rank's shard of the workload's dataset in the rank processes: "
        "step(batch) needs Adaptive(model, ...) in this process; call step() with no batch."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(message)}$"):
        tuner.step(batch)
    message = (
        "Adaptive.on_ranks keeps its training state in the rank processes: state_dict() and "
        "load_state_dict() need Adaptive(model, ...) in one process."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(message)}$"):
        tuner.state_dict()
    tuner.close()
    assert tuner.steps == []


def test_a_rank_failure_is_a_training_error_naming_the_rank_and_the_config() -> None:
    class FailingSession:
        """What a session raises when rank 1's step raises (it has reaped every process then)."""

        config: TrainConfig | None = None

        def start(self, workload: object, config: TrainConfig) -> None:
            self.config = config

        def step(self) -> None:
            raise RankFailed(rank=1, op="step", type="RuntimeError", message="refused", out_of_memory=False)

    loop = RankLoop(FailingSession(), load_workload(TINY), _config(zero_stage=2), owned=False)  # type: ignore[arg-type]
    msg = "training 'my-net' failed under micro x acc x ranks 16x1x2 | fp32 | ckpt none | ZeRO 2 on rank 1: "
    msg += "RuntimeError: refused"
    with pytest.raises(TrainingError, match=f"^{re.escape(msg)}$") as e:
        loop.step()
    assert isinstance(e.value.__cause__, RankFailed)
    assert loop.step_count == 0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"ranks": 1}, ConfigError, "ranks must be an int >= 2 (one process: Adaptive(model, ...)), but got 1."),
        ({"ranks": 3}, ConfigError, "the batch of workload 'my-net' (32) must divide evenly by ranks=3."),
        (
            {"workload": "object"},
            UnsupportedError,
            "workload 'my-net' has no source reference, but every DeepSpeed rank rebuilds it from one; load it with "
            "autotune.load_workload(...) (or set Workload.source).",
        ),
        (
            {"policy": TrainConfig(micro_batch_size=32, grad_clip=None)},
            ConfigError,
            "FixedConfig must run on the run's 2 ranks, but got ranks=1, zero_stage=0.",
        ),
        ({"decide_every": 1}, ConfigError, "decide_every must be an int >= 2, but got 1."),
    ],
)
def test_user_mistakes_are_refused_before_any_rank_starts(
    kwargs: dict[str, object], error: type[Exception], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_ranks(*args: object, **kw: object) -> None:
        raise AssertionError("a rank session was started")

    monkeypatch.setattr(RankSession, "__init__", no_ranks)
    workload: object = TINY
    if kwargs.pop("workload", None) == "object":
        workload = dataclasses.replace(load_workload(TINY), source=None)
    args = {"ranks": 2, "policy": None} | kwargs
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        Adaptive.on_ranks(workload, **args)  # type: ignore[arg-type]
