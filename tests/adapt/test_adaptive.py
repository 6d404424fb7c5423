from __future__ import annotations

import copy
import dataclasses
import re
from typing import Any

import numpy as np
import pytest
import torch
from autotune.envs._codec import Levels
from autotune.envs.core import Interval, MachineDescriptor, ModelDescriptor, TuningEnv

from autotune import Knobs, TrainConfig
from autotune.adapt import Adaptive, FixedConfig, Observation, Proposal, RunContext
from autotune.adapt.batch import grow_batch
from autotune.errors import ConfigError, NonFiniteLossError, NonFiniteLossWarning, OverBudgetWarning
from autotune.measurement.record import Measurement, MemoryBreakdown
from autotune.memory.blocks import profile_blocks
from autotune.train.gns import NoiseEstimate
from autotune.workload import Workload
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp
from tests.phase_lines import PHASE

BATCH = 32
BAD_BUDGET = "memory_budget must be bytes (int), a string such as '8GiB' or '75%', or None, but got 1.5."
BAD_POLICY = "policy must be 'pretrained', a policy directory, a TrainConfig, a DecisionSource or None, but got int."


def _user_objects() -> tuple[Workload, torch.optim.Optimizer]:
    wl = make_resmlp()  # seeded: two calls build identical models and data
    return wl, torch.optim.AdamW(wl.model.parameters(), lr=1e-3)


def _tuner(policy: object, **kwargs: object) -> Adaptive:
    """An Adaptive over fresh user objects (the seeded resmlp and its AdamW) at the batch of BATCH."""
    wl, opt = _user_objects()
    return Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=policy, **kwargs)  # type: ignore[arg-type]


def _run(policy: object, steps: int, **kwargs: object) -> tuple[Adaptive, list[float]]:
    tuner = _tuner(policy, **kwargs)
    losses = [tuner.step().loss for _ in range(steps)]
    tuner.close()
    return tuner, losses


def _default_peak() -> int:
    """The default configuration's predicted peak (a 100% budget)."""
    probe = _tuner(policy=None)
    probe.close()
    return probe.budget_bytes


def _fp32(micro: int, checkpoint: bool | tuple[bool, ...] = False) -> TrainConfig:
    return TrainConfig(micro_batch_size=micro, grad_accum_steps=BATCH // micro, checkpoint=checkpoint, grad_clip=None)


def test_the_user_model_and_optimizer_are_the_ones_trained() -> None:
    wl, opt = _user_objects()
    before = [p.detach().clone() for p in wl.model.parameters()]
    tuner = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=_fp32(8, True), decide_every=2)
    for _ in range(4):
        tuner.step()
    tuner.close()
    assert tuner.model is wl.model and tuner.optimizer is opt
    assert tuner.config == _fp32(8, True)  # the fixed config was applied in place
    params = list(wl.model.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, params, strict=True))
    assert all(opt.state[p]["step"] == 4 for p in params)
    assert all("forward" not in m.__dict__ for m in wl.model.modules())  # close() removed every wrapper


def test_fp32_knob_changes_keep_the_loss_trajectory_of_a_fixed_run() -> None:
    script = [_fp32(16), _fp32(8, True), _fp32(32, (True, False, True, False)), _fp32(4)]
    adaptive, changed = _run(Scripted(script), 12, decide_every=2)
    _, fixed = _run(None, 12)
    # Every proposal passed the budget gate (all below the default's peak). A move back from a
    # configuration measured slower per GiB (wall-clock: it may or may not happen) is fp32 too.
    applied = [c.after for c in adaptive.history if c.applied and c.source == "scripted"]
    assert applied == script
    assert {s.config.effective_batch_size for s in adaptive.steps} == {BATCH}
    torch.testing.assert_close(torch.tensor(changed), torch.tensor(fixed), rtol=1e-5, atol=1e-6)


def test_a_budget_below_the_default_peak_is_never_exceeded() -> None:
    budget = int(0.6 * _default_peak())
    default = _fp32(BATCH)
    tuner, _ = _run(FixedConfig(default), 6, memory_budget=budget, decide_every=2, track_memory=True)
    tracked = [s.peak_bytes for s in tuner.steps if s.peak_bytes is not None]
    assert tuner.budget_bytes == budget
    assert tracked and max(tracked) <= budget  # exact MemTracker bytes of real steps
    first, refused = tuner.history[0], tuner.history[1]
    assert first.source == "budget" and first.applied and first.after == tuner.steps[0].config != default
    assert (refused.after, refused.applied, refused.source) == (default, False, "fixed")
    assert len(tuner.history) == 2  # refused once, not at every decision
    assert all(s.config != default for s in tuner.steps)


def test_the_pretrained_policy_keeps_the_effective_batch_and_the_budget() -> None:
    tuner, losses = _run("pretrained", 8, decide_every=2)
    assert all(s.config.effective_batch_size == BATCH for s in tuner.steps)
    assert all(torch.isfinite(torch.tensor(losses)))
    for change in tuner.history:
        assert change.source == "policy" and change.before.effective_batch_size == BATCH
        if change.applied:
            assert tuner.gate.admits(change.after).admitted
    assert all(s.peak_bytes is None or s.peak_bytes <= tuner.budget_bytes for s in tuner.steps)
    # On the CPU the run starts at the calibrated simulator's best (the plan) unless that is where
    # it starts anyway (the simulator's best depends on this machine's measured speeds).
    if tuner.steps[0].config != _fp32(BATCH):
        plan = tuner.history[0]
        assert (plan.step, plan.applied, plan.before, plan.after) == (0, True, _fp32(BATCH), tuner.steps[0].config)
        assert re.match(
            r"the best of the calibrated simulator \(\d+ samples/s per GiB simulated; \d+ s\); "
            "predicted ",
            plan.reason,
        )


