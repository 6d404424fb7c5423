"""Evaluation inside training is part of the peak the budget protects, never of the training
configuration (transformers#32215: ``auto_find_batch_size`` halved the *training* batch when
*evaluation* ran out of memory). A real ``transformers.Trainer.train()`` with ``eval_strategy="steps"``
and a real ``lightning.Trainer.fit()`` with a val DataLoader, on the tiny GPT-2 (CPU)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("lightning")

import lightning as L
import transformers

from autotune import TrainConfig
from autotune.adapt.records import Change
from autotune.errors import ConfigError, OverBudgetWarning
from autotune.integrations import hf, lightning
from autotune.integrations._framework import FrameworkLoop
from autotune.measurement.tracker import tracker_class
from autotune.zoo import CORPUS
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp
from tests.integrations.lightning_trainer import quiet_trainer
from tests.measurement.fake_cuda import FakeAllocator

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
]

A = TrainConfig(micro_batch_size=8, grad_clip=None)  # the user's 8 x 1
B = dataclasses.replace(A, checkpoint=True)
STAYS = "the training configuration stays: evaluation is not what the budget adapts"


def _trainer(tmp_path: Path, callbacks: list[Any], *, eval_batch: int) -> transformers.Trainer:
    wl = CORPUS["hf-gpt2"].build(**CORPUS["hf-gpt2"].tiny)  # 64 samples of 16 tokens
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=eval_batch,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        # No log at an evaluation's step: the Trainer's logging runs just before its evaluation,
        # inside the window, and its loss scalar (4 B) would be in the evaluation's peak.
        logging_steps=100,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    return transformers.Trainer(
        model=wl.model, args=args, train_dataset=wl.dataset, eval_dataset=wl.dataset, callbacks=callbacks
    )


def _tracked(evaluate: Any, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> int:
    """The exact peak of ``evaluate(tracker)``, tracked by the test itself (the model and the
    optimizers' state count)."""
    tracker = tracker_class()(device=torch.device("cpu"))
    tracker.track_external(model, *optimizers)
    with tracker:
        evaluate(tracker)
    return int(tracker.device_snapshot("peak")["Total"])


def test_an_evaluation_over_the_budget_is_measured_once_said_once_and_training_stays(tmp_path: Path) -> None:
    callback = hf.AutotuneCallback(policy=None, decide_every=2)  # budget: the default's own peak
    trainer = _trainer(tmp_path, [callback], eval_batch=64)  # one evaluation batch of all 64 samples
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    peak, budget = callback.evaluation_peak, callback.loop.gate.budget  # type: ignore[union-attr]
    # Exact: what the test tracks over the same evaluation (the same weights and optimizer state).
    assert peak == _tracked(lambda _: trainer.evaluate(), trainer.model, [trainer.optimizer]) > budget
    reason = f"the evaluation measured {peak} B > budget {budget} B; {STAYS} (lower per_device_eval_batch_size)"
    # Two evaluations (steps 2 and 4), measured and said once.
    assert [str(w.message) for w in caught if issubclass(w.category, OverBudgetWarning)] == [f"step 2: {reason}"]
    assert callback.history == [
        Change(step=2, source="evaluation", before=A, after=A, applied=False, reason=reason, measured_bytes=peak)
    ]
    assert callback.loop.config == A and callback.loop.controller.over_budget == []  # type: ignore[union-attr]
    assert callback.state()["attributes"]["resume_state"]["evaluation_peak"] == peak


class PeakAllocator(FakeAllocator):
    """A fake CUDA allocator whose peaks are since the last reset (nothing held between steps)."""

    def __init__(self) -> None:
        super().__init__(allocated=0, reserved=0)

    def spike(self, allocated: int, reserved: int) -> None:
        for key, value in (("allocated_bytes.all.peak", allocated), ("reserved_bytes.all.peak", reserved)):
            self.stats[key] = max(self.stats[key], value)

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        super().reset_peak_memory_stats(device)
        self.stats["allocated_bytes.all.peak"] = self.stats["reserved_bytes.all.peak"] = 0


class Spikes(transformers.TrainerCallback):  # type: ignore[misc]
    """After the autotune callback: puts the fake allocator on its loop, spikes it in each training
    step by 1 MB (1.2 MB reserved) and in each evaluation batch by 1 GB (1.2 GB reserved)."""

    def __init__(self, loop: FrameworkLoop, fake: PeakAllocator) -> None:
        self.loop, self.fake = loop, fake

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.loop.allocator = self.fake

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.fake.spike(1_000_000, 1_200_000)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.fake.spike(10**9, 12 * 10**8)


def test_an_evaluation_peak_never_reverts_the_training_configuration(tmp_path: Path) -> None:
    # transformers#32215 here: a step's peak read from the allocator after an evaluation (its peak
    # statistics not reset around it) would be the evaluation's gigabyte: B "measured" over the
    # budget at step 3 would go back to A. The training steps measure 1 MB, the evaluation 1 GB.
    fake = PeakAllocator()
    callback = hf.AutotuneCallback(policy=Scripted([B]), memory_budget=4_000_000, decide_every=2)
    callback.loop.measure_peak = lambda config: fake.stats["allocated_bytes.all.peak"]  # a CUDA step's peak
    trainer = _trainer(tmp_path, [callback, Spikes(callback.loop, fake)], eval_batch=8)
    with pytest.warns(OverBudgetWarning) as caught:
        trainer.train()
    reason = (
        f"the evaluation measured {12 * 10**8} B reserved (+5% headroom: {126 * 10**7} B) > budget 4000000 B; "
        f"{STAYS} (lower per_device_eval_batch_size)"
    )
    assert [str(w.message) for w in caught] == [f"step 2: {reason}"]
    went, evaluated = callback.history
    assert (went.step, went.source, went.before, went.after, went.applied) == (2, "scripted", A, B, True)
    assert evaluated == Change(
        step=2, source="evaluation", before=B, after=B, applied=False, reason=reason, measured_bytes=12 * 10**8
    )
    controller = callback.loop.controller
    assert controller is not None and controller.over_budget == [] and controller.config == B
    assert controller.gate.measured == {A: 1_000_000, B: 1_000_000}  # training steps only
    # The run's statistics at decisions: the training windows' peaks (ratio 1.2), not the evaluation's.
    assert callback.loop.run_stats() == dataclasses.replace(
        callback.loop.run_stats(),
        allocated_peak=1_000_000,
        reserved_peak=1_200_000,  # type: ignore[arg-type]
    )
    assert callback.evaluation_peak == 12 * 10**8 and fake.resets == 4  # before and after each of 2 evaluations


class LitGPT(L.LightningModule):  # type: ignore[misc]
    """The GPT-2 as a LightningModule with a val DataLoader of ``val_batch`` samples a batch."""

    def __init__(self, net: torch.nn.Module, loss_fn: Any, dataset: Any, val_batch: int) -> None:
        super().__init__()
        self.net, self.loss_fn, self.dataset, self.val_batch = net, loss_fn, dataset, val_batch
        self.tracker: Any = None  # the test's own tracker over a validate(): its module stats reset per batch

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.tracker is not None:
            self.tracker.reset_mod_stats()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.loss_fn(self.net, batch)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.loss_fn(self.net, batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.dataset, batch_size=8)

    def val_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.val_batch)


