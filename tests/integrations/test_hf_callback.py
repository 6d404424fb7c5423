from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
import transformers

from autotune import TrainConfig
from autotune.errors import AutotuneWarning, NonFiniteLossError, NonFiniteLossWarning, UnsupportedError
from autotune.integrations.hf import AutotuneCallback
from autotune.zoo import CORPUS
from tests.adapt.scripted import Scripted


class Spy(transformers.TrainerCallback):  # type: ignore[misc]
    """Records, at each step's end, which blocks run wrapped (after the autotune callback acts)."""

    def __init__(self, blocks: list[str]) -> None:
        self.blocks = blocks
        self.wrapped: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.wrapped.append(sum("forward" in model.get_submodule(b).__dict__ for b in self.blocks))


def _args(output_dir: str, batch: int, max_steps: int, **extra: Any) -> transformers.TrainingArguments:
    """The Trainer's arguments for a short CPU run without reports or progress bars (checkpoints
    only if ``extra`` asks for them)."""
    extra.setdefault("save_strategy", "no")
    return transformers.TrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=batch,
        max_steps=max_steps,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **extra,
    )


def test_the_callback_applies_checkpointing_inside_a_real_trainer(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    blocks = list(wl.block_names())
    config = TrainConfig(micro_batch_size=4, checkpoint=True)
    callback = AutotuneCallback(policy=config, decide_every=2)
    spy = Spy(blocks)
    args = _args(str(tmp_path), 4, 6, logging_steps=1, seed=0)
    trainer = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback, spy])
    result = trainer.train()
    assert trainer.model is wl.model
    assert math.isfinite(result.training_loss)
    # A fixed configuration is the source's plan: on the model before the first step.
    [change] = callback.history
    assert (change.step, change.source, change.applied, change.after.checkpoint) == (0, "fixed", True, True)
    assert spy.wrapped == [len(blocks)] * 6
    assert all("forward" not in m.__dict__ for m in wl.model.modules())  # removed at on_train_end


def test_a_proposal_mid_run_takes_only_what_the_trainer_allows(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    blocks = list(wl.block_names())
    # 2 x 2 recomputed: the Trainer keeps its DataLoader's micro-batch 4, so only the recompute is taken.
    callback = AutotuneCallback(
        policy=Scripted([TrainConfig(micro_batch_size=2, grad_accum_steps=2, checkpoint=True)]), decide_every=2
    )
    spy = Spy(blocks)
    args = _args(str(tmp_path), 4, 4, seed=0)
    transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback, spy]).train()
    [change] = callback.history
    assert (change.step, change.source, change.applied) == (2, "scripted", True)
    assert change.after == TrainConfig(micro_batch_size=4, checkpoint=True, grad_clip=None)
    assert change.reason.startswith("scripted; predicted ") and change.predicted_bytes is not None
    assert change.reason.endswith("; split 2x2 not taken: the loop keeps 4x1")  # what the Trainer forbids, said
    assert spy.wrapped == [0, len(blocks), len(blocks), len(blocks)]  # read at each step's end, after the decision


def test_a_default_over_the_budget_starts_recomputing_every_block(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    blocks = list(wl.block_names())
    callback, spy = AutotuneCallback(policy=None, memory_budget="80%"), Spy(blocks)
    args = _args(str(tmp_path), 8, 2)
    transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback, spy]).train()
    [change] = callback.history
    assert (change.step, change.source, change.applied, change.after.checkpoint) == (0, "budget", True, True)
    assert change.predicted_bytes is not None and change.predicted_bytes * 1.02 <= callback.loop.gate.budget
    assert spy.wrapped == [len(blocks), len(blocks)]


def test_the_default_pretrained_policy_adapts_within_what_the_trainer_allows(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    callback = AutotuneCallback(decide_every=2)  # the shipped policy; on the CPU, its start plan
    args = _args(str(tmp_path), 4, 8, logging_steps=1, seed=0)
    result = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback]).train()
    assert math.isfinite(result.training_loss)
    live = callback.loop
    # The plan (the simulator's best at micro-batch 4) is a change only where it is not the start: on
    # a machine that measures bf16 slow (AVX2, or a busy one) the start may already be it.
    assert live.gate is not None
    for change in live.history:
        assert change.source in ("policy", "measured") and change.reason
        # the Trainer's DataLoader keeps micro-batch 4 and its accumulation: only per-block knobs move
        assert (change.after.micro_batch_size, change.after.grad_accum_steps) == (4, 1)
        assert "fp16" not in change.after.block_precisions(len(wl.block_names()))
        if change.applied:
            assert live.gate.admits(change.after).admitted
    if live.history and live.history[0].step == 0:
        plan = live.history[0]
        assert plan.applied and plan.reason.startswith("the best of the calibrated simulator")
    assert all("forward" not in m.__dict__ for m in wl.model.modules())


