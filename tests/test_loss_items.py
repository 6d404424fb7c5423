"""autotune.loss_items: a batch split into micro-batches trains the batch's gradient, whatever its
loss averages over (samples, or label tokens with padding and masked prompts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from autotune import TrainConfig, Workload
from autotune.errors import WorkloadError
from autotune.train import Trainer
from tests.data.padded_workload import build_labels, build_map_style
from tests.data.padded_workload import pad as pad_ids


def _sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.5)


def _after_one_step(workload: Workload, micro: int) -> dict[str, torch.Tensor]:
    """The parameters after one SGD step of the workload's batch of 8 in micro-batches of ``micro``."""
    trainer = Trainer(
        dataclasses.replace(workload, optimizer=_sgd), TrainConfig(micro_batch_size=micro, grad_accum_steps=8 // micro)
    )
    trainer.step()
    state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    trainer.close()
    return state


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_a_split_step_trains_the_batchs_gradient_over_padded_labels() -> None:
    whole = _after_one_step(build_labels(), 8)
    for micro in (4, 1):
        assert _largest_difference(_after_one_step(build_labels(), micro), whole) < 1e-6
    # Before: each micro-batch weighed its samples, and a split moved the parameters elsewhere.
    by_samples = dataclasses.replace(build_labels(), loss_items="samples")
    assert _largest_difference(_after_one_step(by_samples, 1), whole) > 1e-3


def test_a_loss_of_your_own_is_weighted_by_your_count() -> None:
    # padded_workload's loss ignores the padding id 0: no labels, so "auto" is samples; the user says.
    ids_after_first = lambda b: torch.count_nonzero(b["input_ids"][:, 1:])  # noqa: E731
    counted = dataclasses.replace(build_map_style(), loss_items=ids_after_first)
    assert counted.loss_weighting.line == "loss weighting: each micro-batch by your Workload.loss_items"
    whole = _after_one_step(counted, 8)
    assert _largest_difference(_after_one_step(counted, 2), whole) < 1e-6
    assert build_map_style().loss_weighting.line == "loss weighting: each micro-batch by its samples"


def _unshifted(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    # A token-classification loss: each position's own label.
    return nn.functional.cross_entropy(model(batch["input_ids"]).flatten(0, 1), batch["labels"].flatten())


def _per_sequence(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    # Each sequence's mean over its tokens, then the mean over sequences: every sample weighs the same.
    logits = model(batch["input_ids"])[:, :-1]
    labels = batch["labels"][:, 1:]
    terms = nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none")
    valid = labels != -100
    return ((terms * valid).sum(1) / valid.sum(1)).mean()


def _summed(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    logits = model(batch["input_ids"])[:, :-1]
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"][:, 1:].flatten(), reduction="sum")


@pytest.mark.parametrize(
    ("loss_fn", "rule"),
    [
        (None, "shifted label tokens (labels[..., 1:] != -100)"),
        (_unshifted, "label tokens (labels != -100)"),
        (_per_sequence, "samples"),
        (_summed, "samples"),
    ],
)
def test_auto_measures_what_the_loss_averages_over(
    loss_fn: Callable[[nn.Module, Any], torch.Tensor] | None, rule: str
) -> None:
    workload = build_labels()
    if loss_fn is not None:
        workload = dataclasses.replace(workload, loss_fn=loss_fn)
    weighting = workload.loss_weighting
    assert weighting.name == rule
    assert (weighting.count is None) == (rule == "samples")
    # The first batch's shortest two samples whose three shares differ: 5 and 4 labels, 4 and 3 targets,
    # trimmed to the longer one (the rest is padding).
    how = "the pair's gradient from its two halves, measured on two samples of 5 and 4 labels"
    if loss_fn is _summed:  # a sum is no mean of anything: no count reproduces it
        assert weighting.line.startswith(
            f"loss weighting: each micro-batch by its samples: neither its samples nor its label tokens give {how} "
        )
    else:
        assert weighting.line.startswith(f"loss weighting: each micro-batch by its {rule} ({how}, ")


def test_the_measurement_leaves_the_model_as_it_was() -> None:
    workload = build_labels()
    workload.model.blocks[0].eval()
    workload.model.head.weight.grad = torch.ones_like(workload.model.head.weight)
    state = {k: v.clone() for k, v in workload.model.state_dict().items()}
    modes = [m.training for m in workload.model.modules()]
    assert workload.loss_weighting.count is not None
    assert [m.training for m in workload.model.modules()] == modes
    assert modes.count(False) == 4  # the block and its three layers
    assert torch.equal(workload.model.head.weight.grad, torch.ones_like(workload.model.head.weight))
    assert all(torch.equal(v, state[k]) for k, v in workload.model.state_dict().items())


def _counting(workload: Workload) -> tuple[Workload, list[int]]:
    calls: list[int] = []

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        calls.append(1)
        return workload.loss_fn(model, batch)

    return dataclasses.replace(workload, loss_fn=loss_fn), calls


def test_nothing_runs_where_every_sample_holds_as_many_labels() -> None:
    same_length = [torch.arange(1, 9) for _ in range(16)]
    workload, calls = _counting(dataclasses.replace(build_labels(), dataset=same_length))  # type: ignore[arg-type]
    assert workload.loss_weighting.line == (
        "loss weighting: each micro-batch by its samples (every sample holds as many labels)"
    )
    assert calls == []


def test_nothing_runs_without_labels() -> None:
    workload, calls = _counting(build_map_style())
    assert workload.loss_weighting.count is None
    assert calls == []
    assert pad_ids([torch.tensor([1, 2])])["input_ids"].tolist() == [[1, 2]]


def test_loss_items_is_refused_unless_auto_samples_or_a_count() -> None:
    with pytest.raises(WorkloadError) as e:
        dataclasses.replace(build_labels(), loss_items="tokens")
    assert str(e.value) == (
        "Workload.loss_items must be 'auto', 'samples' or a callable batch -> count, but got 'tokens'."
    )


def test_adaptive_says_the_rule_and_splits_your_batch_by_it() -> None:
    from autotune.adapt import Adaptive
    from tests.data.padded_workload import pad_labels

    def run(micro: int) -> tuple[dict[str, torch.Tensor], list[str]]:
        workload, lines = build_labels(), []
        optimizer = torch.optim.SGD(workload.model.parameters(), lr=0.5)
        policy = TrainConfig(micro_batch_size=micro, grad_accum_steps=8 // micro)
        data = workload.dataset
        tuner = Adaptive(workload.model, optimizer, workload.loss_fn, data, collate_fn=pad_labels, batch_size=8,
                         policy=policy, progress=lines.append)  # fmt: skip
        with tuner:
            tuner.step(pad_labels([data[i] for i in range(8, 16)]))  # your own batch, padded as you pad it
        return {k: v.detach().clone() for k, v in workload.model.state_dict().items()}, lines

    whole, lines = run(8)
    split, _ = run(1)
    assert _largest_difference(split, whole) < 1e-6
    assert any(line.startswith("loss weighting: each micro-batch by its shifted label tokens") for line in lines)


def test_a_loss_that_fails_on_one_sample_leaves_the_weighting_by_samples() -> None:
    def pairs_only(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if batch["input_ids"].shape[0] < 2:
            raise ValueError("a contrastive loss needs two samples")
        return build_labels().loss_fn(model, batch)

    weighting = dataclasses.replace(build_labels(), loss_fn=pairs_only).loss_weighting
    assert weighting.count is None
    assert weighting.line == (
        "loss weighting: each micro-batch by its samples: the loss on one sample could not be measured "
        "(ValueError: a contrastive loss needs two samples); Workload.loss_items says what your loss averages over"
    )


def test_deciding_the_weighting_leaves_the_random_stream_as_it_was() -> None:
    # Building a Trainer decides it: a DataLoader's iterator draws its seed from torch's generator.
    workload = build_map_style()
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    assert workload.loss_weighting.count is None
    assert torch.equal(torch.rand(3), expected)