def test_the_setup_says_each_phase_with_its_seconds() -> None:
    lines: list[str] = []
    tuner = _tuner("pretrained", decide_every=2, progress=lines.append)
    tuner.close()
    assert all(PHASE.fullmatch(line) for line in lines), lines
    said = [re.sub(r" \([^()]*\d+\.\d s\)$", "", line) for line in lines]  # each without its seconds
    plan = tuner.history[0] if tuner.history else None
    planned = (
        re.escape(plan.after.describe())
        if plan is not None and plan.source == "policy"
        else "nothing fits the memory budget of .*; the run stays"
    )
    expected = [
        # One line per mode as it ends (seconds each at real size: never one silent wait for all).
        *(f"memory model: fake-tensor profile of {mode}" for mode in ("fp32", "bf16", "fp32@bf16", "bf16@bf16")),
        *(
            rf"memory check {kind} on cpu \(micro-batch \d, .*\): predicted .*, verified"
            for kind in ("fp32", "recomputed", "selectively recomputed", "bf16", "outer bf16")
        ),
        "blocks ranked by the activation bytes they save",
        r"machine probe: bf16 \d\.\d\dx fp32's step time, recompute [+-]\d+%",
        *(
            f"start plan: {phase}"
            for phase in (
                "memory of the default configuration",
                "per-block activation bytes",
                "per-block forward time",
                "step times under seven configurations",
                "loss and gradient-noise curves",
                "peak memory of every knob setting \\(memory model\\)",
                "peak memory of every knob setting with the outer parts in bf16 \\(memory model\\)",
                planned,
            )
        ),
    ]
    assert len(said) == len(expected) and all(re.fullmatch(e, s) for e, s in zip(expected, said, strict=True)), said


def test_the_plan_is_the_simulator_s_best_configuration_the_gate_admits(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.policies import transfer

    wl, opt = _user_objects()
    # A machine where bf16 is hopeless, recompute free and a micro-batch costs far more than its
    # samples: the simulator's best is whole-batch micro-batches in fp32, recomputing the blocks
    # whose recompute lowers the peak (the last block's does not: backward rebuilds it at once).
    measured = transfer.quick_profile(wl)
    profile = dataclasses.replace(measured, reduced_slowdown=100.0, recompute_fraction=0.0, micro_fixed_seconds=1.0)
    monkeypatch.setattr(transfer, "quick_profile", lambda workload, progress: profile)
    best = transfer.simulated_best(profile, batch_size=BATCH, admits=lambda k: True)
    assert best is not None
    ranking = profile_blocks(wl).ranked()
    planned = best[0].to_config(ranking, base=_fp32(BATCH))
    assert planned == _fp32(BATCH, (True, True, True, False))
    tuner = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy="pretrained", decide_every=5)
    tuner.close()
    assert [(c.step, c.source, c.after, c.applied) for c in tuner.history] == [(0, "policy", planned, True)]
    assert tuner.config == planned
    # A budget that best does not fit: the plan is the best the gate admits, not a refused one.
    predicted = tuner.gate.predict(planned)
    assert predicted is not None
    tuner = _tuner(policy="pretrained", decide_every=5, memory_budget=predicted[0])
    tuner.close()
    (plan,) = tuner.history
    assert plan.applied and plan.after not in (planned, _fp32(BATCH)) and tuner.gate.admits(plan.after).admitted


def test_the_plan_is_off_on_a_gpu_unless_asked_for() -> None:
    from autotune.adapt.policy_source import PolicySource

    wl, _ = _user_objects()
    source = PolicySource()
    context = RunContext(
        workload=wl,
        start=_fp32(BATCH),
        budget=lambda: 2**30,
        blocks=profile_blocks(wl),
        device_type="cuda",
        admits=lambda c: True,
    )
    assert source.plan(context) is None  # no profile is taken: its copies of the model would take GPU memory
    assert PolicySource(plan=False).plan(dataclasses.replace(context, device_type="cpu")) is None


#: The shipped profile with the selective and outer memory tables, its timed terms set so that a
#: step's time is its micro-batches' (one second each, times the blocks' slowdowns): which knob
#: wins is then a matter of the machine parameters each case sets, not of the calibration's timings.
_PLAN_MACHINES = {
    # bf16 hopeless, a whole block's recompute three times its forward, a selective one free.
    "selective": {"reduced_slowdown": 100.0, "recompute_fraction": 3.0, "selective_fraction": 0.0},
    # bf16 twice as fast as fp32, recompute as dear as the forward (selective too).
    "outer": {"reduced_slowdown": 0.5, "recompute_fraction": 1.0, "selective_fraction": 1.0},
}
_PLAN_TABLES = ("selective_peak_table", "outer_peak_table", "outer_selective_peak_table")


def _planned(
    monkeypatch: pytest.MonkeyPatch,
    machine: str,
    *,
    tables: bool,
    admits: Any = lambda c: True,
    note: Any = lambda line: None,
) -> Proposal | None:
    """The policy source's start plan for a 6-block model at batch 32 on gpt-tiny's profile with
    ``machine``'s parameters (its selective and outer tables dropped unless ``tables``), every
    configuration admitted."""
    from autotune.envs.calibration import load_profile
    from autotune.envs.simulated import PROFILE_DIR
    from autotune.policies import transfer

    from autotune.adapt.policy_source import PolicySource

    shipped = load_profile(PROFILE_DIR / "gpt-tiny.json")
    assert all(getattr(shipped, t) is not None for t in _PLAN_TABLES)
    dropped = {} if tables else dict.fromkeys(_PLAN_TABLES)
    profile = dataclasses.replace(
        shipped,
        step_fixed_seconds=0.0,
        micro_fixed_seconds=1.0,
        micro_seconds_per_sample=0.0,
        **_PLAN_MACHINES[machine],
        **dropped,
    )
    monkeypatch.setattr(transfer, "quick_profile", lambda workload, progress: profile)
    wl = make_resmlp(depth=6)
    context = RunContext(
        workload=wl,
        start=TrainConfig(micro_batch_size=32, grad_clip=None),
        budget=lambda: 2**30,
        blocks=profile_blocks(wl),
        device_type="cpu",
        admits=admits,
        note=note,
    )
    return PolicySource().plan(context)


def test_a_plan_with_nothing_within_the_budget_says_so_and_leaves_the_run_where_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines: list[str] = []
    assert _planned(monkeypatch, "outer", tables=True, admits=lambda c: False, note=lines.append) is None
    assert [line.rpartition(" (")[0] for line in lines] == [
        "start plan: nothing fits the memory budget of 1 GiB; the run stays"
    ]


@pytest.mark.parametrize(
    ("machine", "config", "value"),
    [
        ("selective", TrainConfig(micro_batch_size=32, checkpoint="selective", grad_clip=None), 346),
        (
            "outer",
            TrainConfig(micro_batch_size=32, precision="bf16", checkpoint=True, outer_precision="bf16", grad_clip=None),
            988,
        ),
    ],
)
def test_the_plan_starts_at_selective_recompute_or_the_outer_precision_where_the_simulator_rates_it_best(
    monkeypatch: pytest.MonkeyPatch, machine: str, config: TrainConfig, value: int
) -> None:
    plan = _planned(monkeypatch, machine, tables=True)
    assert plan is not None and plan.config == config
    assert re.fullmatch(
        rf"the best of the calibrated simulator \({value} samples/s per GiB simulated; \d+ s\)", plan.reason
    )