def test_a_trainer_resumed_from_a_checkpoint_rebuilds_the_callback_with_its_state(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    config = TrainConfig(micro_batch_size=4, checkpoint=True)

    def train(max_steps: int, callback: AutotuneCallback, **kwargs: Any) -> transformers.Trainer:
        args = _args(
            str(tmp_path),
            4,
            max_steps,
            save_strategy="steps",
            save_steps=4,
            seed=0,
            restore_callback_states_from_checkpoint=True,
        )
        trainer = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback])
        trainer.train(**kwargs)
        return trainer

    first = AutotuneCallback(policy=config, memory_budget="80%", decide_every=2)
    train(4, first)
    # Judged at step 4 over its 3 timed steps (the first after the plan's change pays for it).
    [(judged, timed)] = [(r.config, r.timed_steps) for r in first.loop.decider.judged.values()]  # type: ignore[union-attr]
    assert (judged.checkpoint, timed) == (True, 3)
    assert first.state()["args"] == {
        "policy": config.to_dict(),
        "memory_budget": "80%",
        "decide_every": 2,
        "blocks": None,
        "min_micro_batch": None,
    }
    trainer = train(8, AutotuneCallback(policy=None), resume_from_checkpoint=str(tmp_path / "checkpoint-4"))
    [rebuilt] = [c for c in trainer.callback_handler.callbacks if isinstance(c, AutotuneCallback)]
    assert rebuilt.loop.budget == first.loop.budget and rebuilt.loop.decide_every == 2
    assert rebuilt.history == first.history
    # 3 timed steps before the checkpoint and 3 after it (the first after the resumed plan pays for it).
    assert [(r.config, r.timed_steps) for r in rebuilt.loop.decider.judged.values()] == [(judged, 6)]  # type: ignore[union-attr]


def test_the_objective_is_in_the_checkpoint_s_arguments_when_not_the_default() -> None:
    assert "objective" not in AutotuneCallback(policy=None).state()["args"]
    args = AutotuneCallback(policy=None, objective="throughput").state()["args"]
    assert args["objective"] == "throughput"
    assert AutotuneCallback(**args).loop.objective == "throughput"


def test_progress_off_is_in_the_checkpoint_s_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert "progress" not in AutotuneCallback(policy=None).state()["args"]
    args = AutotuneCallback(policy=None, progress=False).state()["args"]
    assert args["progress"] is False
    AutotuneCallback(**args).loop.note("not said")
    AutotuneCallback(policy=None).loop.note("said")
    assert capsys.readouterr().err == "autotune: said\n"


def test_a_decision_source_object_is_refused_when_the_trainer_rebuilds_the_callback() -> None:
    state = AutotuneCallback(policy=Scripted([])).state()
    assert state["args"]["policy"] == {"source": "scripted"}
    message = (
        "transformers rebuilds AutotuneCallback from its checkpoint's JSON arguments, which cannot hold the "
        "DecisionSource 'scripted': give a policy name, directory or TrainConfig to resume."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(message)}$"):
        AutotuneCallback(**state["args"])


class Poison(transformers.TrainerCallback):  # type: ignore[misc]
    """Before the optimizer step of step ``at`` (0-based), after a snapshot of the weights, the
    optimizer's state and the LR scheduler's: one gradient NaN (runs before the autotune callback)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.snapshot: tuple[list[torch.Tensor], dict[str, Any], dict[str, Any]] | None = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step != self.at:
            return
        model, optimizer, scheduler = kwargs["model"], kwargs["optimizer"], kwargs["lr_scheduler"]
        self.snapshot = (
            [p.detach().clone() for p in model.parameters()],
            copy.deepcopy(optimizer.state_dict()),
            copy.deepcopy(scheduler.state_dict()),
        )
        next(p for p in model.parameters() if p.grad is not None).grad[0] = float("nan")


def _assert_as_snapshot(trainer: transformers.Trainer, poison: Poison, *, lr: bool = True) -> dict[str, Any]:
    """The weights and the optimizer's state bit-identical to the snapshot (its learning rates too
    unless not ``lr``); the scheduler's snapshot."""
    assert poison.snapshot is not None
    params, optimizer, scheduler = poison.snapshot
    assert all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), params, strict=True))
    now = trainer.optimizer.state_dict()
    groups = [{k: v for k, v in g.items() if lr or k != "lr"} for g in now["param_groups"]]
    assert groups == [{k: v for k, v in g.items() if lr or k != "lr"} for g in optimizer["param_groups"]]
    assert now["state"].keys() == optimizer["state"].keys() and len(now["state"]) > 0
    for key, entry in optimizer["state"].items():
        assert all(torch.equal(now["state"][key][k], v) for k, v in entry.items()), key
    return scheduler


