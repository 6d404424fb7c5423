from __future__ import annotations

import copy
import math
import re
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

pytest.importorskip("lightning")

import lightning as L

from autotune import TrainConfig
from autotune.block_detection import find_blocks
from autotune.errors import AutotuneWarning, NonFiniteLossError, NonFiniteLossWarning
from autotune.integrations.lightning import AutotuneCallback
from autotune.zoo import CORPUS
from tests.integrations.lightning_trainer import quiet_trainer

pytestmark = [
    # Lightning's advice for real runs (DataLoader workers, logging intervals), irrelevant to a tiny fit.
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    # Lightning 2.6's own pytree code on torch 2.13 (torch deprecated LeafSpec): not ours to fix.
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
]


class LitLM(L.LightningModule):  # type: ignore[misc]
    def __init__(self, net: torch.nn.Module, loss_fn: Any) -> None:
        super().__init__()
        self.net, self.loss_fn = net, loss_fn

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.loss_fn(self.net, batch)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Spy(L.Callback):  # type: ignore[misc]
    def __init__(self, blocks: list[str]) -> None:
        self.blocks, self.wrapped = blocks, []

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.wrapped.append(sum("forward" in module.get_submodule(b).__dict__ for b in self.blocks))


def test_the_callback_applies_checkpointing_inside_a_real_fit() -> None:
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module = LitLM(wl.model, wl.loss_fn)
    blocks = list(find_blocks(module))
    # accumulation 2 x micro-batch 4: the fixed config's effective batch is the fit's
    callback = AutotuneCallback(
        policy=TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=True), decide_every=2
    )
    spy = Spy(blocks)
    trainer = quiet_trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[callback, spy])
    with pytest.warns(AutotuneWarning) as caught:
        trainer.fit(module, torch.utils.data.DataLoader(wl.dataset, batch_size=4))
    assert trainer.lightning_module is module
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))
    # the fixed configuration is the source's plan: recomputed from the first of the 8 micro-batches
    change, fixed = callback.history
    assert (change.step, change.source, change.applied, change.after.checkpoint) == (0, "fixed", True, True)
    # LitLM has no batch_size attribute: the split cannot change, said once and logged refused
    reason = (
        "the split cannot change in this fit: the LightningModule (its hparams, its datamodule) has no batch_size "
        "attribute for train_dataloader() to read"
    )
    assert (fixed.step, fixed.source, fixed.applied, fixed.before, fixed.after) == (
        0,
        "lightning",
        False,
        change.after,
        change.after,
    )
    assert fixed.reason == reason
    assert [str(w.message) for w in caught if isinstance(w.message, AutotuneWarning)] == [
        f"AutotuneCallback: {reason}; only per-block knobs will change"
    ]
    assert spy.wrapped == [len(blocks)] * 8
    assert all("forward" not in m.__dict__ for m in module.modules())


class LitBatched(LitLM):
    """Reads its micro-batch from ``self.batch_size`` in ``train_dataloader``: what Lightning's
    ``BatchSizeFinder`` and this callback's split change rely on."""

    def __init__(self, net: torch.nn.Module, loss_fn: Any, dataset: Any, batch_size: int) -> None:
        super().__init__(net, loss_fn)
        self.dataset, self.batch_size = dataset, batch_size

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size)  # no shuffle: same order


def _lstm_at_8() -> tuple[Any, LitBatched, AutotuneCallback]:
    """Tiny lstm-lm (64 samples: 8 optimizer steps of 8 per epoch), a callback that moves it to 4 x 2."""
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)  # seeded: every call builds the same initial weights
    module = LitBatched(wl.model, wl.loss_fn, wl.dataset, batch_size=8)
    callback = AutotuneCallback(policy=TrainConfig(micro_batch_size=4, grad_accum_steps=2), decide_every=2)
    return wl, module, callback