@pytest.mark.parametrize(
    ("machine", "config"),
    [
        # Without the tables a selective block saves nothing and costs its recompute; the outer parts
        # are fp32 to the simulator (a tie that the setting without them wins).
        ("selective", TrainConfig(micro_batch_size=32, grad_clip=None)),
        ("outer", TrainConfig(micro_batch_size=32, precision="bf16", checkpoint=True, grad_clip=None)),
    ],
)
def test_the_plan_never_starts_at_selective_recompute_or_the_outer_precision_without_their_tables(
    monkeypatch: pytest.MonkeyPatch, machine: str, config: TrainConfig
) -> None:
    plan = _planned(monkeypatch, machine, tables=False)
    assert plan is not None and plan.config == config


def test_a_policy_run_s_gate_profiles_the_selective_level_the_policy_moves() -> None:
    from autotune.adapt import decision_source
    from autotune.adapt.adaptive import selective_in_play as from_adaptive
    from autotune.adapt.source_choice import selective_in_play as from_source_choice
    from autotune.adapt.sources import selective_in_play

    assert from_adaptive is from_source_choice is selective_in_play  # one home, importable where it was
    assert selective_in_play(decision_source("pretrained"), _fp32(BATCH), 4)
    assert not selective_in_play(decision_source(_fp32(8)), _fp32(BATCH), 4)
    assert not selective_in_play(None, _fp32(BATCH), 4)


def test_a_run_s_gate_profiles_the_outer_precisions_its_source_may_propose() -> None:
    from autotune.adapt import decision_source
    from autotune.adapt.sources import outer_in_play

    outer = dataclasses.replace(_fp32(8), outer_precision="bf16")
    fp16 = dataclasses.replace(_fp32(BATCH), precision="fp16")
    # The policy moves the outer parts between fp32 and the run's reduced precision (the codec's).
    assert outer_in_play(decision_source("pretrained"), _fp32(BATCH)) == ("fp32", "bf16")
    assert outer_in_play(decision_source("pretrained"), fp16) == ("fp32", "fp16")
    assert outer_in_play(Scripted([]), outer) == ("bf16", "fp32")  # the default's first
    assert outer_in_play(decision_source(_fp32(8)), _fp32(BATCH)) == ("fp32",)
    assert outer_in_play(decision_source(outer), _fp32(BATCH)) == ("fp32", "bf16")
    assert outer_in_play(None, outer) == ("bf16",)


def test_a_fixed_source_without_the_outer_precision_profiles_none_of_its_modes() -> None:
    tuner = _tuner(TrainConfig(micro_batch_size=8, grad_accum_steps=4))
    try:
        assert tuner.gate.profile is not None and tuple(tuner.gate.profile.modes) == ("fp32", "bf16")
        assert tuner.guard.outers == ("fp32",)  # a longer batch is profiled again with the same modes
    finally:
        tuner.close()


def test_a_proposal_with_the_outer_parts_in_bf16_is_trained_not_refused_unpredicted() -> None:
    """End to end on gpt-tiny: a source that proposes the outer parts in bf16 gets a gate that
    predicts it (checked by its own ``outer-bf16`` step), so the run trains it."""
    from autotune import load_workload

    wl = load_workload("gpt-tiny")
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    outer = TrainConfig(micro_batch_size=4, grad_accum_steps=2, precision="bf16", outer_precision="bf16")
    tuner = Adaptive(
        wl.model, opt, wl.loss_fn, wl.dataset, batch_size=8, memory_budget="1GiB", policy=outer, decide_every=2
    )
    try:
        profile = tuner.gate.profile
        assert profile is not None and {"fp32@bf16", "bf16@bf16"} <= set(profile.modes)
        assert "outer-bf16" in {v.kind for v in profile.checks}
        verdict = tuner.gate.admits(tuner.config)
        assert verdict.admitted and verdict.measured is None and verdict.predicted is not None, verdict.reason
        losses = [tuner.step().loss for _ in range(3)]
        assert tuner.config.outer_precision == "bf16" and tuner.config.precision == "bf16"
        assert all(np.isfinite(losses))
        assert tuner.history[0].applied and tuner.history[0].after == tuner.config
    finally:
        tuner.close()


def test_a_model_the_simulator_cannot_profile_starts_without_a_plan_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.policies import transfer

    from autotune.adapt.policy_source import PolicySource
    from autotune.errors import AutotuneWarning, ProposalError

    def fails(workload: Workload, progress: Any) -> Any:
        raise ProposalError("the memory model predicts 55 B, which measured 52 B (more than 5% off)")

    monkeypatch.setattr(transfer, "quick_profile", fails)
    with pytest.warns(AutotuneWarning, match=r"^no start plan: the memory model predicts 55 B, which measured 52 B"):
        tuner = _tuner(policy=PolicySource())
    tuner.close()
    assert tuner.config == _fp32(BATCH) and tuner.history == ()


def test_batch_grows_only_when_the_noise_scale_supports_it() -> None:
    config = _fp32(8)
    obs = Observation(step=4, config=config, throughput=1.0, peak_bytes=1, b_noise=1000.0, losses=(1.0,))
    proposal = grow_batch(obs, base_batch_size=BATCH, min_efficiency=0.9, max_batch_size=8 * BATCH)
    assert proposal is not None and proposal.config == dataclasses.replace(config, grad_accum_steps=8)
    assert proposal.config.lr_multiplier(BATCH) == 2.0  # linear LR scaling follows the batch
    assert proposal.reason == (
        "gradient noise scale 1000 samples: batch 64 keeps 0.970 >= 0.9 of batch 32's per-sample progress; LR x2"
    )
    low = dataclasses.replace(obs, b_noise=10.0)
    assert grow_batch(low, base_batch_size=BATCH, min_efficiency=0.9, max_batch_size=8 * BATCH) is None
    assert grow_batch(obs, base_batch_size=BATCH, min_efficiency=0.9, max_batch_size=BATCH) is None
    unknown = dataclasses.replace(obs, b_noise=None)
    assert grow_batch(unknown, base_batch_size=BATCH, min_efficiency=0.9, max_batch_size=8 * BATCH) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"decide_every": 1}, "decide_every must be an int >= 2, but got 1."),
        ({"batch_size": 0}, "batch_size must be an int >= 1, but got 0."),
        ({"memory_budget": 1.5}, BAD_BUDGET),
        ({"policy": 3}, BAD_POLICY),
        ({"min_efficiency": 0.0}, "min_efficiency must be in (0, 1], but got 0.0."),
        ({"objective": "fast"}, "objective must be one of ('per-gib', 'throughput'), but got 'fast'."),
    ],
)
def test_user_mistakes_are_one_line_config_errors(kwargs: dict[str, object], message: str) -> None:
    wl, opt = _user_objects()
    args = {"batch_size": BATCH, "policy": None} | kwargs
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, **args)  # type: ignore[arg-type]