NAN_STEP = (
    "step 2: a gradient is not finite under micro x acc x ranks 4x1x1 | fp32 | ckpt none | ZeRO 0 (its update "
    "skipped: the weights and optimizer state are the step before's)"
)


def test_a_nan_gradient_in_a_run_that_decides_stops_it_before_the_optimizer_step(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    poison = Poison(at=2)
    callback = AutotuneCallback(policy=Scripted([]), decide_every=2)
    args = _args(str(tmp_path), 4, 5, seed=0, weight_decay=0.1)
    trainer = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[poison, callback])
    message = f"{NAN_STEP}: an adaptive run stops at a diverged step"
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        trainer.train()
    scheduler = _assert_as_snapshot(trainer, poison)
    assert trainer.lr_scheduler.state_dict() == scheduler  # raised before the scheduler stepped
    assert trainer.state.global_step == 2
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_nan_gradient_in_a_run_without_decisions_is_skipped_and_warned_of(tmp_path: Path) -> None:
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    poison = Poison(at=2)
    callback = AutotuneCallback(policy=None, decide_every=2)
    args = _args(str(tmp_path), 4, 3, seed=0, weight_decay=0.1)
    trainer = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[poison, callback])
    with pytest.warns(NonFiniteLossWarning) as caught:
        trainer.train()
    assert [str(w.message) for w in caught if w.category is NonFiniteLossWarning] == [f"{NAN_STEP}; training goes on"]
    # The last step, step 2, changed no weight and no optimizer state; the scheduler stepped (the lr).
    _assert_as_snapshot(trainer, poison, lr=False)
    assert trainer.state.global_step == 3