def _fit(module: L.LightningModule, callbacks: list[Any], max_steps: int = -1, **kwargs: Any) -> L.Trainer:
    trainer = quiet_trainer(max_epochs=2, max_steps=max_steps, callbacks=callbacks)
    trainer.fit(module, **kwargs)
    return trainer


def test_the_split_changes_at_the_epoch_boundary_and_the_training_maths_stay() -> None:
    _, fixed, _ = _lstm_at_8()
    _fit(fixed, [])
    _, module, callback = _lstm_at_8()  # the same seeded initial weights
    trainer = _fit(module, [callback])
    # planned before the first step, applied when epoch 1 began (after 8 steps), undone nowhere
    [change] = callback.history
    after = change.after
    assert (change.step, change.applied, after.micro_batch_size, after.grad_accum_steps) == (8, True, 4, 2)
    assert (module.batch_size, trainer.accumulate_grad_batches, trainer.reload_dataloaders_every_n_epochs) == (4, 2, 0)
    assert trainer.train_dataloader.batch_size == 4 and trainer.global_step == 16
    # 8 x 1 then 4 x 2 trains the very weights 8 x 1 throughout does (the same 8 samples per step)
    for a, b in zip(module.parameters(), fixed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_a_dataloader_that_ignores_batch_size_keeps_the_split() -> None:
    wl, module, callback = _lstm_at_8()
    # a DataLoader handed to fit() is reloaded as it is: the new batch size cannot reach it
    trainer = _fit(module, [callback], train_dataloaders=torch.utils.data.DataLoader(wl.dataset, batch_size=8))
    [change] = callback.history
    assert (change.step, change.applied) == (8, False)
    assert change.reason.endswith("the loop's DataLoader kept micro-batch 8, so the split stays as it is")
    assert (module.batch_size, trainer.accumulate_grad_batches, callback.loop.split) == (8, 1, False)


def test_a_split_change_the_fit_never_reaches_is_logged_refused_and_undone() -> None:
    _, module, callback = _lstm_at_8()
    trainer = _fit(module, [callback], max_steps=8)  # stops at the end of the first epoch
    [change] = callback.history
    assert (change.step, change.applied) == (8, False)
    assert change.reason.endswith("the run ended before the next epoch boundary")
    assert (module.batch_size, trainer.reload_dataloaders_every_n_epochs, callback.loop.pending) == (8, 0, None)


def test_the_default_pretrained_policy_adapts_within_the_budget() -> None:
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module = LitBatched(wl.model, wl.loss_fn, wl.dataset, batch_size=8)
    callback = AutotuneCallback(decide_every=2)  # the shipped policy; on the CPU, its start plan
    trainer = _fit(module, [callback])
    assert math.isfinite(float(trainer.callback_metrics["train_loss"]))
    live = callback.loop
    assert live.gate is not None and live.history
    for change in live.history:
        assert change.source in ("policy", "measured") and change.after.effective_batch_size == 8
        if change.applied:
            assert live.gate.admits(change.after).admitted
    assert (module.batch_size * trainer.accumulate_grad_batches, live.pending) == (8, None)
    assert all("forward" not in m.__dict__ for m in module.modules())


def test_a_fit_resumed_from_a_checkpoint_resumes_the_callback_s_configuration_and_history(tmp_path: Any) -> None:
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module = LitLM(wl.model, wl.loss_fn)
    fixed = TrainConfig(micro_batch_size=8, checkpoint=True)
    callback = AutotuneCallback(policy=fixed, decide_every=2)
    loader = torch.utils.data.DataLoader(wl.dataset, batch_size=8)
    with pytest.warns(AutotuneWarning, match="^AutotuneCallback: the split cannot change in this fit: "):
        trainer = _fit(module, [callback], max_steps=4, train_dataloaders=loader)
    trainer.save_checkpoint(tmp_path / "fit.ckpt")
    assert callback.state_key == "autotune.AutotuneCallback"
    # Resumed with no decision source: only the restored state can put checkpointing back on.
    resumed = AutotuneCallback(policy=None, decide_every=2)
    spy = Spy(list(find_blocks(module)))
    _fit(
        LitLM(entry.build(**entry.tiny).model, wl.loss_fn),
        [resumed, spy],
        max_steps=8,
        train_dataloaders=loader,
        ckpt_path=tmp_path / "fit.ckpt",
    )
    assert resumed.loop.config == callback.loop.config and resumed.loop.config.checkpoint is True
    # the plan, and the refused split (LitLM has no batch_size), logged once across the resume
    assert resumed.history == callback.history and len(resumed.history) == 2
    assert spy.wrapped == [len(spy.blocks)] * 4  # every resumed step recomputed every block


class SGDLM(LitLM):
    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def test_the_memory_model_counts_the_fit_s_own_optimizer() -> None:
    """configure_optimizers' SGD with momentum: one buffer per parameter predicted, not AdamW's two."""
    from autotune import predict_memory

    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module = SGDLM(wl.model, wl.loss_fn)
    callback = AutotuneCallback(policy=None, progress=False)
    trainer = quiet_trainer(max_steps=1, callbacks=[callback])
    trainer.fit(module, torch.utils.data.DataLoader(wl.dataset, batch_size=4))
    workload = callback.loop.gate.workload
    assert workload.optimizer is trainer.optimizers[0]
    predicted = predict_memory(workload, TrainConfig(micro_batch_size=4), verify=False).optimizer_state
    assert predicted == 4 * sum(p.numel() for p in module.parameters())  # fp32 momentum buffers


def test_the_objective_reaches_the_loop() -> None:
    assert AutotuneCallback(policy=None).loop.objective == "per-gib"
    assert AutotuneCallback(policy=None, objective="throughput").loop.objective == "throughput"


class Poison(L.Callback):  # type: ignore[misc]
    """Before the optimizer step of step ``at`` (0-based), after a snapshot of the weights and the
    optimizer's state: one gradient NaN (runs before the autotune callback)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.snapshot: tuple[list[torch.Tensor], dict[str, Any]] | None = None

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        if trainer.global_step != self.at:
            return
        self.snapshot = ([p.detach().clone() for p in module.parameters()], copy.deepcopy(optimizer.state_dict()))
        next(p for p in module.parameters() if p.grad is not None).grad[0] = float("nan")


def _assert_as_snapshot(trainer: L.Trainer, module: L.LightningModule, poison: Poison) -> None:
    assert poison.snapshot is not None
    params, optimizer = poison.snapshot
    assert all(torch.equal(p, q) for p, q in zip(module.parameters(), params, strict=True))
    now = trainer.optimizers[0].state_dict()
    assert now["param_groups"] == optimizer["param_groups"]
    assert now["state"].keys() == optimizer["state"].keys() and len(now["state"]) > 0
    for key, entry in optimizer["state"].items():
        assert all(torch.equal(now["state"][key][k], v) for k, v in entry.items()), key


NAN_STEP = (
    "step 2: a gradient is not finite under micro x acc x ranks 8x1x1 | fp32 | ckpt none | ZeRO 0 (its update "
    "skipped: the weights and optimizer state are the step before's)"
)


def test_a_nan_gradient_in_a_fit_that_decides_stops_it_before_the_optimizer_step() -> None:
    from tests.adapt.scripted import Scripted

    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module, poison = LitBatched(wl.model, wl.loss_fn, wl.dataset, batch_size=8), Poison(at=2)
    callback = AutotuneCallback(policy=Scripted([]), decide_every=2)
    message = f"{NAN_STEP}: an adaptive run stops at a diverged step"
    with pytest.raises(NonFiniteLossError, match=f"^{re.escape(message)}$"):
        _fit(module, [poison, callback], max_steps=4)
    _assert_as_snapshot(module.trainer, module, poison)
    assert all(p.grad is None for p in module.parameters())


def test_a_nan_gradient_in_a_fit_without_decisions_is_skipped_and_warned_of() -> None:
    entry = CORPUS["lstm-lm"]
    wl = entry.build(**entry.tiny)
    module, poison = LitBatched(wl.model, wl.loss_fn, wl.dataset, batch_size=8), Poison(at=2)
    callback = AutotuneCallback(policy=None, decide_every=2)
    with pytest.warns(NonFiniteLossWarning) as caught:
        trainer = _fit(module, [poison, callback], max_steps=3)
    assert [str(w.message) for w in caught if w.category is NonFiniteLossWarning] == [f"{NAN_STEP}; training goes on"]
    _assert_as_snapshot(trainer, module, poison)  # the last step, step 2, changed nothing
    assert trainer.global_step == 3


class Runs(L.Callback):  # type: ignore[misc]
    """After the autotune callback: block 0's MLP forward counted on entry per optimizer step (a
    recompute calls it again in backward and stops inside it), with its output's dtype and whether
    autocast was on; the model's own checkpointing flags; whether anything wrapped the model's forward."""

    def __init__(self, blocks: list[str]) -> None:
        self.blocks = blocks
        self.calls: list[tuple[torch.dtype, bool]] = []
        self.entered, self.mark = 0, 0
        self.per_step: list[int] = []
        self.flags: list[tuple[bool, ...]] = []
        self.outer: list[bool] = []

    def on_train_start(self, trainer: Any, module: Any) -> None:
        mlp = module.get_submodule(self.blocks[0]).mlp
        forward = type(mlp).forward

        def counted(*a: Any, **k: Any) -> Any:
            self.entered += 1
            out = forward(mlp, *a, **k)
            self.calls.append((out.dtype, torch.is_autocast_enabled("cpu")))
            return out

        self.mlp, mlp.forward = mlp, counted

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.mark = self.entered

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.per_step.append(self.entered - self.mark)
        self.flags.append(tuple(module.get_submodule(b).gradient_checkpointing for b in self.blocks))
        self.outer.append(any("forward" in m.__dict__ for m in (module, module.net)))

    def on_train_end(self, trainer: Any, module: Any) -> None:
        del self.mlp.forward


def test_a_bf16_mixed_fit_starts_from_its_flags_and_runs_what_it_reports() -> None:
    pytest.importorskip("transformers")
    entry = CORPUS["hf-gpt2"]
    wl = entry.build(**entry.tiny)
    wl.model.activation_checkpointing_enable()  # by hand, inside the LightningModule
    module = LitLM(wl.model, wl.loss_fn)
    blocks = list(find_blocks(module))
    callback = AutotuneCallback(policy=None, decide_every=2, memory_budget="1GiB")
    runs = Runs(blocks)
    trainer = quiet_trainer(max_steps=3, precision="bf16-mixed", callbacks=[callback, runs])
    with pytest.warns(AutotuneWarning) as caught:
        trainer.fit(module, torch.utils.data.DataLoader(wl.dataset, batch_size=4))
    expected = TrainConfig(
        micro_batch_size=4, precision="bf16", outer_precision="bf16", checkpoint=True, grad_clip=None
    )
    said = (
        "the model's own activation checkpointing -> every block recomputed (by autotune's wrappers; the model's own "
        "flags off until training ends); precision='bf16-mixed' -> outer precision bf16 (the loop's own autocast)"
    )
    assert [str(w.message) for w in caught if isinstance(w.message, AutotuneWarning)] == [
        f"autotune: starting from your flags: {said}: {expected.describe()}"
    ]
    [change] = callback.history
    assert (change.source, change.after, change.reason) == ("flags", expected, f"starting from your flags: {said}")
    assert callback.state_dict()["config"] == expected.to_dict()
    # What runs: one recompute per step by autotune's wrappers alone, in the plugin's bf16 autocast,
    # and no second outer region around the module's forward.
    assert runs.per_step == [2, 2, 2]
    assert runs.flags == [(False, False)] * 3
    assert set(runs.calls) == {(torch.bfloat16, True)}
    assert runs.outer == [False] * 3
    assert wl.model.is_activation_checkpointing  # given back at the end


class LitPlain(LitLM):
    """No ``self.log`` in the step: Lightning's log reads the step's signature, which Dynamo fails to
    trace on torch 2.12+ with or without the callback (Lightning-AI/pytorch-lightning#21836)."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.loss_fn(self.net, batch)
        return loss


# torch.compile's first use imports inductor, whose import warns: torch's noise (as in tests/adapt/test_compiled.py).
@pytest.mark.slow  # a real fit with Dynamo: about 8 s on 2 cores
@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script_method:DeprecationWarning")
def test_a_compiled_module_s_fit_measures_and_counts_each_change_s_recompile() -> None:
    """``trainer.fit(torch.compile(module))`` really compiled, with Dynamo's ``eager`` backend
    (Dynamo's guards and recompiles without inductor's code generation: seconds, not minutes)."""
    from tests.adapt.scripted import Scripted
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    module = LitPlain(wl.model, wl.loss_fn)
    recompute = TrainConfig(micro_batch_size=8, checkpoint=True, grad_clip=None)
    callback = AutotuneCallback(policy=Scripted([recompute]), decide_every=4, memory_budget=1 << 40)
    trainer = quiet_trainer(max_steps=8, callbacks=[callback])
    with pytest.warns(AutotuneWarning) as caught:
        trainer.fit(torch.compile(module, backend="eager"), torch.utils.data.DataLoader(wl.dataset, batch_size=8))
    assert trainer.lightning_module is module and module._compiler_ctx is not None
    controller = callback.loop.controller
    assert controller is not None and controller.recompiles is not None
    said = [str(w.message) for w in caught if isinstance(w.message, AutotuneWarning)]
    assert said[0].startswith(
        "autotune: starting from your flags: the model is compiled (your torch.compile): each change of per-block "
        "knobs recompiles, measured (its first step over the steady ones) and counted in each decision: "
    )
    # Step 4 moves to recompute: step 5 recompiles, steps 6 and 7 are its steady steps, measured at step 7.
    [went] = [c for c in callback.history if c.applied and c.after == recompute]
    assert went.step == 4 and went.recompile_seconds is not None and went.recompile_seconds >= 0.0
    assert controller.recompiles.costs == [went.recompile_seconds]
    summary = callback.history[-1]
    assert (summary.step, summary.source, summary.applied) == (8, "compile", False)
    assert summary.reason.startswith(
        f"the model is compiled: 1 recompile measured, {went.recompile_seconds:.1f} s in all "
        f"(median {went.recompile_seconds:.1f} s), each move's counted against the seconds it saves; "
    )
    # The blocks' wrappers are off (the module's own forward is Lightning's compiled one: its __dict__).
    assert all("forward" not in m.__dict__ for m in module.net.modules())


class LitLoggedEager(LitLM):
    """``self.log`` kept out of the compiled step, as docs/integrating.md advises until Lightning's
    own fix (Lightning-AI/pytorch-lightning#21837) is installed."""

    @torch.compiler.disable  # type: ignore[untyped-decorator]
    def log(self, *args: Any, **kwargs: Any) -> None:
        super().log(*args, **kwargs)


@pytest.mark.slow  # a real fit with Dynamo: about 8 s on 2 cores
@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script_method:DeprecationWarning")
def test_a_compiled_step_that_logs_fits_under_the_callback_with_log_outside_the_compiled_region() -> None:
    from tests.adapt.scripted import Scripted
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    module = LitLoggedEager(wl.model, wl.loss_fn)
    recompute = TrainConfig(micro_batch_size=8, checkpoint=True, grad_clip=None)
    callback = AutotuneCallback(policy=Scripted([recompute]), decide_every=2, memory_budget=1 << 40)
    trainer = quiet_trainer(max_steps=4, callbacks=[callback])
    with pytest.warns(AutotuneWarning):
        trainer.fit(torch.compile(module, backend="eager"), torch.utils.data.DataLoader(wl.dataset, batch_size=8))
    assert module._compiler_ctx is not None and math.isfinite(float(trainer.callback_metrics["train_loss"]))
    assert [(c.step, c.after) for c in callback.history if c.applied and c.source == "scripted"] == [(2, recompute)]


class LitPadded(LitBatched):
    """Hugging Face labels over padded sequences (tests/data/padded_workload.py): a token-mean loss."""

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        from tests.data.padded_workload import pad_labels

        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size, collate_fn=pad_labels)