def test_a_validation_that_fits_is_measured_exactly_and_nothing_is_said() -> None:
    wl = CORPUS["hf-gpt2"].build(**CORPUS["hf-gpt2"].tiny)
    callback = lightning.AutotuneCallback(policy=None, decide_every=2)
    trainer = quiet_trainer(max_steps=4, val_check_interval=2, limit_val_batches=2, callbacks=[callback])
    module = LitGPT(wl.model, wl.loss_fn, wl.dataset, val_batch=8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module)
    assert [w for w in caught if issubclass(w.category, OverBudgetWarning)] == []
    peak, budget = callback.evaluation_peak, callback.loop.gate.budget  # type: ignore[union-attr]

    def validate(tracker: Any) -> None:
        module.tracker = tracker
        trainer.validate(module, verbose=False)

    assert peak == _tracked(validate, module, trainer.optimizers) <= budget
    assert callback.history == [
        Change(
            step=2,
            source="evaluation",
            before=A,
            after=A,
            applied=False,
            reason=f"the evaluation measured {peak} B <= budget {budget} B; {STAYS}",
            measured_bytes=peak,
        )
    ]
    assert callback.state_dict()["evaluation_peak"] == peak


def test_a_resumed_loop_keeps_the_evaluation_peak_and_reads_a_state_from_before_it() -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    live.evaluation_peak = 123_456
    state = live.state_dict()
    assert (state["version"], state["evaluation_peak"]) == (3, 123_456)
    resumed = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    resumed.load_state_dict(state)
    assert resumed.evaluation_peak == 123_456  # not measured again: the CPU tracker is not started
    resumed.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    resumed.evaluation_begin()
    assert resumed._tracker is None
    resumed.evaluation_end(0, lower="the eval batch")
    assert resumed.history == [] and resumed.evaluation_peak == 123_456
    old = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    old.load_state_dict({**{k: v for k, v in state.items() if k != "evaluation_peak"}, "version": 1})
    assert old.evaluation_peak is None


