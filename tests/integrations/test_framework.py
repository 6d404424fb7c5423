"""The framework callbacks' shared core, driven step by step (the framework tests run it inside
real ``transformers.Trainer`` and ``lightning.Trainer`` loops: tests/integrations)."""

from __future__ import annotations

import dataclasses
import re
import warnings

import pytest

from autotune import TrainConfig
from autotune.errors import AutotuneWarning, ConfigError
from autotune.integrations import _framework
from autotune.integrations._flags import LoopPrecision
from autotune.integrations._framework import FrameworkLoop
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp

A = TrainConfig(micro_batch_size=8, grad_accum_steps=2, grad_clip=None)
B = dataclasses.replace(A, checkpoint=True)


def test_a_proposal_measured_worse_is_left_for_the_configuration_it_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([B, B]), memory_budget=None, decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp")
    # The loop's clock: a step of A takes 0.1 s, one of B (every block recomputed) 1 s, more than
    # its smaller peak makes up per GiB.
    clock = [0.0]
    monkeypatch.setattr(_framework.time, "perf_counter", lambda: clock[0])
    ran = []
    for step in range(1, 21):
        ran.append(live.config)
        live.step_begin()
        clock[0] += 0.1 if live.config == A else 1.0
        live.step_end(step, loss=1.0)
    assert ran == [A] * 5 + [B] * 5 + [A] * 10
    went, back, again = live.history
    assert (went.step, went.source, went.after, went.applied) == (5, "scripted", B, True)
    assert (back.step, back.source, back.before, back.after, back.applied) == (10, "measured", B, A, True)
    assert re.fullmatch(
        r"measured [\d.]+ per GiB, not 3% above the [\d.]+ of the configuration it replaced: "
        "back to it",
        back.reason,
    )
    assert (again.step, again.after, again.applied) == (15, B, False)
    assert again.reason.startswith("scripted; measured at step 10: ")
    # Judged by the median of each configuration's timed steps (the first after a change left
    # out) and its verified predicted peak: no step is tracked inside a framework's loop.
    a, b = live.decider.judged[A], live.decider.judged[B]  # type: ignore[union-attr]
    assert (a.timed_steps, b.timed_steps) == (13, 4)
    assert (a.score.throughput, b.score.throughput) == pytest.approx((160.0, 16.0))
    assert b.score.peak_bytes == live.gate.predict(B)[0] < a.score.peak_bytes  # type: ignore[union-attr,index]
    live.remove()


def test_on_cuda_the_runs_allocator_ratio_reaches_the_gate_at_each_decision() -> None:
    from tests.measurement.fake_cuda import FakeAllocator

    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([A]), memory_budget=None, decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp")
    assert live.allocator is None and live.gate is not None  # a model on the CPU: no allocator to read
    fake = live.allocator = FakeAllocator(allocated=4_000_000, reserved=5_000_000)
    for step in range(1, 5):
        live.step_end(step, loss=1.0)
    assert live.gate.reserved_ratio is None and fake.devices == []  # read at decisions only
    live.step_end(5, loss=1.0)
    assert live.gate.reserved_ratio == 1.25 and fake.resets == 0  # the user's peak statistics are left alone


@pytest.mark.parametrize("objective", ["per-gib", "throughput"])
def test_the_configuration_kept_follows_the_objective(monkeypatch: pytest.MonkeyPatch, objective: str) -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([B]), memory_budget=None, decide_every=5, blocks=None, objective=objective)  # type: ignore[arg-type]
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp")
    # B (every block recomputed) steps in 0.12 s against A's 0.1 s: 133 samples/s against 160, at
    # a predicted peak a third lower than A's: more per GiB, fewer samples/s.
    assert live.gate is not None and live.gate.predict(A)[0] > 1.5 * live.gate.predict(B)[0]  # type: ignore[index]
    clock = [0.0]
    monkeypatch.setattr(_framework.time, "perf_counter", lambda: clock[0])
    ran = []
    for step in range(1, 16):
        ran.append(live.config)
        live.step_begin()
        clock[0] += 0.1 if live.config == A else 0.12
        live.step_end(step, loss=1.0)
    if objective == "per-gib":
        assert ran == [A] * 5 + [B] * 10 and len(live.history) == 1
    else:
        assert ran == [A] * 5 + [B] * 5 + [A] * 5
        back = live.history[-1]
        assert (back.source, back.after) == ("measured", A)
        assert (
            back.reason
            == "measured 133.3 samples/s, not 3% above the 160.0 of the configuration it replaced: back to it"
        )
    live.remove()