def test_a_token_mean_loss_keeps_its_split_under_lightnings_equal_accumulation() -> None:
    from tests.data.padded_workload import build_labels

    wl = build_labels()
    module = LitPadded(wl.model, wl.loss_fn, wl.dataset, batch_size=8)
    callback = AutotuneCallback(policy=TrainConfig(micro_batch_size=4, grad_accum_steps=2), decide_every=2)
    with pytest.warns(AutotuneWarning) as caught:
        trainer = _fit(module, [callback])
    why = (
        "the split cannot change in this fit: Lightning weighs accumulated micro-batches equally, and the loss is a "
        "mean over its shifted label tokens (labels[..., 1:] != -100): another split would train another gradient"
    )
    autotune_warnings = [str(w.message) for w in caught if isinstance(w.message, AutotuneWarning)]
    assert autotune_warnings == [f"AutotuneCallback: {why}; only per-block knobs will change"]
    assert (module.batch_size, trainer.accumulate_grad_batches, callback.loop.split) == (8, 1, False)
    assert all(not c.applied or c.after.micro_batch_size == 8 for c in callback.history)


class LitBlocksInStep(L.LightningModule):  # type: ignore[misc]
    """README's quick start: a training_step that calls its blocks and head itself, not forward."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.Sequential(
            *(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU()) for _ in range(4))
        )
        self.head, self.batch_size = torch.nn.Linear(16, 4), 16

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.head(self.blocks(batch[0])), batch[1])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        x = torch.randn(256, 16, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :4].argmax(1)), self.batch_size)


def test_an_outer_bf16_change_wraps_training_step_when_it_does_not_call_forward() -> None:
    """Under "32-true" the whole model in bf16 with the first block recomputed: the recomputed
    block hands its bf16 output to the next one, unwrapped (it runs in the outer region). The
    region was opened around forward, which this training_step never calls: "mat1 and mat2 must
    have the same dtype, but got BFloat16 and Float" (a README quick start, once in CI)."""
    from tests.adapt.scripted import Scripted

    whole = TrainConfig(
        micro_batch_size=16,
        precision="bf16",
        outer_precision="bf16",
        checkpoint=(True, False, False, False),
        grad_clip=None,
    )
    module = LitBlocksInStep()
    callback = AutotuneCallback(policy=Scripted([whole]), decide_every=2, memory_budget=1 << 40, progress=False)
    seen: list[torch.dtype] = []

    # The real steps' head outputs only: the callback's fake-tensor profiles run the module too.
    def record(_module: torch.nn.Module, _inputs: Any, out: torch.Tensor) -> None:
        if not isinstance(out, FakeTensor) and torch.is_grad_enabled():
            seen.append(out.dtype)

    module.head.register_forward_hook(record)
    trainer = quiet_trainer(max_steps=4, callbacks=[callback])
    trainer.fit(module)
    assert [(c.step, c.after) for c in callback.history if c.applied and c.source == "scripted"] == [(2, whole)]
    # The first step's head in fp32, the two after the change in bf16 (check steps come between).
    assert seen[0] == torch.float32 and seen[-2:] == [torch.bfloat16, torch.bfloat16]
    assert "training_step" not in vars(module) and "forward" not in vars(module)  # unwrapped at the end