def test_a_loop_at_the_default_under_the_whole_default_budget_resumes_there() -> None:
    """``"100%"`` is the default's own peak: the start admits the default without the prediction's
    headroom, and so does the resume (it re-gated the saved default with the headroom and moved)."""
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=None, memory_budget="100%", decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    state = live.state_dict()
    resumed = FrameworkLoop(policy=None, memory_budget="100%", decide_every=5, blocks=None)
    resumed.load_state_dict(state)
    resumed.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    assert resumed.history == [] and resumed.controller is not None
    assert resumed.controller.config == live.controller.config  # type: ignore[union-attr]


def test_a_state_saved_at_another_effective_batch_is_refused_at_the_resumed_fit_s_start() -> None:
    wl = make_resmlp(n=64)
    live = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    live.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    state = live.state_dict()
    resumed = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError) as caught:
        resumed.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=8, accum=2, name="resmlp")
    assert str(caught.value) == (
        "AutotuneCallback state's effective batch must be this fit's (16), but got 8: resume it with the batch "
        "size and gradient accumulation it was saved at."
    )


def test_a_state_saved_for_another_model_is_refused_at_the_resumed_fit_s_start() -> None:
    # The Trainer's and Lightning's checkpoints carry the callback's state: resumed over a model of
    # another width it would apply another model's configuration, silently.
    saved_on, other = make_resmlp(n=64), make_resmlp(n=64, d=48)
    live = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    live.begin(saved_on.model, saved_on.dataset, saved_on.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    state = live.state_dict()
    assert state["model"] == {"fingerprint": saved_on.fingerprint, "parameters": saved_on.num_parameters}
    resumed = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError) as caught:
        resumed.begin(other.model, other.dataset, other.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    assert str(caught.value) == (
        f"AutotuneCallback state was saved for another model ({saved_on.num_parameters:,} parameters, fingerprint "
        f"{saved_on.fingerprint}), but this fit's model has {other.num_parameters:,} parameters (fingerprint "
        f"{other.fingerprint}): resume it with the model it was saved from."
    )
    older = FrameworkLoop(policy=None, memory_budget=10**9, decide_every=5, blocks=None)
    older.load_state_dict({**{k: v for k, v in state.items() if k != "model"}, "version": 2})
    older.begin(saved_on.model, saved_on.dataset, saved_on.loss_fn, micro_batch_size=8, accum=1, name="resmlp")
    assert older.controller is not None and older.controller.config == live.controller.config  # type: ignore[union-attr]