def test_the_objective_reaches_the_decisions() -> None:
    for objective in ("per-gib", "throughput"):
        tuner = _tuner(policy=None, objective=objective)
        tuner.close()
        assert tuner.decider.objective == objective
    tuner = _tuner(policy=None)
    tuner.close()
    assert tuner.decider.objective == "per-gib"


def test_a_fixed_config_of_another_effective_batch_is_refused() -> None:
    wl, opt = _user_objects()
    message = (
        "FixedConfig's effective batch must be the run's (32), but got 16 "
        "(micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0)."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=TrainConfig(micro_batch_size=16))


def test_a_config_measured_over_the_budget_is_left_at_once() -> None:
    budget = int(0.8 * _default_peak())
    tuner = _tuner(memory_budget=budget, policy=Scripted([_fp32(BATCH)]), decide_every=2, track_memory=True)
    start = tuner.config
    tuner.gate.predict = lambda config: (1, True)  # type: ignore[method-assignment]  # a prediction that lies
    with pytest.warns(OverBudgetWarning) as caught:
        steps = [tuner.step() for _ in range(4)]
    tuner.close()
    applied, reverted = tuner.history[1:]
    assert (applied.after, applied.applied) == (_fp32(BATCH), True)
    assert (reverted.reverted, reverted.applied, reverted.step) == (True, False, 3)
    assert reverted.measured_bytes is not None and reverted.measured_bytes > budget
    assert steps[2].peak_bytes == reverted.measured_bytes  # the one step it ran, tracked
    assert tuner.config == start
    # Said at once and kept: the run did exceed its budget for that step (issue 19).
    (over,) = tuner.over_budget_steps
    assert (over.step, over.config, over.peak_bytes, over.budget_bytes, over.predicted_bytes) == (
        2,
        _fp32(BATCH),
        reverted.measured_bytes,
        budget,
        1,
    )
    message = (
        f"step 2: micro x acc x ranks 32x1x1 | fp32 | ckpt none | ZeRO 0 measured a peak of "
        f"{reverted.measured_bytes} B (predicted 1 B), over the memory budget of {budget} B"
    )
    assert [str(w.message) for w in caught] == [message]


def test_adapt_batch_grows_the_batch_and_scales_the_learning_rate() -> None:
    tuner, _ = _run(None, 8, adapt_batch=True, min_efficiency=0.01, decide_every=4, memory_budget="150%")
    change, after_last_step = tuner.history
    assert (change.step, change.source, change.applied) == (4, "adapt_batch", True)
    assert (after_last_step.step, after_last_step.after.effective_batch_size) == (8, 128)
    assert change.reason.startswith("gradient noise scale ") and "LR x2" in change.reason
    assert [(s.samples, s.lr) for s in tuner.steps] == [(32, 1e-3)] * 4 + [(64, 2e-3)] * 4  # linear scaling


class _Replay(TuningEnv):
    """Replays given intervals: an environment whose reward is computed on chosen measured numbers."""

    def __init__(self, intervals: list[Interval]) -> None:
        super().__init__(horizon=4)
        self.intervals = intervals

    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        model = ModelDescriptor(num_parameters=1, activation_bytes_per_sample=1.0, num_blocks=4, top_quarter_share=0.5)
        return Levels.default_for(BATCH), model, MachineDescriptor(reduced_speed=1.0, budget_ratio=2.0), 2**40

    def _peak_bytes(self, knobs: Levels) -> int:
        return 0

    def _train(self, knobs: Levels) -> Interval:
        return self.intervals.pop(0)


class _Replayed:
    """A study measurer that returns, for each micro-batch size, the numbers Adaptive measured."""

    def __init__(self, numbers: dict[int, tuple[float, int]]) -> None:
        self.numbers = numbers

    def measure(self, config: TrainConfig, **_: object) -> Measurement:
        throughput, peak = self.numbers[config.micro_batch_size]
        memory = MemoryBreakdown(
            parameters=peak, gradients=0, optimizer_state=0, activations=0, temporaries=0, buffers=0, other=0
        )
        return Measurement(
            workload="w",
            config=config,
            device="cpu",
            status="ok",
            reason=None,
            warmup=1,
            steps=1,
            throughput=throughput,
            throughput_p25=throughput,
            throughput_p75=throughput,
            step_seconds=BATCH / throughput,
            memory=memory,
            category_peaks=memory,
            device_peak_bytes=None,
            memory_budget=None,
            noise=NoiseEstimate(b_simple=None, trace_sigma=None, grad_sq_norm=None, sigma2=None, steps=0),
            losses=(1.0,),
            loss_slope=None,
            overflow_steps=0,
            lr=1e-3,
        )


