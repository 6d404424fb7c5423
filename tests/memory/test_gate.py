"""The budget gate's profile: the modes it takes for the outer precisions a run may train
(:func:`autotune.memory.gate.profile_modes`), and the predictions they give a policy run."""

from __future__ import annotations

import pytest

from autotune import TrainConfig, Workload, load_workload, predict_memory
from autotune.adapt.sources import DecisionSource, Observation, Proposal, outer_in_play
from autotune.memory.gate import BudgetGate, profile_modes
from autotune.units import MemoryBudget

GPT_BATCH = 8


class _Anything(DecisionSource):
    """A user's own source: it may propose anything (the gate profiles as for the policy)."""

    def propose(self, observation: Observation) -> Proposal | None:
        return None


@pytest.mark.parametrize(
    ("reduced", "ranks", "outers", "modes"),
    [
        (False, 1, ("fp32",), ("fp32",)),
        (True, 1, ("fp32",), ("fp32", "bf16")),
        (True, 2, ("fp32",), ("fp32", "bf16", "bf16-weights")),
        (False, 1, ("bf16",), ("fp32@bf16", "bf16@bf16")),
        (True, 1, ("fp32", "bf16"), ("fp32", "bf16", "fp32@bf16", "bf16@bf16")),
        (True, 1, ("bf16", "fp32"), ("fp32@bf16", "bf16@bf16", "fp32", "bf16")),
        (True, 1, ("fp32", "fp16"), ("fp32", "bf16", "fp32@fp16", "fp16@fp16")),
        (False, 1, ("fp32", "fp32"), ("fp32",)),
    ],
)
def test_the_gate_profiles_the_modes_of_each_outer_precision_in_play(
    reduced: bool, ranks: int, outers: tuple[str, ...], modes: tuple[str, ...]
) -> None:
    assert profile_modes(reduced_precision=reduced, ranks=ranks, outers=outers) == modes  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gpt() -> Workload:
    return load_workload("gpt-tiny")


def _gate(wl: Workload, source: DecisionSource | None, default: TrainConfig) -> BudgetGate:
    """The gate an adaptive run over ``source`` builds (adaptive.py's call)."""
    return BudgetGate.build(
        wl,
        MemoryBudget.parse("1GiB"),
        default,
        reduced_precision=source is not None,
        outers=outer_in_play(source, default)[1:],
    )


def test_a_policy_run_s_gate_predicts_the_outer_parts_checked_by_their_own_step(gpt: Workload) -> None:
    from autotune.adapt import decision_source

    default = TrainConfig(micro_batch_size=GPT_BATCH, grad_clip=None)
    policy = decision_source("pretrained")
    assert outer_in_play(policy, default) == outer_in_play(_Anything(), default) == ("fp32", "bf16")
    gate = _gate(gpt, policy, default)
    assert gate.profile is not None and gate.unprofiled is None
    assert tuple(gate.profile.modes) == ("fp32", "bf16", "fp32@bf16", "bf16@bf16")
    assert {v.kind for v in gate.profile.checks} == {"default", "recompute", "bf16", "outer-bf16"}
    for config in (
        TrainConfig(micro_batch_size=GPT_BATCH, precision="bf16", outer_precision="bf16", grad_clip=None),
        TrainConfig(micro_batch_size=GPT_BATCH, outer_precision="bf16", checkpoint=True, grad_clip=None),
    ):
        expected = predict_memory(gpt, config, profile=gate.profile)
        assert expected.verified
        assert gate.predict(config) == (expected.total, True)
        verdict = gate.admits(config)
        assert verdict.admitted and verdict.predicted == expected.total, verdict.reason


def test_a_run_that_cannot_move_the_outer_parts_profiles_none_of_their_modes(gpt: Workload) -> None:
    from autotune.adapt.sources import FixedConfig

    default = TrainConfig(micro_batch_size=GPT_BATCH, grad_clip=None)
    fixed = FixedConfig(TrainConfig(micro_batch_size=GPT_BATCH // 2, grad_accum_steps=2, precision="bf16"))
    gate = _gate(gpt, fixed, default)
    assert gate.profile is not None and tuple(gate.profile.modes) == ("fp32", "bf16")
    outer = TrainConfig(micro_batch_size=GPT_BATCH, outer_precision="bf16", grad_clip=None)
    assert gate.predict(outer) is None
    assert gate.unpredicted(outer) == "the memory profile has no 'fp32@bf16' runs"
