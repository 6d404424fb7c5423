"""Frozen parameters (autotune.zoo.adapters): frozen-backbone and lora-lm through measurement,
the memory model, the per-block wrappers and an adaptive run (issue 44)."""

from __future__ import annotations

import warnings

import pytest
import torch

from autotune import TrainConfig, measure, predict_memory
from autotune.adapt import Adaptive
from autotune.errors import WorkloadError
from autotune.measurement.tracker import tracked_step
from autotune.memory.predict import profile_memory
from autotune.train.local import Trainer
from autotune.train.wrappers import apply_block_knobs
from autotune.workload import Workload
from autotune.zoo import CORPUS
from autotune.zoo.adapters import LoRALinear


def _tiny(name: str, **overrides: int) -> Workload:
    return CORPUS[name].build(**(CORPUS[name].tiny | overrides))


def _mixed(n: int) -> TrainConfig:
    """Every other block bf16, the others recomputed: the composition at every boundary."""
    return TrainConfig(
        micro_batch_size=4,
        precision=tuple("bf16" if i % 2 == 0 else "fp32" for i in range(n)),
        checkpoint=tuple(i % 2 == 1 for i in range(n)),
    )


def test_only_the_adapters_and_the_head_are_trainable() -> None:
    lora, backbone = _tiny("lora-lm"), _tiny("frozen-backbone")
    trainable = [n for n, p in lora.model.named_parameters() if p.requires_grad]
    assert trainable and all(n.endswith(("lora_a", "lora_b")) for n in trainable)
    assert sum(p.numel() for p in lora.model.parameters() if p.requires_grad) == 4096  # 2 x 4 x 4 x (32 + out)
    assert [n for n, p in backbone.model.named_parameters() if p.requires_grad] == [
        "ln_f.weight",
        "ln_f.bias",
        "head.weight",
        "head.bias",
    ]
    partial = _tiny("frozen-backbone", frozen=1)
    assert {n.split(".")[1] for n, p in partial.model.named_parameters() if p.requires_grad and "blocks" in n} == {
        "1",
        "2",
    }


def test_frozen_must_not_exceed_layers() -> None:
    with pytest.raises(WorkloadError, match=r"frozen must be <= layers, but got \(frozen=4, layers=3\)"):
        _tiny("frozen-backbone", frozen=4)


def test_a_lora_layer_starts_as_its_base_and_scales_by_alpha_over_rank() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 6)
    layer = LoRALinear(base, rank=2, alpha=6)
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), base(x))  # B starts at zero
    assert layer.scaling == 3.0 and not base.weight.requires_grad
    with torch.no_grad():
        layer.lora_b.fill_(1.0)
    torch.testing.assert_close(layer(x), base(x) + 3.0 * (x @ layer.lora_a.T) @ layer.lora_b.T)


#: (workload, overrides) -> (predicted, measured) peak bytes of the default at micro-batch 4, of
#: ``_mixed`` and of micro-batch 8 x 2 with every block recomputed (exact, repeatable: MemTracker).
PEAKS = {
    ("frozen-backbone", ()): ((255712, 255712), (255712, 255712), (347152, 347160)),
    ("lora-lm", ()): ((501864, 501876), (464744, 464756), (614024, 614044)),
}


@pytest.mark.parametrize(("name", "overrides"), list(PEAKS))
def test_predictions_match_the_measured_peaks(name: str, overrides: tuple[tuple[str, int], ...]) -> None:
    wl = _tiny(name, **dict(overrides))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no check may disagree
        profile = profile_memory(wl, modes=("fp32", "bf16"), checkpointed=True, verify=True)
    assert [v.verified for v in profile.checks] == [True, True, True]
    configs = (
        TrainConfig(micro_batch_size=4),
        _mixed(len(wl.block_names())),
        TrainConfig(micro_batch_size=8, grad_accum_steps=2, checkpoint=True),
    )
    found = []
    for config in configs:
        predicted = predict_memory(wl, config, profile=profile)
        measured = measure(wl, config, steps=1, warmup=1)
        assert predicted.verified and measured.peak_bytes is not None
        assert abs(predicted.total - measured.peak_bytes) <= 0.05 * measured.peak_bytes
        found.append((predicted.total, measured.peak_bytes))
    assert tuple(found) == PEAKS[(name, overrides)]