def test_adaptive_the_envs_and_the_study_judge_the_same_numbers_identically() -> None:
    import optuna

    from autotune.search.cache import MeasurementCache
    from autotune.search.results import summarize
    from autotune.search.space import SearchSpace
    from autotune.search.trial import Objective

    tuner, _ = _run(Scripted([_fp32(8)]), 8, decide_every=4, track_memory=True)  # judged at steps 3 and 7
    first, second = tuner.configs
    assert (first.config.micro_batch_size, second.config.micro_batch_size) == (BATCH, 8)
    assert tuner.best is max((first, second), key=lambda r: r.score.per_gib)
    for r in (first, second):
        assert r.score.per_gib == r.score.throughput / (r.score.peak_bytes / 2**30)
        assert r.score.value == r.score.throughput  # the user's batch: throughput, not goodput

    # An environment's reward on the same numbers.
    env = _Replay(
        [
            Interval(
                batch=BATCH,
                throughput=r.score.throughput,
                peak_bytes=r.score.peak_bytes,
                b_noise=None,
                loss=1.0,
                train_seconds=1.0,
                reconfig_seconds=0.0,
            )
            for r in (first, second)
        ]
    )
    env.reset(seed=0)
    _, reward, *_, info = env.step(np.array([1, 1, 1, 1, 0]))
    assert info["reward_terms"]["score"] == second.score.log_per_gib
    assert info["reward_terms"]["score0"] == first.score.log_per_gib
    assert reward == second.score.log_per_gib - first.score.log_per_gib

    # A study that measured the same numbers recommends the same configuration, at the same value.
    space = SearchSpace(batch_sizes=(BATCH,), ranking=(0, 1, 2, 3), max_micro_batch=BATCH)
    numbers = {r.config.micro_batch_size: (r.score.throughput, r.score.peak_bytes) for r in (first, second)}
    objective = Objective(
        space=space,
        measurer=_Replayed(numbers),
        workload=make_resmlp(),
        workload_id="w",
        machine="m",
        cache=MeasurementCache(None),
        memory_budget=None,
        steps=1,
        warmup=1,
        trial_timeout=60.0,
        base_batch_size=BATCH,
    )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"])
    for micro in numbers:
        study.enqueue_trial(space.params(Knobs(batch_size=BATCH, micro_batch_size=micro)))
    study.optimize(objective, n_trials=2)
    recommended = summarize(study).recommended
    assert tuner.best is not None and recommended is not None and recommended.config is not None
    assert recommended.config.micro_batch_size == tuner.best.config.micro_batch_size
    assert recommended.per_gib == tuner.best.score.per_gib


def test_a_configuration_measured_worse_is_left_and_not_entered_again() -> None:
    fast, slow = _fp32(BATCH), _fp32(8)
    # A decision every 5 steps; a proposal's first step is tracked, then it is measured side by side
    # with the configuration it replaced (steps alternating, 4 timed steps each, no decision meanwhile).
    tuner = _tuner(policy=Scripted([slow, slow]), decide_every=5, track_memory=True)
    # Step times by configuration (the steps themselves are real): 8 x 4 takes 100x as long, far
    # more than its smaller peak can make up per GiB.
    real_step = tuner.trainer.step
    seconds = {fast: 0.01, slow: 1.0}

    def step(**kwargs: Any) -> Any:
        return dataclasses.replace(real_step(**kwargs), seconds=seconds[tuner.config])

    tuner.trainer.step = step  # type: ignore[method-assign]
    for _ in range(20):
        tuner.step()
    tuner.close()
    assert [s.config for s in tuner.steps] == [fast] * 5 + [slow] + [fast, slow] * 4 + [fast] * 6
    went, back, again = tuner.history
    assert (went.step, went.source, went.after, went.applied) == (5, "scripted", slow, True)
    assert (back.step, back.source, back.before, back.after, back.applied) == (14, "measured", slow, fast, True)
    assert re.fullmatch(
        r"side by side \(4 steps against 4\): measured [\d.]+ per GiB, not 3% above the [\d.]+ of the "
        "configuration it replaced beyond their spread: back to it",
        back.reason,
    )
    assert (again.step, again.source, again.after, again.applied) == (15, "scripted", slow, False)
    assert again.reason.startswith("scripted; measured at step 14: ")
    # fast: re-judged at step 20 over every step it timed (3 before step 5, 4 in the trial, 6 after it)
    assert [(r.config, r.timed_steps) for r in tuner.configs] == [(fast, 13), (slow, 4)]
    assert tuner.best is not None and tuner.best.config == fast


def test_once_measurement_moved_the_run_back_a_noisier_remeasure_does_not_move_it_again() -> None:
    fast, slow = _fp32(BATCH), _fp32(8)
    tuner = _tuner(policy=Scripted([slow]), decide_every=5, track_memory=True)
    real_step = tuner.trainer.step

    def step(**kwargs: Any) -> Any:
        # Back on ``fast`` from step 14, it now times far slower than ``slow`` did (a busy machine).
        seconds = 1.0 if tuner.config == slow else (0.01 if len(tuner.steps) < 14 else 100.0)
        return dataclasses.replace(real_step(**kwargs), seconds=seconds)

    tuner.trainer.step = step  # type: ignore[method-assign]
    for _ in range(20):
        tuner.step()
    tuner.close()
    assert [s.config for s in tuner.steps] == [fast] * 5 + [slow] + [fast, slow] * 4 + [fast] * 6
    assert [(c.step, c.source, c.after) for c in tuner.history] == [(5, "scripted", slow), (14, "measured", fast)]


def test_a_trial_is_kept_only_if_it_measures_clearly_better_than_the_best() -> None:
    a, b, c = _fp32(BATCH), _fp32(8), _fp32(4)
    tuner = _tuner(policy=Scripted([b, c]), decide_every=5, track_memory=True)
    real_step = tuner.trainer.step
    # Scripted samples/s per GiB of measured peak: b 2% above a (within the 3% margin: a stays the
    # run's configuration, so the run cannot drift on noise), c 10% above (kept).
    per_gib = {a: 1000.0, b: 1020.0, c: 1100.0}

    def step(**kwargs: Any) -> Any:
        peak = tuner.gate.measured.get(tuner.config, 2**30)
        return dataclasses.replace(real_step(**kwargs), seconds=BATCH / (per_gib[tuner.config] * peak / 2**30))

    tuner.trainer.step = step  # type: ignore[method-assign]
    for _ in range(25):
        tuner.step()
    tuner.close()
    trial = [b] + [a, b] * 4  # tracked, then side by side with the configuration it replaced
    assert [s.config for s in tuner.steps] == [a] * 5 + trial + [a] + [c] + [a, c] * 4 + [c]
    assert [(ch.step, ch.source, ch.before, ch.after, ch.applied) for ch in tuner.history] == [
        (5, "scripted", a, b, True),
        (14, "measured", b, a, True),
        (15, "scripted", a, c, True),
    ]
    assert tuner.history[1].reason == (
        "side by side (4 steps against 4): measured 1020.0 per GiB, not 3% above the 1000.0 of the configuration it "
        "replaced beyond their spread: back to it"
    )
    assert tuner.best is not None and tuner.best.config == c


class Planned(Scripted):
    """Scripted proposals, and a start plan."""

    def __init__(self, start: TrainConfig, configs: list[TrainConfig]) -> None:
        super().__init__(configs)
        self.start_at = start

    def plan(self, context: RunContext) -> Proposal | None:
        return Proposal(config=self.start_at, reason="planned")


