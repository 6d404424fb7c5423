"""A user's compiled model under an adaptive run (autotune.adapt.recompiles): recompiles measured from
injected step seconds, capped below Dynamo's limit, counted in the decisions. The real compile runs
only in the slow test at the end."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from autotune import TrainConfig
from autotune.adapt import BudgetGate
from autotune.adapt.controller import Controller
from autotune.adapt.recompiles import Recompiles, loop_compiled, recompile_limit, user_compiled
from autotune.adapt.records import Change
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp

GIB = 2**30
A = TrainConfig(micro_batch_size=8, grad_accum_steps=4, grad_clip=None)
B = dataclasses.replace(A, checkpoint=True)
C = dataclasses.replace(A, precision="bf16")
SPLIT = TrainConfig(micro_batch_size=4, grad_accum_steps=8, grad_clip=None)  # the same block knobs as A
# torch.compile's first use imports inductor, whose import warns: torch's noise (train/local.py filters it too).
IMPORT_WARNING = r"ignore:.*torch\.jit\.script_method:DeprecationWarning"
MEASURED = "; recompile 11.9 s (its first compiled step over the steady one)"


@pytest.mark.filterwarnings(IMPORT_WARNING)
def test_a_compiled_model_is_told_from_an_eager_one() -> None:
    model = torch.nn.Linear(2, 2)
    assert not user_compiled(model)
    assert user_compiled(torch.compile(model))  # lazy: nothing compiles until it is called
    model.compile()
    assert user_compiled(model)
    assert recompile_limit() == 8  # torch's default


@pytest.mark.filterwarnings(IMPORT_WARNING)
def test_a_framework_loop_s_model_is_compiled_by_its_flag_its_wrapper_or_a_submodule() -> None:
    def model() -> torch.nn.Sequential:
        return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))

    assert not loop_compiled(model())
    assert loop_compiled(model(), flag=True)  # Hugging Face's torch_compile=True: accelerate compiles it later
    lit = model()
    lit._compiler_ctx = {"compiler": "dynamo"}  # type: ignore[assignment]  # Lightning's from_compiled
    assert loop_compiled(lit)
    lit._compiler_ctx = None  # type: ignore[assignment]  # Lightning's to_uncompiled
    assert not loop_compiled(lit)
    inner = model()
    inner[1] = torch.compile(inner[1])  # type: ignore[assignment]
    assert loop_compiled(inner)
    called = model()
    called[0].compile()
    assert loop_compiled(called)
    assert loop_compiled(torch.compile(model()))  # type: ignore[arg-type]


def test_what_the_recompiles_cost_is_one_line() -> None:
    r = Recompiles(num_blocks=4, horizon=50, limit=8)
    r.started(A)
    assert r.describe() == (
        "the model is compiled: no recompile measured; 1 of at most 7 block-knob sets tried "
        "(Dynamo's recompile limit 8)"
    )
    r.moved(A, B, 1)
    r.costs.append(11.875)
    assert r.describe() == (
        "the model is compiled: 1 recompile measured, 11.9 s in all (median 11.9 s), each move's counted against "
        "the seconds it saves; 2 of at most 7 block-knob sets tried (Dynamo's recompile limit 8)"
    )
    r.costs += [2.0, 3.0]
    assert r.describe().startswith("the model is compiled: 3 recompiles measured, 16.9 s in all (median 3.0 s), ")


def test_a_recompile_is_the_first_untracked_step_over_the_steady_ones() -> None:
    r = Recompiles(num_blocks=4, horizon=50, limit=8)
    r.started(A)
    r.moved(A, SPLIT, 3)  # the same block knobs: the wrappers stay, nothing recompiles
    assert r.stepped(SPLIT, 9.0, tracked=False) == (False, None)
    r.moved(SPLIT, B, 4)
    assert r.stepped(B, 5.0, tracked=True) == (False, None)  # tracked: eager under the tracker
    assert r.stepped(B, 12.5, tracked=False) == (True, None)  # compiles: not timed
    assert r.stepped(B, 0.5, tracked=False) == (False, None)
    assert r.stepped(B, 0.75, tracked=False) == (False, (4, 11.875))  # 12.5 - median(0.5, 0.75)
    assert r.stepped(B, 0.5, tracked=False) == (False, None)  # measured once
    assert (r.costs, r.cost, r.seen) == ([11.875], 11.875, [r.knobs(A), r.knobs(B)])


def test_new_block_knob_sets_are_capped_below_the_recompile_limit() -> None:
    r = Recompiles(num_blocks=4, horizon=50, limit=3)
    r.started(A)
    r.moved(A, B, 1)
    assert r.cap == 2
    assert r.refusal(B, C, saved=None) == (
        "the model is compiled: 2 block-knob sets tried, the most below Dynamo's recompile limit (3), "
        "past which it runs the model eagerly"
    )
    assert r.refusal(B, A, saved=None) is None  # tried before: within the cache
    assert r.refusal(A, SPLIT, saved=None) is None  # no recompile


def test_a_move_is_made_only_if_its_gain_pays_the_measured_recompile_back() -> None:
    r = Recompiles(num_blocks=4, horizon=50, limit=8)
    r.started(A)
    r.costs.append(11.875)
    assert r.refusal(A, B, saved=0.25) is None  # 12.5 s saved over 50 steps > 11.875 s
    assert r.refusal(A, B, saved=0.125) == (
        "the model is compiled: the move recompiles (~11.9 s measured) and saves 125.0 ms a step, "
        "6.2 s over the 50 steps to the next decision"
    )
    assert r.refusal(A, B, saved=None) is None  # not measured yet: only the cap applies


class _Loop:
    """The local loop's front-end: takes everything, can switch every step."""

    paired, splits_now = True, True

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        return proposed

    def apply(self, change: Change) -> Change | None:
        return change

    def b_noise(self) -> float | None:
        return None

    def run_stats(self) -> Any:
        return None