class Before(transformers.TrainerCallback):  # type: ignore[misc]
    """Runs before the autotune callback: the model's forward as the Trainer (accelerate) left it."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.forward = model.__dict__.get("forward")


class Runs(transformers.TrainerCallback):  # type: ignore[misc]
    """After the autotune callback: what block 0 really runs in each optimizer step. Its MLP's forward
    is counted on entry (a recompute calls it again in backward, where module hooks do not fire,
    and stops inside it), with the dtype of its output and whether autocast was on; the model's
    own checkpointing flags and autotune's wrappers on the blocks; the model's forward."""

    def __init__(self, blocks: list[str]) -> None:
        self.blocks = blocks
        self.calls: list[tuple[torch.dtype, bool]] = []
        self.entered = 0
        self.per_step: list[int] = []
        self.flags: list[tuple[bool, ...]] = []
        self.wrapped: list[tuple[bool, ...]] = []
        self.forwards: list[Any] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        mlp = model.get_submodule(self.blocks[0]).mlp
        forward = type(mlp).forward

        def counted(*a: Any, **k: Any) -> Any:
            self.entered += 1  # on entry: a recompute stops as soon as it has what backward needs
            out = forward(mlp, *a, **k)
            self.calls.append((out.dtype, torch.is_autocast_enabled("cpu")))
            return out

        self.mlp, mlp.forward = mlp, counted

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.mark = self.entered

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.per_step.append(self.entered - self.mark)
        self.flags.append(tuple(model.get_submodule(b).gradient_checkpointing for b in self.blocks))
        self.wrapped.append(tuple("forward" in model.get_submodule(b).__dict__ for b in self.blocks))
        self.forwards.append(model.__dict__.get("forward"))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        del self.mlp.forward


_CKPT = (
    "activation_checkpointing=True -> every block recomputed (by autotune's wrappers; the model's own flags off "
    "until training ends)"
)
_BF16 = "bf16=True -> outer precision bf16 (the loop's own autocast)"


@pytest.mark.parametrize(
    ("flags", "said", "expected"),
    [
        ({"gradient_checkpointing": True}, _CKPT, TrainConfig(micro_batch_size=4, checkpoint=True, grad_clip=None)),
        (
            {"bf16": True},
            _BF16,
            TrainConfig(micro_batch_size=4, precision="bf16", outer_precision="bf16", grad_clip=None),
        ),
        (
            {"bf16": True, "activation_checkpointing": True},
            f"{_CKPT}; {_BF16}",
            TrainConfig(micro_batch_size=4, precision="bf16", outer_precision="bf16", checkpoint=True, grad_clip=None),
        ),
    ],
    ids=["gradient_checkpointing", "bf16", "both"],
)
def test_the_users_flags_are_the_start_and_what_is_reported_is_what_runs(
    tmp_path: Path, flags: dict[str, bool], said: str, expected: TrainConfig
) -> None:
    from autotune.errors import AutotuneWarning

    wl = _gpt2_tiny()
    blocks = list(wl.block_names())
    callback = AutotuneCallback(policy=None, decide_every=2, memory_budget="1GiB")
    before, runs = Before(), Runs(blocks)
    if "gradient_checkpointing" in flags:  # transformers 5's deprecated name: still what users write
        with pytest.warns(FutureWarning, match="gradient_checkpointing"):
            args = _args(str(tmp_path), 4, 3, seed=0, **flags)
    else:
        args = _args(str(tmp_path), 4, 3, seed=0, **flags)
    trainer = transformers.Trainer(
        model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[before, callback, runs]
    )
    with pytest.warns(AutotuneWarning) as caught:
        trainer.train()
    # Said once, as the history's first change and its state.
    line = f"autotune: starting from your flags: {said}: {expected.describe()}"
    assert [str(w.message) for w in caught if isinstance(w.message, AutotuneWarning)] == [line]
    [change] = callback.history
    assert (change.step, change.source, change.applied, change.after) == (0, "flags", True, expected)
    assert change.before == TrainConfig(micro_batch_size=4, grad_clip=None)
    assert change.reason == f"starting from your flags: {said}"
    assert callback.loop.config == expected
    assert callback.state()["attributes"]["resume_state"]["config"] == expected.to_dict()
    # What runs: one recompute of each block where the config says so (autotune's wrappers, the
    # model's own flags off), one forward where it does not.
    recomputed = expected.checkpoint is True
    assert runs.per_step == [2 if recomputed else 1] * 3
    assert runs.wrapped == [(recomputed, recomputed)] * 3
    assert runs.flags == [(False, False)] * 3
    # Precision: block 0 runs in the Trainer's own bf16 autocast, its forward wrapped by accelerate
    # alone (autotune opens no second outer region around it).
    bf16 = expected.outer_precision == "bf16"
    assert set(runs.calls) == ({(torch.bfloat16, True)} if bf16 else {(torch.float32, False)})
    assert all(f is before.forward for f in runs.forwards)
    assert (before.forward is not None) == bf16
    # At the end the model's own checkpointing is as the Trainer set it.
    assert [wl.model.get_submodule(b).gradient_checkpointing for b in blocks] == [recomputed] * 2
    assert all("forward" not in wl.model.get_submodule(b).__dict__ for b in blocks)


def test_without_flags_the_callback_says_nothing_and_wraps_nothing(tmp_path: Path) -> None:
    wl = _gpt2_tiny()
    blocks = list(wl.block_names())
    callback = AutotuneCallback(policy=None, decide_every=2, memory_budget="1GiB")
    runs = Runs(blocks)
    args = _args(str(tmp_path), 4, 2, seed=0)
    transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback, runs]).train()
    assert callback.history == []
    assert callback.loop.config == TrainConfig(micro_batch_size=4, grad_clip=None)
    assert (runs.per_step, runs.wrapped) == ([1, 1], [(False, False)] * 2)
    assert set(runs.calls) == {(torch.float32, False)}


def _gpt2_tiny() -> Any:
    entry = CORPUS["hf-gpt2"]
    return entry.build(**entry.tiny)


def test_a_budget_object_is_saved_as_the_text_the_callback_is_rebuilt_from() -> None:
    from autotune.units import MemoryBudget

    saved = [
        AutotuneCallback(memory_budget=b).state()["args"]["memory_budget"]
        for b in (MemoryBudget(fraction=0.1), MemoryBudget(bytes=5), "80%", None)
    ]
    assert saved == ["10%", 5, "80%", None]  # a fraction as str(MemoryBudget), bytes as the int


def test_torch_compile_true_yields_a_controller_that_counts_each_change_s_recompile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Trainer's hooks driven one by one on a scripted clock (a real ``torch_compile=True`` run
    would compile for minutes on the CPU: tests/adapt/test_compiled.py's slow test does once)."""
    from autotune.integrations import _framework

    wl = _gpt2_tiny()
    start = TrainConfig(micro_batch_size=4, grad_clip=None)
    recompute = TrainConfig(micro_batch_size=4, checkpoint=True, grad_clip=None)
    callback = AutotuneCallback(policy=Scripted([recompute]), decide_every=2, memory_budget="1GiB")
    args = _args(str(tmp_path), 4, 6, torch_compile=True)
    state, control = transformers.TrainerState(), transformers.TrainerControl()
    loader = torch.utils.data.DataLoader(wl.dataset, batch_size=4)
    with pytest.warns(AutotuneWarning, match=r"the model is compiled \(torch_compile=True\): each change"):
        callback.on_train_begin(args, state, control, model=wl.model, train_dataloader=loader)
    controller = callback.loop.controller
    assert controller is not None and controller.recompiles is not None
    assert (controller.recompiles.horizon, controller.recompiles.seen) == (2, [controller.recompiles.knobs(start)])
    clock = [0.0]
    monkeypatch.setattr(_framework.time, "perf_counter", lambda: clock[0])
    for seconds in [0.5, 0.5, 8.0, 0.5, 0.75, 0.5]:  # the third step, the first recomputed, recompiles
        callback.on_step_begin(args, state, control)
        clock[0] += seconds
        state.global_step += 1
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control, model=wl.model)
    went = [c for c in callback.history if c.applied and c.after == recompute]
    assert [(c.step, c.recompile_seconds) for c in went] == [(2, 7.375)]  # 8.0 - median(0.5, 0.75)
    summary = callback.history[-1]
    assert (summary.step, summary.source, summary.applied) == (6, "compile", False)
    assert summary.reason.startswith("the model is compiled: 1 recompile measured, 7.4 s in all (median 7.4 s), ")
    assert controller.decider.ledger.timed[recompute] == [8.0, 4 / 0.75, 8.0]  # the recompiling step is not timed
    assert all("forward" not in m.__dict__ for m in wl.model.modules())