def test_a_source_s_plan_is_where_the_run_starts_if_the_gate_admits_it() -> None:
    planned = _fp32(8, True)
    tuner = _tuner(policy=Planned(planned, []))
    tuner.step()
    tuner.close()
    [change] = tuner.history
    assert (change.step, change.source, change.before, change.after, change.applied) == (
        0,
        "scripted",
        _fp32(BATCH),
        planned,
        True,
    )
    assert change.reason.startswith("planned; predicted ") and tuner.steps[0].config == planned
    # A plan over the budget is not where the run starts: the budget's start is.
    budget = int(0.6 * _default_peak())
    tuner = _tuner(memory_budget=budget, policy=Planned(_fp32(BATCH), []))
    tuner.close()
    start, refused = tuner.history
    assert start.source == "budget" and tuner.config == start.after != _fp32(BATCH)
    assert (refused.step, refused.source, refused.before, refused.after, refused.applied) == (
        0,
        "scripted",
        start.after,
        _fp32(BATCH),
        False,
    )
    assert refused.reason.startswith("planned; predicted ") and "> budget" in refused.reason


def test_with_nothing_new_from_the_policy_it_proposes_the_close_untried_neighbours_best_simulated_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from autotune.envs._codec import Move, apply_action, knobs_to_config, levels_of
    from autotune.envs.costmodel import step_cost
    from autotune.policies import transfer

    from autotune.adapt.policy_source import _NEIGHBOUR_WITHIN, PolicySource

    wl, opt = _user_objects()
    # Fixed time terms (the memory table is the memory model's): the same simulator on any CPU.
    profile = dataclasses.replace(
        transfer.quick_profile(wl),
        step_fixed_seconds=0.01,
        micro_fixed_seconds=0.002,
        micro_seconds_per_sample=0.001,
        blocks_fraction=0.5,
        reduced_slowdown=0.8,
        recompute_fraction=0.3,
    )
    monkeypatch.setattr(transfer, "quick_profile", lambda workload, progress: profile)
    source = PolicySource()

    class Keep:
        def act(self, observation: np.ndarray) -> np.ndarray:
            return np.array(Move.KEEP.action)  # the action that changes nothing

    source.policy = Keep()
    tuner = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=source, decide_every=5)
    tuner.close()
    here, ranking = tuner.config, profile_blocks(wl).ranked()
    levels = levels_of(here, len(ranking))
    assert levels is not None

    def simulated(config: TrainConfig) -> float:
        lv = levels_of(config, len(ranking))
        assert lv is not None
        cost = step_cost(profile, lv)
        return BATCH / cost.seconds / (cost.peak_bytes / 2**30)

    # The rule, spelled out: one knob moved by one level (as one action moves it), admitted by the
    # budget gate, rated by the simulator at least _NEIGHBOUR_WITHIN of where the run is.
    named = [
        Move.LARGER_MICRO_BATCH,
        Move.SMALLER_MICRO_BATCH,
        Move.LESS_REDUCED_PRECISION,
        Move.MORE_REDUCED_PRECISION,
        Move.LESS_RECOMPUTE,
        Move.MORE_RECOMPUTE,
        Move.LESS_SELECTIVE,
        Move.MORE_SELECTIVE,
        Move.OUTER_FP32,
        Move.OUTER_REDUCED,
    ]
    moves = [tuple(m.action) for m in named]  # as the history prints them
    assert moves == [
        (0, 1, 1, 1, 0, 1, 1),
        (2, 1, 1, 1, 0, 1, 1),
        (1, 1, 0, 1, 0, 1, 1),
        (1, 1, 2, 1, 0, 1, 1),
        (1, 1, 1, 0, 0, 1, 1),
        (1, 1, 1, 2, 0, 1, 1),
        (1, 1, 1, 1, 0, 0, 1),
        (1, 1, 1, 1, 0, 2, 1),
        (1, 1, 1, 1, 0, 1, 0),
        (1, 1, 1, 1, 0, 1, 2),
    ]
    # and a wholly recomputed quarter recomputed selectively instead, and back: one action each
    moves += [(1, 1, 1, 0, 0, 2, 1), (1, 1, 1, 2, 0, 0, 1)]
    moved = [apply_action(levels, m, max_zero_stage=0) for m in moves]
    neighbours = {knobs_to_config(lv, ranking, base=here) for lv in moved} - {here}
    floor = _NEIGHBOUR_WITHIN * simulated(here)
    close = {c for c in neighbours if tuner.gate.admits(c).admitted and simulated(c) >= floor}
    assert close and close != neighbours  # this profile has both kinds around the plan

    obs = Observation(step=5, config=here, throughput=1.0, peak_bytes=1, b_noise=None, losses=(1.0,))
    proposed = []
    while (proposal := source.propose(obs)) is not None:
        assert proposal.reason == f"an untried neighbour ({simulated(proposal.config):.0f} samples/s per GiB simulated)"
        proposed.append(proposal.config)
    assert set(proposed) == close and len(proposed) == len(close)
    values = [simulated(c) for c in proposed]
    assert values == sorted(values, reverse=True)

    # A policy action the simulator rates below the floor is not tried: the best close neighbour is.
    far = next(
        m
        for m, lv in zip(moves, moved, strict=True)
        if lv != levels and simulated(knobs_to_config(lv, ranking, base=here)) < floor
    )

    class Far:
        def act(self, observation: np.ndarray) -> np.ndarray:
            return np.array(far)

    vetted = PolicySource()
    vetted.policy = Far()
    wl, opt = _user_objects()
    Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=vetted, decide_every=5).close()
    proposal = vetted.propose(obs)
    assert proposal is not None and proposal.config == proposed[0]
    target = knobs_to_config(apply_action(levels, far, max_zero_stage=0), ranking, base=here)
    rated = simulated(target) / simulated(here)
    assert proposal.reason == (
        f"policy action {far} rated {rated:.2f} of this configuration on the simulator, not tried; an untried "
        f"neighbour ({values[0]:.0f} samples/s per GiB simulated)"
    )