def test_a_partly_frozen_backbone_is_predicted_within_the_tolerance() -> None:
    wl = _tiny("frozen-backbone", frozen=1)  # embeddings and block 0 frozen, blocks 1-2 trained
    for config in (TrainConfig(micro_batch_size=4), _mixed(3)):
        predicted = predict_memory(wl, config)
        measured = measure(wl, config, steps=1, warmup=1).peak_bytes
        assert measured is not None and predicted.verified
        assert abs(predicted.total - measured) <= 0.05 * measured


@pytest.mark.parametrize("name", ["frozen-backbone", "lora-lm"])
def test_frozen_parameters_get_no_gradient_no_state_and_do_not_move(name: str) -> None:
    wl = _tiny(name)
    first = tuple(i == 0 for i in range(len(wl.block_names())))  # block 0 recomputed
    trainer = Trainer(wl, TrainConfig(micro_batch_size=8, checkpoint=first))
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if not p.requires_grad}
    trained = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    for _ in range(3):
        trainer.step()
    tracked = tracked_step(trainer)
    params = dict(trainer.model.named_parameters())
    trainer.close()
    # AdamW's weight decay (0.01, both optimizers) would move a parameter it stepped.
    assert all(torch.equal(params[n], before) for n, before in frozen.items())
    assert all(not torch.equal(params[n], before) for n, before in trained.items())
    assert all(params[n].grad is None for n in frozen)
    stated = {id(p) for p in trainer.optimizer.state}
    assert stated == {id(params[n]) for n in trained}
    trainable_bytes = 4 * sum(params[n].numel() for n in trained)
    assert tracked.category_peaks.gradients == trainable_bytes
    assert tracked.at_peak.parameters == 4 * sum(p.numel() for p in params.values())


def test_a_checkpointed_lora_block_whose_input_needs_no_gradient_still_trains_its_adapters() -> None:
    # Block 0's input is the frozen embeddings' output: no gradient. Reentrant checkpointing would
    # give its adapters none; the wrappers' non-reentrant checkpointing gives them the plain ones.
    wl = _tiny("lora-lm")
    batch = wl.first_batch(4)
    grads = []
    for ckpt in ("none", "full"):
        model = wl.model_copy()
        wrappers = apply_block_knobs(model, wl.block_names(), ["fp32", "fp32"], [ckpt, ckpt], device_type="cpu")
        wl.loss_fn(model, batch).backward()
        wrappers.remove()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert all(g is not None for g in grads[1].values())
    # lora_b starts at zero, so lora_a's first gradient is zero too: lora_b's are not.
    assert all(g.abs().sum() > 0 for n, g in grads[1].items() if n.endswith("lora_b"))
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g)


def test_adaptive_trains_the_lora_model_within_a_budget() -> None:
    wl = _tiny("lora-lm")
    optimizer = wl.make_optimizer(wl.model.parameters())
    frozen = {n: p.detach().clone() for n, p in wl.model.named_parameters() if not p.requires_grad}
    probe = Adaptive(wl.model, optimizer, wl.loss_fn, wl.dataset, batch_size=8, policy=None)
    probe.close()
    budget = int(0.7 * probe.budget_bytes)  # below the default's peak: it must split or recompute
    tuner = Adaptive(
        wl.model, optimizer, wl.loss_fn, wl.dataset, batch_size=8, memory_budget=budget, track_memory=True, policy=None
    )
    losses = [tuner.step().loss for _ in range(6)]
    tuner.close()
    tracked = [s.peak_bytes for s in tuner.steps if s.peak_bytes is not None]
    assert tracked and max(tracked) <= budget
    start = tuner.history[0]
    assert start.source == "budget" and start.applied and start.predicted_bytes is not None
    assert all(abs(start.predicted_bytes - peak) <= 0.05 * peak for peak in tracked)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert all(torch.equal(p, frozen[n]) for n, p in wl.model.named_parameters() if not p.requires_grad)
    assert {id(p) for p in optimizer.state} == {id(p) for p in wl.model.parameters() if p.requires_grad}