# torch.compile's first use imports inductor, whose import warns: torch's noise (as in tests/adapt/test_compiled.py).
@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script_method:DeprecationWarning")
def test_a_model_compiled_by_the_user_is_told_without_the_flag(tmp_path: Path) -> None:
    from autotune.integrations.hf import _compiled

    wl = _gpt2_tiny()
    assert _compiled(_args(str(tmp_path), 4, 1), wl.model) is None
    assert _compiled(_args(str(tmp_path), 4, 1, torch_compile=True), wl.model) == "torch_compile=True"
    wl.model.transformer.h[0].compile()  # lazy: nothing compiles until it runs
    assert _compiled(_args(str(tmp_path), 4, 1), wl.model) == "your torch.compile"


def test_on_a_model_loaded_in_bf16_the_policy_keeps_the_trainers_bf16(tmp_path: Path) -> None:
    # Loaded in bf16 (torch_dtype=torch.bfloat16) under bf16=True: no precision knob changes the
    # step, so every change keeps the user's autocast on every block. Before, the plan and the
    # policy moved the blocks to fp32 exceptions (autocast off inside them), priced at 0 samples/s
    # per GiB by an fp32-only simulator.
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    model = wl.model.to(torch.bfloat16)
    callback = AutotuneCallback(decide_every=2)
    args = _args(str(tmp_path), 4, 8, logging_steps=1, seed=0, bf16=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=wl.dataset, callbacks=[callback])
    with pytest.warns(AutotuneWarning, match="^autotune: starting from your flags: bf16=True"):
        result = trainer.train()
    assert math.isfinite(result.training_loss)
    history = callback.loop.history
    assert history[0].source == "flags" and any(c.source == "policy" for c in history)
    assert {(c.after.precision, c.after.outer_precision) for c in history} == {("bf16", "bf16")}
    assert all("(0 samples/s per GiB simulated" not in c.reason for c in history)


def test_the_memory_model_counts_the_trainer_s_own_optimizer(tmp_path: Path) -> None:
    """``optim="adafactor"``: the callback's workload holds the Trainer's Adafactor (inside
    accelerate's wrapper), so its factored state is predicted, not AdamW's two moments."""
    from autotune import predict_memory
    from autotune.optimizers import unwrapped

    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    callback = AutotuneCallback(policy=None, progress=False)
    args = _args(str(tmp_path), 4, 1, optim="adafactor")
    trainer = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback])
    trainer.train()
    workload = callback.loop.gate.workload
    assert workload.optimizer is not None
    assert type(unwrapped(workload.optimizer)) is transformers.optimization.Adafactor
    predicted = predict_memory(workload, TrainConfig(micro_batch_size=4), verify=False).optimizer_state
    adamw = 2 * 4 * sum(p.numel() for p in wl.model.parameters())  # exp_avg and exp_avg_sq, fp32
    assert 0 < predicted < adamw / 4