def test_the_untried_neighbours_are_the_level_tables_and_more_reduced_precision_only_where_it_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from autotune.envs._codec import knobs_to_config, levels_of

    from autotune.adapt.policy_source import PolicySource

    ranking = (0, 1, 2, 3)
    here = knobs_to_config(Levels(accum=1, micro=3, precision=2), ranking)  # 8x2, half the blocks bf16
    levels = levels_of(here, len(ranking))
    assert levels is not None
    obs = Observation(step=5, config=here, throughput=1.0, peak_bytes=1, b_noise=None, losses=(1.0,))

    def proposed(reduced_ok: bool) -> list[Levels]:
        source = PolicySource(plan=False)
        source._context = SimpleNamespace(ranking=ranking, admits=lambda config: True)  # type: ignore[assignment]
        source._profile = object()  # type: ignore[assignment]  # a plan's simulator: the stand-in rates
        source._reduced_ok = reduced_ok
        # Every neighbour within _NEIGHBOUR_WITHIN of here (12 here); more reduced precision rates best.
        monkeypatch.setattr(source, "_simulated", lambda lv, batch: 10.0 + lv.precision)
        out = []
        while (proposal := source._neighbour(obs, levels, "")) is not None:
            moved = levels_of(proposal.config, len(ranking))
            assert moved is not None
            out.append(moved)
        return out

    # One knob one level away (knobs.neighbours through the level tables, the selective level and
    # the outer precision included: the policy moves both): the ZeRO stage stays.
    others = {
        Levels(accum=0, micro=4, precision=2),  # 16x1
        Levels(accum=2, micro=2, precision=2),  # 4x4
        Levels(accum=1, micro=3, precision=2, checkpoint=1),
        Levels(accum=1, micro=3, precision=2, selective=1),  # a quarter recomputed selectively
        Levels(accum=1, micro=3, precision=1),
    }
    more_reduced = {Levels(accum=1, micro=3, precision=3), Levels(accum=1, micro=3, precision=2, outer=True)}
    everything = proposed(reduced_ok=True)
    assert everything[0] == Levels(accum=1, micro=3, precision=3)  # rated best (the stand-in)
    assert set(everything) == others | more_reduced and len(everything) == 7
    # Where the machine probe found no usable bf16: less of it, never more (the outer parts too).
    assert set(proposed(reduced_ok=False)) == others


def test_by_default_only_a_configuration_without_a_verified_prediction_is_tracked() -> None:
    a, b = _fp32(BATCH), _fp32(8, True)
    tuner, _ = _run(Scripted([b]), 6, decide_every=2)
    # The memory model verified its profile on a real step: every prediction is verified, no step
    # is tracked (~8x a step on the CPU), and the configurations are judged by their predictions.
    assert all(s.peak_bytes is None for s in tuner.steps) and tuner.gate.measured == {}
    assert {r.config: r.score.peak_bytes for r in tuner.configs} == {c: tuner.gate.predict(c)[0] for c in (a, b)}  # type: ignore[index]
    # A profile whose check against a real step came further off than the gate's 2% headroom
    # (verified: within 5%) is not trusted: each configuration's first full step is tracked.
    tuner = _tuner(policy=None)
    assert tuner.gate.profile is not None and tuner.gate.profile.verification is not None
    assert tuner.gate.trusts(a)
    checks = tuple(dataclasses.replace(v, relative_error=0.03) for v in tuner.gate.profile.checks)
    tuner.gate.profile = dataclasses.replace(tuner.gate.profile, checks=checks)
    tuner.gate._predicted.clear()  # the memoized estimates hold the check that covered them
    assert tuner.gate.predict(a) is not None and tuner.gate.predict(a)[1] and not tuner.gate.trusts(a)  # type: ignore[index]
    steps = [tuner.step() for _ in range(3)]
    tuner.close()
    assert [s.peak_bytes is not None for s in steps] == [False, True, False]
    # Without a profile nothing is verified: each configuration's first full step is tracked.
    wl, opt = _user_objects()
    tuner = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=None)
    tuner.gate.profile = None
    tuner.gate._predicted.clear()
    steps = [tuner.step() for _ in range(3)]
    tuner.close()
    assert [s.peak_bytes is not None for s in steps] == [False, True, False]
    assert tuner.gate.measured == {a: steps[1].peak_bytes}
    with pytest.raises(
        ConfigError,
        match=r"^track_memory must be 'unverified', True or 'all', False or 'none', "
        r"but got 'some'\.$",
    ):
        Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=BATCH, policy=None, track_memory="some")


def _nan_run(policy: object) -> Adaptive:
    from autotune.resolve import load_workload
    from tests.paths import NAN_WORKLOAD

    wl = load_workload(f"{NAN_WORKLOAD}:build")
    opt = wl.make_optimizer(wl.model.parameters())
    return Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=wl.batch_size, policy=policy, decide_every=2)  # type: ignore[arg-type]


SKIPPED = " (its update skipped: the weights and optimizer state are the step before's)"


def test_a_nan_loss_stops_a_run_that_decides() -> None:
    tuner = _nan_run(Scripted([]))
    message = (
        f"step 0: the loss is nan under micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0{SKIPPED}: an adaptive "
        "run stops at a diverged step"
    )
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        tuner.step()
    tuner.close()
    assert [s.step for s in tuner.steps] == [0]  # the step is recorded


def test_a_nan_loss_in_a_run_without_decisions_warns_once_and_goes_on() -> None:
    tuner = _nan_run(None)
    before = [p.detach().clone() for p in tuner.model.parameters()]
    message = (
        f"step 0: the loss is nan under micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0{SKIPPED}; training "
        "goes on"
    )
    with pytest.warns(NonFiniteLossWarning) as caught:
        steps = [tuner.step() for _ in range(3)]
    tuner.close()
    assert [str(w.message) for w in caught] == [message]
    assert [s.step for s in steps] == [0, 1, 2]
    # Every step skipped: the weights are the initial ones, not NaN.
    assert all(torch.equal(p, q) for p, q in zip(tuner.model.parameters(), before, strict=True))
    assert tuner.optimizer.state_dict()["state"] == {}


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple[list[torch.Tensor], dict[str, Any]]:
    import copy

    return [p.detach().clone() for p in model.parameters()], copy.deepcopy(opt.state_dict())


def _assert_identical(
    model: torch.nn.Module, opt: torch.optim.Optimizer, snapshot: tuple[list[torch.Tensor], dict[str, Any]]
) -> None:
    """Every parameter and every optimizer state tensor bit-identical, the param groups (lr) equal."""
    params, state = snapshot
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), params, strict=True))
    now = opt.state_dict()
    assert now["param_groups"] == state["param_groups"]
    assert now["state"].keys() == state["state"].keys()
    for key, entry in state["state"].items():
        assert entry.keys() == now["state"][key].keys()
        assert all(torch.equal(now["state"][key][k], v) for k, v in entry.items()), key


