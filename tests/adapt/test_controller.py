"""The controller's start search, on scripted verdicts (no model)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from autotune import TrainConfig
from autotune.adapt import BudgetGate, RunContext
from autotune.adapt.controller import Controller
from autotune.adapt.records import Change
from autotune.adapt.saved import check_saved_batch
from autotune.adapt.sources import DecisionSource, Observation, Proposal
from autotune.errors import ConfigError
from autotune.memory.gate import Verdict
from tests.conftest import make_resmlp

UNVERIFIED = "predicted 500 B, but the prediction is unverified and the config was never measured"


class _Loop:
    """A framework's loop: per-block knobs only, no new split before the first step."""

    paired, splits_now = False, False

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return dataclasses.replace(current, precision=proposed.precision, checkpoint=proposed.checkpoint)

    def apply(self, change: Change) -> Change | None:
        return change

    def b_noise(self) -> float | None:
        return None

    def run_stats(self) -> Any:
        return None


class _Gate:
    """The default is over the budget; recompute is small enough but its prediction unverified."""

    budget, headroom = 1000, 0.02

    def __init__(self) -> None:
        self.measured: dict[TrainConfig, int] = {}

    def admits(self, config: TrainConfig) -> Verdict:
        if config.checkpoint:
            return Verdict(admitted=False, reason=UNVERIFIED, predicted=500, measured=None)
        return Verdict(admitted=False, reason="predicted 2000 B > budget 1000 B", predicted=2000, measured=None)


def test_a_start_small_enough_but_unverified_says_so_not_that_the_budget_is_too_small() -> None:
    default = TrainConfig(micro_batch_size=8)
    controller = Controller(frontend=_Loop(), source=None, gate=_Gate(), default=default, fraction=None, decide_every=2)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        controller.start()
    assert str(caught.value) == (
        "no fp32 configuration of batch 8 at the loop's split 8 x 1 is known to fit memory_budget 1000 B: " + UNVERIFIED
    )


class _Small(_Gate):
    """Every configuration predicted over the budget, the recomputed ones least."""

    def admits(self, config: TrainConfig) -> Verdict:
        predicted = 1500 if config.checkpoint else 2000
        return Verdict(
            admitted=False, reason=f"predicted {predicted} B > budget 1000 B", predicted=predicted, measured=None
        )


def test_a_bf16_run_that_fits_nothing_is_told_so_in_its_own_precision_not_fp32() -> None:
    """A Trainer's ``bf16=True`` + ``gradient_checkpointing=True`` under 90% of its own peak: the
    candidates keep the run's precision, and the message names it."""
    default = TrainConfig(
        micro_batch_size=8, grad_accum_steps=2, precision="bf16", outer_precision="bf16", checkpoint=True
    )
    controller = Controller(
        frontend=_Loop(), source=None, gate=_Small(), default=default, fraction=None, decide_every=2
    )  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        controller.start()
    assert str(caught.value) == (
        "memory_budget 1000 B is below every configuration in the run's precision (bf16, outer bf16) of batch 16 "
        "at the loop's split 8 x 2 (smallest predicted peak 1500 B, +2% headroom): raise the budget."
    )


class _Recording(DecisionSource):
    """Keeps the context it started with; proposes nothing."""

    name = "recording"

    def __init__(self) -> None:
        self.context: RunContext | None = None

    def start(self, context: RunContext) -> None:
        self.context = context

    def propose(self, observation: Observation) -> Proposal | None:
        return None


def test_the_run_context_reads_the_gate_budget_after_it_changes() -> None:
    default = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None)
    workload = make_resmlp(n=64)
    gate = BudgetGate(workload, 1500, profile=None)  # no profile: only measured configs pass
    gate.record(default, 1000)
    source = _Recording()
    controller = Controller(frontend=_Loop(), source=source, gate=gate, default=default, fraction=0.5, decide_every=2)
    assert controller.begin(workload, device_type="cpu") == default
    assert source.context is not None and source.context.budget_bytes == 1500
    # A percentage budget is re-based on the default's measured peak (half of 4000 B here).
    controller.peaks.measured(default, 4000)
    assert gate.budget == 2000 and source.context.budget_bytes == 2000
    gate.budget = 3072
    assert source.context.budget_bytes == 3072


class _Unpredictable(_Gate):
    """The memory model failed: no configuration has a prediction."""

    def admits(self, config: TrainConfig) -> Verdict:
        reason = "no memory prediction (cannot profile workload 'w' under fake tensors: X) and not measured"
        return Verdict(admitted=False, reason=reason, predicted=None, measured=None)


def test_a_start_with_no_prediction_says_why_not_none_bytes() -> None:
    default = TrainConfig(micro_batch_size=8)
    controller = Controller(
        frontend=_Loop(), source=None, gate=_Unpredictable(), default=default, fraction=None, decide_every=2
    )  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as caught:
        controller.start()
    assert str(caught.value) == (
        "no fp32 configuration of batch 8 at the loop's split 8 x 1 is known to fit memory_budget 1000 B: "
        "no memory prediction (cannot profile workload 'w' under fake tensors: X) and not measured"
    )


def test_the_gate_says_why_it_has_no_prediction() -> None:
    from autotune import load_workload
    from autotune.errors import PredictionWarning
    from autotune.units import MemoryBudget
    from tests.paths import DATA

    workload = load_workload(f"{DATA / 'data_dependent.py'}:build")
    failed = (
        "cannot profile workload 'data-dependent' under fake tensors: "
        "DataDependentOutputException: aten._local_scalar_dense.default"
    )
    default = TrainConfig(micro_batch_size=8)
    with pytest.warns(PredictionWarning, match="only measured configurations will be admitted"):
        gate = BudgetGate.build(workload, MemoryBudget.parse(1000), default, reduced_precision=False)
    assert gate.admits(default).reason == f"no memory prediction ({failed}) and not measured"
    with pytest.warns(PredictionWarning), pytest.raises(ConfigError) as caught:
        BudgetGate.build(workload, MemoryBudget.parse("75%"), default, reduced_precision=False)
    assert str(caught.value) == (
        "memory_budget as a percentage needs a memory prediction of the default configuration, which failed "
        f"({failed}): give the budget in bytes (e.g. '8GiB')."
    )


def test_check_saved_batch_refuses_another_effective_batch_unless_the_run_adapts_it() -> None:
    here = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    same = TrainConfig(micro_batch_size=16, grad_accum_steps=1)  # another split, the same 16
    other = TrainConfig(micro_batch_size=8, grad_accum_steps=4)
    check_saved_batch(same, here, adapt_batch=False, state="S", run="run", fix="f")
    check_saved_batch(other, here, adapt_batch=True, state="S", run="run", fix="f")
    with pytest.raises(ConfigError) as caught:
        check_saved_batch(other, here, adapt_batch=False, state="S", run="fit", fix="do this")
    assert str(caught.value) == "S state's effective batch must be this fit's (16), but got 32: do this."
