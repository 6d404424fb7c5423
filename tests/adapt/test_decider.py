"""The shared decision rules, driven with exact figures (no training: measured peaks recorded,
throughputs given)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune import TrainConfig
from autotune.adapt import BudgetGate, Change, Proposal, RunContext
from autotune.adapt.decider import Decider
from autotune.adapt.sources import DecisionSource, Observation
from autotune.memory.blocks import profile_blocks
from autotune.tuning import TUNING
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp

GIB = 2**30
A = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None)
B = dataclasses.replace(A, checkpoint=True)
C = TrainConfig(micro_batch_size=4, grad_accum_steps=8, grad_clip=None)


def _gate(peaks: dict[TrainConfig, int], budget: int = 4 * GIB) -> BudgetGate:
    gate = BudgetGate(make_resmlp(n=64), budget, profile=None)  # no profile: only measured configs pass
    for config, peak in peaks.items():
        gate.record(config, peak)
    return gate


def _obs(step: int, config: TrainConfig) -> Observation:
    return Observation(step=step, config=config, throughput=0.0, peak_bytes=0, b_noise=None, losses=())


def _decider(source: DecisionSource | None, gate: BudgetGate, **kwargs: object) -> Decider:
    decider = Decider(source=source, gate=gate, base_batch_size=32, **kwargs)  # type: ignore[arg-type]
    wl = gate.workload
    context = RunContext(
        workload=wl,
        start=A,
        budget=lambda: gate.budget,
        blocks=profile_blocks(wl, micro_batch_size=2),
        device_type="cpu",
        admits=lambda c: gate.admits(c).admitted,
    )
    assert decider.begin(start=A, default=A, context=context if source is not None else None) is None
    return decider


def _time(decider: Decider, config: TrainConfig, *samples: float) -> None:
    for s in samples:
        decider.timed(config, s)


def test_a_trial_no_better_than_the_best_goes_back_and_is_not_proposed_again() -> None:
    decider = _decider(Scripted([B, A, B]), _gate({A: GIB, B: GIB}))
    _time(decider, A, 100.0, 101.0, 99.0)
    change = decider.decide(_obs(9, A))
    assert change is not None and (change.before, change.after, change.source, change.applied) == (
        A,
        B,
        "scripted",
        True,
    )
    decider.moved(change)
    _time(decider, B, 102.0, 102.5, 102.0)  # 2% better: within the margin
    back = decider.decide(_obs(19, B))
    assert back is not None and (back.source, back.after) == ("measured", A)
    assert back.reason == "measured 102.0 per GiB, not 3% above the 100.0 of the configuration it replaced: back to it"
    decider.moved(back)
    _time(decider, A, 100.0)
    # The source's next proposal of A is where the run is; of B, measured and not better: refused, once.
    assert decider.decide(_obs(29, A)) is None and decider.decide(_obs(39, A)) is None
    assert decider.decide(_obs(49, A)) is None  # the script is spent
    refused = decider.history[-1]
    assert (refused.step, refused.after, refused.applied) == (39, B, False)
    assert refused.reason == "scripted; measured at step 19: 102.0 per GiB, not 3% above this configuration's 100.0"
    assert [c.source for c in decider.history] == ["scripted", "measured", "scripted"]


def _moved_to_b() -> Decider:
    """A run at A (3 timed steps of 100 samples/s, 1 GiB) that moved to B (1 GiB) at step 9."""
    decider = _decider(Scripted([B]), _gate({A: GIB, B: GIB}))
    _time(decider, A, 100.0, 100.0, 100.0)
    change = decider.decide(_obs(9, A))
    assert change is not None and change.after == B
    decider.moved(change)
    return decider


def test_a_trial_clearly_better_is_kept_and_judged_once() -> None:
    decider = _moved_to_b()
    _time(decider, B, 104.0, 104.0, 104.0)  # 4% better
    assert decider.decide(_obs(19, B)) is None
    _time(decider, B, 90.0, 90.0, 90.0, 90.0)  # a slow stint later: the trial was decided once
    assert decider.decide(_obs(29, B)) is None
    assert decider.best is not None and decider.best.config == A  # pooled median of B: 90
    assert [c.source for c in decider.history] == ["scripted"]


def test_a_trial_is_decided_only_on_enough_timed_steps() -> None:
    decider = _moved_to_b()
    _time(decider, B, 50.0, 50.0)  # two steps: not trusted yet
    assert decider.decide(_obs(19, B)) is None
    _time(decider, B, 50.0)
    back = decider.decide(_obs(29, B))
    assert back is not None and back.after == A


def test_side_by_side_trials_alternate_and_judge_the_pairs() -> None:
    decider = _decider(Scripted([B, C]), _gate({A: GIB, B: GIB, C: 2 * GIB}), paired=True)
    _time(decider, A, 100.0, 100.0, 100.0)
    change = decider.decide(_obs(9, A))
    assert change is not None
    decider.moved(change)
    assert decider.trial is not None  # the loop now asks which config each step runs
    ran, current = [], B
    for step in range(10, 30):
        want = decider.trial_config(current)
        current = current if want is None else want
        ran.append(current)
        if len(ran) > 1:  # the first is the candidate's tracked step: not timed
            decider.timed(current, 110.0 if current == B else 100.0)
        if decider.trial_over(step, current) is not None or decider.trial is None:
            break
    # tracked B, then alternating, ending on the candidate with TUNING.paired_steps timed steps each
    assert ran == [B] + [A, B] * TUNING.paired_steps
    assert decider.trial is None and [r.config for r in decider.judged.values()] == [A, B]
    # kept: the next observation reads the candidate's own steps, not the incumbent's beside them
    assert decider.observation(step=29, config=B, b_noise=None, losses=()).throughput == 110.0
    # The next proposal (C: twice the memory) is kept only if it beats B side by side; it does not.
    change = decider.decide(_obs(29, B))
    assert change is not None and change.after == C
    decider.moved(change)
    ran, current = [], C
    for step in range(30, 50):
        want = decider.trial_config(current)
        current = current if want is None else want
        ran.append(current)
        decider.timed(current, 150.0 if current == C else 110.0)  # more samples/s, less per GiB
        back = decider.trial_over(step, current)
        if back is not None:
            break
    assert back is not None and (back.source, back.before, back.after) == ("measured", C, B)
    per_gib = 150.0 / 2
    # C's first step was timed here (a loop that tracks nothing): 5 steps of it against 4
    assert back.reason == (
        f"side by side (5 steps against 4): measured {per_gib:.1f} per GiB, not "
        f"{TUNING.margin:.0%} above the 110.0 of the configuration it replaced beyond their spread: "
        "back to it"
    )


def test_a_trial_within_the_spread_of_its_incumbent_runs_more_steps_then_goes_back() -> None:
    """B's median is 10% above A's (above the margin), but its steps swing by 20 samples/s around
    it (a median absolute deviation of 10): the gap is not larger than the spreads, so the trial
    runs up to TUNING.max_paired_steps of each side, then goes back."""
    decider = _decider(Scripted([B]), _gate({A: GIB, B: GIB}), paired=True)
    _time(decider, A, 100.0, 100.0, 100.0)
    change = decider.decide(_obs(9, A))
    assert change is not None
    decider.moved(change)
    noisy = iter([90.0, 130.0, 110.0, 110.0] * 10)
    ran, current, back = [], B, None
    for step in range(10, 60):
        want = decider.trial_config(current)
        current = current if want is None else want
        ran.append(current)
        if len(ran) > 1:
            decider.timed(current, next(noisy) if current == B else 100.0)
        back = decider.trial_over(step, current)
        if back is not None:
            break
    assert back is not None and (back.before, back.after) == (B, A)
    assert ran == [B] + [A, B] * TUNING.max_paired_steps
    n = TUNING.max_paired_steps
    assert back.reason == (
        f"side by side ({n} steps against {n}): measured 110.0 per "
        "GiB, not 3% above the 100.0 of the configuration it replaced beyond their spread: back to "
        "it"
    )


def test_what_the_loop_cannot_take_is_cut_to_what_it_can() -> None:
    # A framework's loop keeps its micro-batch: only the per-block knobs of a proposal reach it.
    def takes(current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return dataclasses.replace(current, precision=proposed.precision, checkpoint=proposed.checkpoint)

    decider = _decider(Scripted([C, dataclasses.replace(C, checkpoint=True)]), _gate({A: GIB, B: GIB}), takes=takes)
    assert decider.decide(_obs(9, A)) is None  # the split alone: nothing the loop can take
    change = decider.decide(_obs(19, A))
    assert (
        change is not None
        and change.after == B
        and change.reason
        == f"scripted; measured {GIB} B <= budget {4 * GIB} B; split 4x8 not taken: the loop keeps 8x4"
    )


class _Planned(Scripted):
    def plan(self, context: RunContext) -> Proposal | None:
        return Proposal(config=C, reason="planned")


def test_a_refused_plan_is_logged_after_the_start_and_once() -> None:
    gate = _gate({A: GIB, B: GIB, C: 8 * GIB})
    decider = Decider(source=_Planned([C, C]), gate=gate, base_batch_size=32)
    wl = gate.workload
    context = RunContext(
        workload=wl,
        start=B,
        budget=lambda: gate.budget,
        blocks=profile_blocks(wl, micro_batch_size=2),
        device_type="cpu",
        admits=lambda c: gate.admits(c).admitted,
    )
    start = decider.begin(start=B, default=A, why="A is over", context=context)
    assert start == Change(step=0, source="budget", before=A, after=B, applied=True, reason="A is over")
    decider.started(start)
    assert decider.decide(_obs(9, B)) is None and decider.decide(_obs(19, B)) is None
    assert [(c.source, c.after, c.applied) for c in decider.history] == [("budget", B, True), ("scripted", C, False)]
    assert decider.history[1].reason == f"planned; measured {8 * GIB} B > budget {4 * GIB} B"


@pytest.mark.parametrize("source", [None, Scripted([])])
def test_no_source_or_nothing_proposed_keeps_the_run_where_it_is(source: DecisionSource | None) -> None:
    decider = _decider(source, _gate({A: GIB}))
    _time(decider, A, 100.0, 100.0, 100.0)
    assert decider.decide(_obs(9, A)) is None and decider.history == []
    [record] = decider.judged.values()
    assert (record.config, record.timed_steps, record.score.per_gib) == (A, 3, 100.0)


@pytest.mark.parametrize("objective", ["per-gib", "throughput"])
def test_the_configuration_kept_is_the_best_by_the_objective(objective: str) -> None:
    # A: 100 samples/s at 1 GiB (100 per GiB); C: 150 samples/s at 2 GiB (75 per GiB), within the 4 GiB budget.
    decider = _decider(Scripted([C, A]), _gate({A: GIB, C: 2 * GIB}), objective=objective)
    _time(decider, A, 100.0, 100.0, 100.0)
    change = decider.decide(_obs(9, A))
    assert change is not None and change.after == C
    decider.moved(change)
    _time(decider, C, 150.0, 150.0, 150.0)
    verdict = decider.decide(_obs(19, C))
    best = decider.best
    assert best is not None
    if objective == "per-gib":
        assert verdict is not None and (verdict.source, verdict.after) == ("measured", A)
        assert verdict.reason == (
            "measured 75.0 per GiB, not 3% above the 100.0 of the configuration it replaced: back to it"
        )
        assert (best.config, best.score.under("per-gib")) == (A, 100.0)
    else:  # the faster configuration stays, and the source's proposal to go back is refused
        assert verdict is None
        refused = decider.history[-1]
        assert (refused.after, refused.applied) == (A, False)
        assert (
            refused.reason == "scripted; measured at step 9: 100.0 samples/s, not 3% above this configuration's 150.0"
        )
        assert (best.config, best.score.under("throughput")) == (C, 150.0)


def _side_by_side(objective: str, candidate_rate: float) -> tuple[Decider, Change | None]:
    """A run at A (100 samples/s, 1 GiB) trying C (2 GiB) side by side at ``candidate_rate``."""
    decider = _decider(Scripted([C]), _gate({A: GIB, C: 2 * GIB}), paired=True, objective=objective)
    _time(decider, A, 100.0, 100.0, 100.0)
    change = decider.decide(_obs(9, A))
    assert change is not None and change.after == C
    decider.moved(change)
    current, back = C, None
    for step in range(10, 40):
        want = decider.trial_config(current)
        current = current if want is None else want
        decider.timed(current, candidate_rate if current == C else 100.0)
        back = decider.trial_over(step, current)
        if back is not None or decider.trial is None:
            break
    return decider, back


def test_side_by_side_under_throughput_a_faster_trial_within_the_budget_is_kept() -> None:
    # 150 samples/s at 2 GiB: 75 per GiB. Per GiB it goes back; by throughput it stays.
    _, back = _side_by_side("per-gib", 150.0)
    assert back is not None and back.after == A
    decider, back = _side_by_side("throughput", 150.0)
    assert back is None and decider.trial is None and decider.best is not None and decider.best.config == C
    # 101 samples/s is not 3% above 100: back to A, in samples/s.
    _, back = _side_by_side("throughput", 101.0)
    assert back is not None and back.after == A
    assert back.reason == (
        "side by side (5 steps against 4): measured 101.0 samples/s, not 3% above the 100.0 of the configuration "
        "it replaced beyond their spread: back to it"
    )
