"""One behaviour, three front-ends: plain :class:`autotune.Adaptive`, the callback inside a real
``transformers.Trainer.train()`` and the callback inside a real ``lightning.Trainer.fit()``, on
the same tiny GPT-2 (CPU). They share one :class:`autotune.adapt.controller.Controller`; what
differs is what each loop can take (the Trainers fix their split before the first step, so the
callbacks start at the user's split) and how a step is measured (``Adaptive``'s own loop runs
side-by-side trials and tracked steps; a framework's loop runs neither: a scripted measured-peak
hook stands in for a tracked step there)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("lightning")

import lightning as L
import transformers

from autotune import Adaptive, TrainConfig
from autotune.adapt.decider import Decider
from autotune.adapt.records import Change, OverBudgetStep
from autotune.errors import ConfigError, OverBudgetWarning
from autotune.integrations import hf, lightning
from autotune.memory.gate import BudgetGate
from autotune.zoo import CORPUS
from tests.adapt.scripted import Scripted
from tests.integrations.lightning_trainer import quiet_trainer

pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated:FutureWarning"),
]

FRONTENDS = ["adaptive", "hf", "lightning"]
A = TrainConfig(micro_batch_size=8, grad_clip=None)  # every front-end's default: the user's 8 x 1
B = dataclasses.replace(A, checkpoint=True)


@dataclass
class Run:
    """What a front-end's run left: its history, gate, over-budget steps and last configuration."""

    history: list[Change]
    gate: BudgetGate
    over_budget: list[OverBudgetStep]
    config: TrainConfig


Peaks = Callable[[TrainConfig], int | None]  # a scripted measured peak of a step under a config


class LitGPT(L.LightningModule):  # type: ignore[misc]
    """The GPT-2 as a LightningModule whose ``train_dataloader`` reads ``batch_size``."""

    def __init__(self, net: torch.nn.Module, loss_fn: Any, dataset: Any) -> None:
        super().__init__()
        self.net, self.loss_fn, self.dataset, self.batch_size = net, loss_fn, dataset, 8

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss: torch.Tensor = self.loss_fn(self.net, batch)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> torch.utils.data.DataLoader[Any]:
        return torch.utils.data.DataLoader(self.dataset, batch_size=self.batch_size)


def _adaptive(tmp_path: Path, steps: int, peaks: Peaks | None, **kwargs: Any) -> Run:
    wl = CORPUS["hf-gpt2"].build(**CORPUS["hf-gpt2"].tiny)
    optimizer = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    tuner = Adaptive(
        wl.model,
        optimizer,
        wl.loss_fn,
        wl.dataset,
        batch_size=8,
        track_memory="all" if peaks is not None else False,
        **kwargs,
    )
    if peaks is not None:  # the tracked step's measurement, scripted where the test says
        measured_step = tuner.trainer.measured_step

        def scripted() -> Any:
            result, peak = measured_step()
            return result, peaks(tuner.config) or peak

        tuner.trainer.measured_step = scripted  # type: ignore[method-assign]
    with tuner:
        for _ in range(steps):
            tuner.step()
        return Run(list(tuner.history), tuner.gate, list(tuner.over_budget_steps), tuner.config)


def _hf(tmp_path: Path, steps: int, peaks: Peaks | None, **kwargs: Any) -> Run:
    wl = CORPUS["hf-gpt2"].build(**CORPUS["hf-gpt2"].tiny)
    callback = hf.AutotuneCallback(**kwargs)
    callback.loop.measure_peak = peaks
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=steps,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback]).train()
    return _framework_run(callback.loop)


def _lightning(tmp_path: Path, steps: int, peaks: Peaks | None, **kwargs: Any) -> Run:
    wl = CORPUS["hf-gpt2"].build(**CORPUS["hf-gpt2"].tiny)
    callback = lightning.AutotuneCallback(**kwargs)
    callback.loop.measure_peak = peaks
    trainer = quiet_trainer(max_steps=steps, callbacks=[callback])
    trainer.fit(LitGPT(wl.model, wl.loss_fn, wl.dataset))
    return _framework_run(callback.loop)


def _framework_run(loop: Any) -> Run:
    controller = loop.controller
    return Run(list(controller.history), controller.gate, list(controller.over_budget), controller.config)


RUNS = {"adaptive": _adaptive, "hf": _hf, "lightning": _lightning}


def _run(
    frontend: str, tmp_path: Path, steps: int, peaks: Peaks | None = None, decide_every: int = 2, **kwargs: Any
) -> Run:
    return RUNS[frontend](tmp_path, steps, peaks, decide_every=decide_every, **kwargs)