def _adamw_run(policy: object) -> tuple[Adaptive, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    wl = make_resmlp(n=64)
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-2, weight_decay=0.1)
    tuner = Adaptive(wl.model, opt, wl.loss_fn, wl.dataset, batch_size=16, policy=policy, decide_every=2)  # type: ignore[arg-type]
    x, y = wl.dataset[:64]  # type: ignore[index]
    return tuner, opt, [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]


def test_a_nan_batch_leaves_the_weights_and_the_optimizer_state_as_the_step_before() -> None:
    tuner, opt, batches = _adamw_run(Scripted([]))
    for batch in batches[:2]:
        tuner.step(batch)
    before = _snapshot(tuner.model, opt)
    x, y = batches[2]
    x = x.clone()
    x[5] = float("nan")  # one bad sample: the loss and every gradient are NaN
    message = (
        f"step 2: the loss is nan under micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0{SKIPPED}: an adaptive "
        "run stops at a diverged step"
    )
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        tuner.step((x, y))
    _assert_identical(tuner.model, opt, before)  # what a checkpoint saved now holds
    assert [p.grad for p in tuner.model.parameters()] == [None] * len(before[0])
    assert [s.step for s in tuner.steps] == [0, 1, 2]
    # The next step starts clean: it is the step a run that never saw the NaN batch takes.
    tuner.step(batches[3])
    tuner.close()
    twin, twin_opt, _ = _adamw_run(Scripted([]))
    for batch in (*batches[:2], batches[3]):
        twin.step(batch)
    twin.close()
    _assert_identical(tuner.model, opt, _snapshot(twin.model, twin_opt))


def test_a_finite_loss_with_an_infinite_gradient_is_skipped_too() -> None:
    wl = make_resmlp(n=64)
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-2)

    def loss_fn(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        x, y, *poison = batch  # the dataset's batches (profiled) have no flag
        loss = wl.loss_fn(model, (x, y))
        if poison and poison[0]:  # the loss stays finite, the first parameter's gradient is infinite
            v = next(model.parameters()) * 1.0
            v.register_hook(lambda g: torch.full_like(g, float("inf")))
            loss = loss + v.sum() * 0.0
        return loss

    tuner = Adaptive(wl.model, opt, loss_fn, wl.dataset, batch_size=16, policy=None)  # type: ignore[arg-type]
    x, y = wl.dataset[:32]  # type: ignore[index]
    tuner.step((x[:16], y[:16], False))
    before = _snapshot(tuner.model, opt)
    with pytest.warns(NonFiniteLossWarning) as caught:
        record = tuner.step((x[16:], y[16:], True))
    tuner.close()
    _assert_identical(tuner.model, opt, before)
    assert torch.isfinite(torch.tensor(record.loss))
    message = (
        f"step 1: a gradient is not finite (the loss is {record.loss}) under micro x acc x ranks 16x1x1 | fp32 | "
        f"ckpt none | ZeRO 0{SKIPPED}; training goes on"
    )
    assert [str(w.message) for w in caught] == [message]


def test_the_users_lr_scheduler_sets_the_rate_each_step_runs_at() -> None:
    # StepLR stepped between tuner.step() calls, as in any plain loop: each step runs at the rate
    # the scheduler set, and the weights are those of the same loop without autotune.
    torch.manual_seed(0)
    x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
    data = torch.utils.data.TensorDataset(x, y)
    batches = [(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]

    def loss_fn(model: torch.nn.Module, batch: Any) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    twin = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tuner = Adaptive(model, opt, loss_fn, data, batch_size=16, policy=None)
    rates = []
    for batch in batches:
        rates.append(tuner.step(batch).lr)
        sched.step()
    assert rates == [0.1, 0.05, 0.025, 0.0125]
    twin_opt = torch.optim.SGD(twin.parameters(), lr=0.1)
    twin_sched = torch.optim.lr_scheduler.StepLR(twin_opt, step_size=1, gamma=0.5)
    for batch in batches:
        twin_opt.zero_grad()
        loss_fn(twin, batch).backward()
        twin_opt.step()
        twin_sched.step()
    pairs = zip(model.parameters(), twin.parameters(), strict=True)
    assert all(torch.allclose(p, q, rtol=0, atol=1e-7) for p, q in pairs)


def test_the_gate_profiles_the_selective_runs_only_where_the_run_may_move_there() -> None:
    """A source that may propose a selective block gets a gate whose profile predicts it (checked
    by its own real step, the ``selective`` kind); one that cannot, a profile without those runs."""
    selective = TrainConfig(micro_batch_size=8, grad_accum_steps=4, checkpoint="selective")
    plain = _tuner(TrainConfig(micro_batch_size=8, grad_accum_steps=4))
    try:
        assert plain.gate.profile is not None and plain.gate.profile.modes["fp32"].selective is None
        assert plain.gate.estimate(selective) is None  # measured before it counts
        assert plain.gate.unpredicted(selective) == "the memory profile has no selective runs"
    finally:
        plain.close()
    moving = _tuner(selective)
    try:
        profile = moving.gate.profile
        assert profile is not None and all(m.selective is not None for m in profile.modes.values())
        estimate = moving.gate.estimate(selective)
        assert estimate is not None and estimate.verified
        assert "selective" in {v.kind for v in profile.checks}
    finally:
        moving.close()


def test_a_model_held_in_bf16_moves_no_precision_and_profiles_no_reduced_mode() -> None:
    # Loaded in bf16, the model trains in bf16 whatever a precision knob says. Before, the gate
    # profiled and checked bf16 blocks (the check step raised on the fp32 cast back), the policy's
    # plan could not profile the model ("expected m1 and m2 to have the same dtype"), and the
    # policy moved precision knobs that change nothing.
    wl = make_resmlp()
    model = wl.model.to(torch.bfloat16)

    def loss_fn(m: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return torch.nn.functional.cross_entropy(m(xb.bfloat16()).float().flatten(0, 1), yb.flatten())

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tuner = Adaptive(model, opt, loss_fn, wl.dataset, batch_size=BATCH, policy="pretrained", decide_every=2)
    try:
        for _ in range(8):
            tuner.step()
        profile = tuner.gate.profile
        assert profile is not None and tuple(profile.modes) == ("fp32",)
        assert {v.kind for v in profile.checks} <= {"default", "recompute", "selective"}
        assert tuner.history[0].source == "policy" and tuner.history[0].applied  # the plan: profiled now
        configs = [tuner.config, *(c.after for c in tuner.history)]
        assert {(c.precision, c.outer_precision) for c in configs} == {("fp32", "fp32")}
    finally:
        tuner.close()
