"""A proposal's trial where it is not measured side by side (autotune.adapt.stint_trial): decided
once, at the first decision its configuration has enough timed steps."""

from __future__ import annotations

from autotune import TrainConfig
from autotune.adapt.ledger import Ledger
from autotune.adapt.records import Change
from autotune.adapt.rules import Rules
from autotune.adapt.stint_trial import StintTrial
from autotune.tuning import TUNING
from tests.adapt.test_decider import GIB, A, B, _gate, _obs


def _trial() -> tuple[StintTrial, Ledger]:
    gate = _gate({A: GIB, B: GIB})
    ledger = Ledger(gate=gate, base_batch_size=32, adapt_batch=False)
    return StintTrial(
        ledger=ledger,
        rules=Rules(
            gate=gate,
            ledger=ledger,
            objective="per-gib",
            takes=None,
            min_micro_batch=1,
            micro_why="",
            recompiles=None,
        ),
    ), ledger


def _judge(ledger: Ledger, step: int, config: TrainConfig, throughput: float) -> None:
    for _ in range(TUNING.trusted_steps):
        ledger.add(config, throughput)
    ledger.judge(_obs(step, config))
    ledger.recent = []


def test_a_worse_proposal_goes_back_once_it_is_trusted_and_the_trial_ends() -> None:
    trial, ledger = _trial()
    logged: list[Change] = []
    _judge(ledger, 9, A, 100.0)
    trial.on = True
    assert trial.verdict(_obs(12, B), previous=A, log=logged.append) is None  # B not judged yet: goes on
    assert trial.on
    _judge(ledger, 19, B, 100.0)  # not more than the margin above A
    back = trial.verdict(_obs(19, B), previous=A, log=logged.append)
    assert back is not None and (back.before, back.after, back.applied, back.step) == (B, A, True, 19)
    assert not trial.on and logged == []
    assert trial.verdict(_obs(29, B), previous=A, log=logged.append) is None  # decided once


def test_a_better_proposal_stays_and_no_trial_means_no_verdict() -> None:
    trial, ledger = _trial()
    logged: list[Change] = []
    _judge(ledger, 9, A, 100.0)
    _judge(ledger, 19, B, 150.0)
    assert trial.verdict(_obs(19, B), previous=A, log=logged.append) is None  # off: nothing judged
    trial.on = True
    assert trial.verdict(_obs(19, B), previous=A, log=logged.append) is None
    assert not trial.on and logged == []
