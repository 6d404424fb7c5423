"""``Adaptive.step(batch)``: the user's own DataLoader, split into the configuration's micro-batches."""

from __future__ import annotations

import copy
import re
from collections import UserDict
from typing import Any

import pytest
import torch
from torch import nn

from autotune import TrainConfig, load_workload
from autotune.adapt import Adaptive
from autotune.errors import BatchError, ConfigError
from autotune.workload import Workload
from tests.adapt.scripted import Scripted
from tests.conftest import make_resmlp
from tests.paths import PADDED_WORKLOAD


def _tuner(batch_size: int, policy: object, **kwargs: object) -> tuple[Adaptive, Workload, nn.Module]:
    """An Adaptive over a fresh seeded model with SGD, and an identical plain copy of the model."""
    wl = make_resmlp(n=64)
    plain = copy.deepcopy(wl.model)
    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    base = wl.loss_fn

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        return base(model, batch if isinstance(batch, (tuple, list)) else (batch["x"], batch["y"]))

    wl = Workload(name="resmlp", model=wl.model, dataset=wl.dataset, loss_fn=loss_fn, batch_size=batch_size)
    tuner = Adaptive(wl.model, opt, loss_fn, wl.dataset, batch_size=batch_size, policy=policy, **kwargs)  # type: ignore[arg-type]
    return tuner, wl, plain


def _plain_step(wl: Workload, model: nn.Module, opt: torch.optim.Optimizer, batch: object) -> float:
    loss = wl.loss_fn(model, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def _assert_same_parameters(a: nn.Module, b: nn.Module) -> None:
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-7)


def test_a_batch_that_does_not_divide_gives_the_gradient_of_one_full_batch_step() -> None:
    tuner, wl, plain = _tuner(9, TrainConfig(micro_batch_size=3, grad_accum_steps=3))
    assert tuner.config.micro_batch_size == 3  # the fixed configuration's plan: 3 x 3
    x, y = wl.dataset[:8]  # type: ignore[index]  # the last batch of an epoch: 3 + 3 + 2 samples
    record = tuner.step((x, y))
    tuner.close()
    # SGD without momentum: the parameter change is lr x the gradient.
    loss = _plain_step(wl, plain, torch.optim.SGD(plain.parameters(), lr=0.1), (x, y))
    assert record.samples == 8
    assert record.loss == pytest.approx(loss, rel=1e-6)
    _assert_same_parameters(wl.model, plain)


def test_fp32_knob_changes_on_the_user_s_batches_follow_a_plain_run() -> None:
    script = [
        TrainConfig(micro_batch_size=4, grad_accum_steps=2, grad_clip=None),
        TrainConfig(micro_batch_size=2, grad_accum_steps=4, checkpoint=True, grad_clip=None),
        TrainConfig(micro_batch_size=8, grad_accum_steps=1, checkpoint=(True, False, True, False), grad_clip=None),
    ]
    tuner, wl, plain = _tuner(8, Scripted(script), decide_every=2)
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    # 64 samples in dict batches of 7 (the effective batch is 8), the last one of 1 sample: most
    # steps split unevenly (4 + 3, 2 + 2 + 2 + 1).
    loader = torch.utils.data.DataLoader(wl.dataset, batch_size=7, collate_fn=_as_dict)
    losses, plain_losses = [], []
    for batch in loader:
        losses.append(tuner.step(batch).loss)
        plain_losses.append(_plain_step(wl, plain, opt, batch))
    tuner.close()
    assert {c.after for c in tuner.history if c.applied and c.source == "scripted"} == set(script)
    assert [s.samples for s in tuner.steps] == [7] * 9 + [1]
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), rtol=1e-5, atol=1e-6)
    _assert_same_parameters(wl.model, plain)


def _as_dict(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> UserDict[str, torch.Tensor]:
    """A user's collate returning a UserDict, as Hugging Face's BatchEncoding is."""
    xs, ys = zip(*samples, strict=True)
    return UserDict(x=torch.stack(xs), y=torch.stack(ys))


def test_a_user_dict_batch_is_split_into_its_own_class() -> None:
    seen: list[tuple[type, int]] = []
    wl = make_resmlp(n=64)

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        if isinstance(batch, (tuple, list)):  # the dataset's own batches: the memory model's profile
            return wl.loss_fn(model, batch)
        seen.append((type(batch), batch["x"].shape[0]))
        return wl.loss_fn(model, (batch["x"], batch["y"]))

    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    fixed = TrainConfig(micro_batch_size=4, grad_accum_steps=2)
    tuner = Adaptive(wl.model, opt, loss_fn, wl.dataset, batch_size=8, policy=fixed)
    tuner.step(_as_dict([wl.dataset[i] for i in range(8)]))  # type: ignore[misc]
    tuner.close()
    assert seen == [(UserDict, 4), (UserDict, 4)]


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            (torch.tensor(1.0), torch.zeros(4)),
            "every tensor of a batch must have a leading batch dimension, but batch[0] is 0-dim.",
        ),
        (
            {"x": torch.zeros(8, 32, 16), "y": torch.zeros(7, 32)},
            "every tensor of a batch must have the same leading (batch) size, "
            "but batch['x'] has 8 and batch['y'] has 7.",
        ),
        (["a", 1], "a batch must hold at least one tensor, but got list."),
        ((torch.zeros(0, 32, 16),), "a batch must hold at least one sample, but batch[0] has leading size 0."),
        (
            (torch.zeros(9, 32, 16), torch.zeros(9, 32)),
            "a batch must hold at most the effective batch (8 samples), but got 9.",
        ),
        (
            {"x": torch.zeros(8, 32, 16), "y": torch.zeros(8, 32), "names": ["a", "b", "c"]},
            "a list or tuple in a batch must hold one entry per sample (8, as batch['x']) to be split with the "
            "tensors, but batch['names'] has 3.",
        ),
        (
            (torch.zeros(8, 32, 16), torch.zeros(8, 32), {"ids": range(8)}),
            "a batch's fields must be tensors, lists or tuples of one entry per sample, or values every sample "
            "shares (a number, a string, None), but batch[2]['ids'] is a range.",
        ),
    ],
)
def test_a_malformed_batch_is_a_one_line_batch_error(batch: object, message: str) -> None:
    tuner, _, _ = _tuner(8, None)
    with pytest.raises(BatchError, match=f"^{re.escape(message)}$"):
        tuner.step(batch)
    tuner.close()
    assert tuner.steps == []