def _predicted(gate: BudgetGate, config: TrainConfig) -> int:
    prediction = gate.predict(config)
    assert prediction is not None
    return prediction[0]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_start_within_a_budget_below_the_default_and_a_proposal_over_it_refused(
    frontend: str, tmp_path: Path
) -> None:
    # 80% of the default's peak: the default is over it, and a proposal to go back to it is refused.
    run = _run(frontend, tmp_path, 4, policy=Scripted([A]), memory_budget="80%")
    start, refused = run.history
    # Adaptive's loop takes a smaller micro-batch first; a Trainer's split is fixed: recompute at 8 x 1.
    expected = dataclasses.replace(A, micro_batch_size=4, grad_accum_steps=2) if frontend == "adaptive" else B
    assert (start.step, start.source, start.before, start.after, start.applied) == (0, "budget", A, expected, True)
    budget = run.gate.budget
    assert start.predicted_bytes == _predicted(run.gate, expected)
    assert start.reason == (
        f"the default is over the budget (predicted {_predicted(run.gate, A)} B (+2% headroom) > budget {budget} B); "
        f"predicted {start.predicted_bytes} B (+2% headroom) <= budget {budget} B"
    )
    assert (refused.step, refused.source, refused.before, refused.after, refused.applied) == (
        2,
        "scripted",
        expected,
        A,
        False,
    )
    assert refused.predicted_bytes == _predicted(run.gate, A) and refused.reason == (
        f"scripted; predicted {refused.predicted_bytes} B (+2% headroom) > budget {budget} B"
    )
    assert run.config == expected and run.over_budget == []


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_step_measured_over_the_budget_goes_back_at_once(frontend: str, tmp_path: Path) -> None:
    over = 10**9  # B's step measures a gigabyte: its prediction was off
    with pytest.warns(OverBudgetWarning) as caught:
        run = _run(frontend, tmp_path, 5, peaks=lambda config: over if config == B else None, policy=Scripted([B]))
    went, back = run.history
    assert (went.step, went.source, went.before, went.after, went.applied) == (2, "scripted", A, B, True)
    budget = run.gate.budget
    assert (back.step, back.source, back.before, back.after, back.applied, back.reverted, back.measured_bytes) == (
        3,
        "budget",
        B,
        B,
        False,
        True,
        over,
    )
    assert back.reason == f"measured {over} B > budget {budget} B: back to {A.describe()}"
    assert run.over_budget == [
        OverBudgetStep(step=2, config=B, peak_bytes=over, budget_bytes=budget, predicted_bytes=_predicted(run.gate, B))
    ]
    assert [str(w.message) for w in caught if isinstance(w.message, OverBudgetWarning)] == [
        run.over_budget[0].describe()
    ]
    assert run.config == A


@pytest.fixture
def scripted_rates(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every timed step of A at 100 samples/s, of B (every block recomputed) at 10: the clock is
    scripted where all front-ends report it, so the verdict is the same on any machine."""
    timed = Decider.timed
    rates = {A: 100.0, B: 10.0}
    monkeypatch.setattr(Decider, "timed", lambda self, config, _: timed(self, config, rates[config]))
    yield


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.usefixtures("scripted_rates")
def test_the_better_of_two_configurations_is_kept_by_measurement(frontend: str, tmp_path: Path) -> None:
    run = _run(frontend, tmp_path, 24, policy=Scripted([B, B]), decide_every=6)
    went, back, again = run.history
    assert (went.step, went.source, went.before, went.after, went.applied) == (6, "scripted", A, B, True)
    assert (back.source, back.before, back.after, back.applied) == ("measured", B, A, True)
    if frontend == "adaptive":  # its loop alternates A and B step by step until 4 timed steps of each
        assert back.step == 15  # steps 7-15: B's first (its one-time costs, not timed), then A, B, A, ...
        assert re.fullmatch(
            r"side by side \(4 steps against 4\): measured [\d.]+ per GiB, not 3% above the "
            r"[\d.]+ of the configuration it replaced beyond their spread: back to it",
            back.reason,
        )
    else:  # one stint of B, judged at the next decision
        assert back.step == 12
        assert re.fullmatch(
            r"measured [\d.]+ per GiB, not 3% above the [\d.]+ of the configuration it replaced: "
            "back to it",
            back.reason,
        )
    assert (again.source, again.after, again.applied) == ("scripted", B, False)
    assert again.reason.startswith(f"scripted; measured at step {back.step}: ")
    assert run.config == A


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_nothing_fits_the_same_error_at_the_start(frontend: str, tmp_path: Path) -> None:
    split = "" if frontend == "adaptive" else " at the loop's split 8 x 1"
    message = (
        rf"memory_budget 1000 B is below every fp32 configuration of batch 8{split} \(smallest predicted peak "
        r"\d+ B, \+2% headroom\): raise the budget\."
    )
    with pytest.raises(ConfigError, match=f"^{message}$"):
        _run(frontend, tmp_path, 2, policy=None, memory_budget=1000)