def test_a_plan_is_chosen_among_what_the_loop_can_run_as_it_is() -> None:
    # A Trainer keeps its split (and the user's bf16 autocast owns the outer precision): a plan at
    # another split was admitted at that split, then refused at the loop's ("split 4x2 not taken:
    # the loop keeps 8x1", over the budget there), and the run kept its start.
    from autotune.adapt import RunContext

    seen: list[RunContext] = []

    class Plans(Scripted):
        def start(self, context: RunContext) -> None:
            seen.append(context)

    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Plans([]), memory_budget=None, decide_every=5, blocks=None)
    owned = LoopPrecision(outer="bf16", flag="bf16=True")
    with pytest.warns(AutotuneWarning, match="^autotune: starting from your flags: bf16=True"):
        live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp", precision=owned)
    (context,) = seen
    start = context.start
    assert (start.micro_batch_size, start.grad_accum_steps, start.outer_precision) == (8, 2, "bf16")
    recomputed = dataclasses.replace(start, checkpoint=True)  # less memory, the loop's split
    assert context.admits(recomputed)
    assert not context.admits(dataclasses.replace(recomputed, micro_batch_size=4, grad_accum_steps=4))
    assert not context.admits(dataclasses.replace(recomputed, outer_precision="fp32"))  # the loop's autocast
    live.remove()


def test_an_unknown_objective_is_one_line() -> None:
    message = "objective must be one of ('per-gib', 'throughput'), but got 'speed'."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        FrameworkLoop(policy=None, memory_budget=None, decide_every=5, blocks=None, objective="speed")  # type: ignore[arg-type]


def test_on_a_compiled_model_a_change_s_recompile_is_measured_counted_and_summed_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([B]), memory_budget=None, decide_every=5, blocks=None)
    with pytest.warns(AutotuneWarning) as caught:
        live.begin(
            wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp", compiled="torch_compile=True"
        )
    said = (
        "starting from your flags: the model is compiled (torch_compile=True): each change of per-block knobs "
        "recompiles, measured (its first step over the steady ones) and counted in each decision"
    )
    assert [str(w.message) for w in caught] == [f"autotune: {said}: {A.describe()}"]
    assert live.controller is not None and live.controller.recompiles is not None
    assert live.controller.recompiles.horizon == 5
    # The loop's clock: A steps in 0.1 s, B (every block recomputed) in 1 s, and B's first step
    # recompiles: 6 s, 5 s over its steady steps.
    clock = [0.0]
    monkeypatch.setattr(_framework.time, "perf_counter", lambda: clock[0])
    seconds = {A: [0.1] * 5, B: [6.0] + [1.0] * 9}
    for step in range(1, 16):
        live.step_begin()
        clock[0] += seconds[live.config].pop(0)
        live.step_end(step, loss=1.0)
    live.finish(15)
    flags, went, back, summary = live.history
    assert (flags.source, flags.reason, flags.recompile_seconds) == ("flags", said, None)
    assert (went.step, went.after, went.applied, went.recompile_seconds) == (5, B, True, 5.0)
    # An eager loop goes back to A (test above); here going back recompiles too, and the 0.9 s a
    # step it saves over the 5 steps to the next decision do not pay the 5 s back: the run stays.
    assert (back.step, back.source, back.after, back.applied) == (10, "measured", A, False)
    assert back.reason.endswith(
        "back to it; the model is compiled: the move recompiles (~5.0 s measured) and saves 900.0 ms a step, "
        "4.5 s over the 5 steps to the next decision"
    )
    assert live.config == B
    assert (summary.step, summary.source, summary.applied, summary.after) == (15, "compile", False, B)
    assert summary.reason == (
        "the model is compiled: 1 recompile measured, 5.0 s in all (median 5.0 s), each move's counted against "
        "the seconds it saves; 2 of at most 7 block-knob sets tried (Dynamo's recompile limit 8)"
    )
    live.remove()


def test_an_eager_model_counts_no_recompiles_and_notes_none(monkeypatch: pytest.MonkeyPatch) -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([B]), memory_budget=None, decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp")
    assert live.controller is not None and live.controller.recompiles is None
    clock = [0.0]
    monkeypatch.setattr(_framework.time, "perf_counter", lambda: clock[0])
    for step in range(1, 8):
        live.step_begin()
        clock[0] += 6.0 if step == 6 else 0.1
        live.step_end(step, loss=1.0)
    live.finish(7)
    [went] = live.history
    assert (went.after, went.recompile_seconds) == (B, None)
    live.remove()


@pytest.mark.parametrize(
    ("precision", "modes"),
    [
        # The loop opens no autocast: a source may move the outer parts to bf16, so the gate predicts them.
        (None, ("fp32", "bf16", "fp32@bf16", "bf16@bf16")),
        # bf16=True: the loop's own autocast pins the outer precision (``takes``): only its modes.
        (LoopPrecision(outer="bf16", flag="bf16=True"), ("fp32", "fp32@bf16", "bf16@bf16")),
    ],
)
def test_the_gate_profiles_the_outer_precisions_the_loop_lets_a_source_move_to(
    precision: LoopPrecision | None, modes: tuple[str, ...]
) -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=Scripted([]), memory_budget=None, decide_every=5, blocks=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AutotuneWarning)  # the flags' start line
        live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp", precision=precision)
    try:
        assert live.gate is not None and live.gate.profile is not None
        assert tuple(live.gate.profile.modes) == modes
        outer = dataclasses.replace(live.config, precision="bf16", outer_precision="bf16")
        assert live.gate.admits(outer).predicted is not None  # predicted either way, never refused unpredicted
    finally:
        live.remove()