def test_a_user_batch_cannot_grow_the_batch() -> None:
    tuner, wl, _ = _tuner(8, None, adapt_batch=True)
    message = (
        "step(batch) trains the batch it is given, so the effective batch cannot grow: "
        "adapt_batch must be False, but got True."
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        tuner.step(wl.dataset[:8])  # type: ignore[index]
    tuner.close()


def test_a_user_s_loader_over_an_iterable_dataset_trains_as_the_dataset_owning_form() -> None:
    def run(user_batches: bool) -> list[float]:
        wl = load_workload(f"{PADDED_WORKLOAD}:build")
        opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
        tuner = Adaptive(
            wl.model,
            opt,
            wl.loss_fn,
            wl.dataset,
            batch_size=8,
            collate_fn=wl.collate_fn,
            policy=TrainConfig(micro_batch_size=4, grad_accum_steps=2),
        )
        loader = torch.utils.data.DataLoader(wl.dataset, batch_size=4, collate_fn=wl.collate_fn)
        # The user's loader yields micro-batch-sized padded batches; two of them make a step here.
        pairs = zip(*[iter(loader)] * 2, strict=False)
        losses = [tuner.step(_concat(*pair) if user_batches else None).loss for pair in pairs]
        tuner.close()
        return losses

    # Same samples, same micro-batches; a micro-batch of the user's batch may carry more padding
    # columns (ignored by the loss), which changes only the order of the float sums.
    assert run(user_batches=True) == pytest.approx(run(user_batches=False), rel=1e-6, abs=0)


def _concat(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Two padded batches as one: the shorter one padded to the longer's length."""
    width = max(a["input_ids"].shape[1], b["input_ids"].shape[1])
    ids = [nn.functional.pad(t["input_ids"], (0, width - t["input_ids"].shape[1])) for t in (a, b)]
    return {"input_ids": torch.cat(ids)}


def test_a_per_sample_list_is_split_with_the_tensors_and_weighted_by_its_share() -> None:
    wl = make_resmlp(n=64)
    plain = copy.deepcopy(wl.model)
    seen: list[tuple[int, list[str], str, int]] = []

    def loss_fn(model: nn.Module, batch: Any) -> torch.Tensor:
        if isinstance(batch, dict):  # the user's batches (the dataset's tuples are profiled)
            seen.append((batch["x"].shape[0], batch["names"], batch["split"], batch["epoch"]))
            assert len(batch["names"]) == batch["x"].shape[0]  # one name per sample
            batch = (batch["x"], batch["y"])
        return wl.loss_fn(model, batch)

    opt = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    fixed = TrainConfig(micro_batch_size=4, grad_accum_steps=4, grad_clip=None)
    tuner = Adaptive(wl.model, opt, loss_fn, wl.dataset, batch_size=16, policy=fixed)
    x, y = wl.dataset[:30]  # type: ignore[index]
    names = [f"sample-{i}" for i in range(30)]
    tuner.step({"x": x[:16], "y": y[:16], "names": names[:16], "split": "train", "epoch": 3})
    # The last batch of an epoch: 14 samples, 4 + 4 + 4 + 2, each micro-batch weighted by its share.
    record = tuner.step({"x": x[16:], "y": y[16:], "names": tuple(names[16:]), "split": "train", "epoch": 3})
    tuner.close()
    assert seen == [
        (4, names[0:4], "train", 3),
        (4, names[4:8], "train", 3),
        (4, names[8:12], "train", 3),
        (4, names[12:16], "train", 3),
        (4, tuple(names[16:20]), "train", 3),
        (4, tuple(names[20:24]), "train", 3),
        (4, tuple(names[24:28]), "train", 3),
        (2, tuple(names[28:30]), "train", 3),
    ]
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    _plain_step(wl, plain, plain_opt, (x[:16], y[:16]))
    loss = _plain_step(wl, plain, plain_opt, (x[16:], y[16:]))
    assert record.samples == 14
    assert record.loss == pytest.approx(loss, rel=1e-6)
    _assert_same_parameters(wl.model, plain)