def _controller(proposals: list[TrainConfig], recompiles: Recompiles) -> Controller:
    gate = BudgetGate(make_resmlp(n=64), 4 * GIB, profile=None)
    for config in (A, B, C):
        gate.record(config, GIB)
    controller = Controller(
        frontend=_Loop(),
        source=Scripted(proposals),
        gate=gate,
        default=A,
        fraction=None,
        decide_every=4,
        recompiles=recompiles,
    )
    assert controller.begin(gate.workload, device_type="cpu") == A
    return controller


def _steps(controller: Controller, first: int, config: TrainConfig, seconds: list[float]) -> None:
    for i, s in enumerate(seconds, start=first):
        controller.after_step(i, config=config, loss=1.0, throughput=32 / s, seconds=s)


def test_the_controller_measures_a_change_and_does_not_time_its_recompiling_step() -> None:
    controller = _controller([B], Recompiles(num_blocks=4, horizon=4, limit=8))
    assert not controller.decider.paired  # each switch of a side-by-side trial would recompile
    _steps(controller, 0, A, [0.5, 0.5, 0.5, 0.5])  # the decision at step 4 moves to B
    assert controller.config == B
    _steps(controller, 4, B, [12.5, 0.5, 0.75])
    change = controller.history[-1]
    assert change.recompile_seconds == 11.875
    assert change.describe() == (
        f"step 4: applied {B.describe()} (scripted: scripted; measured 1073741824 B <= budget 4294967296 B{MEASURED})"
    )
    assert controller.decider.ledger.timed[B] == [64.0, 32 / 0.75]  # the recompiling step is not B's speed
    assert Change.from_dict(change.to_dict()) == change


def test_going_back_is_made_only_if_it_pays_the_measured_recompile_back() -> None:
    controller = _controller([B], Recompiles(num_blocks=4, horizon=4, limit=8))
    _steps(controller, 0, A, [0.5, 0.5, 0.5, 0.5])
    # B measures as A does: not above it by the margin, so an eager run goes back to A; here going
    # back recompiles (12.5 - median(0.5, 0.625) = 11.9375 s measured) and saves nothing a step: the run stays at B.
    _steps(controller, 4, B, [12.5, 0.5, 0.625, 0.5, 0.5])
    assert controller.config == B
    last = controller.history[-1]
    assert (last.source, last.after, last.applied) == ("measured", A, False)
    assert last.describe().endswith(
        "back to it; the model is compiled: the move recompiles (~11.9 s measured) and saves 0.0 ms a step, "
        "0.0 s over the 4 steps to the next decision)"
    )


@pytest.mark.slow
@pytest.mark.filterwarnings(IMPORT_WARNING)
def test_a_real_compiled_model_through_adaptive_measures_its_recompile() -> None:
    """A compiled 2-block MLP of width 32: the first compile and one recompile, a minute or two on 2 cores."""
    from autotune import Adaptive

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    model = wl.model
    model.compile()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    recompute = TrainConfig(micro_batch_size=8, checkpoint=True)
    run = Adaptive(
        model,
        optimizer,
        wl.loss_fn,
        wl.dataset,
        batch_size=8,
        memory_budget=1 << 40,
        policy=Scripted([recompute]),  # at the first decision (step 2): a change of block knobs
        decide_every=2,
        track_memory=False,
    )
    try:
        assert run.controller.recompiles is not None
        for _ in range(8):
            run.step()
    finally:
        run.close()
    moved = [c for c in run.history if c.applied and c.after.checkpoint and c.step > 0]
    assert moved, [c.describe() for c in run.history]
    assert moved[0].recompile_seconds is not None and moved[0].recompile_seconds > 0
    assert "; recompile " in moved[0].describe()
