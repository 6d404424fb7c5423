from __future__ import annotations

from collections import UserDict
from typing import NamedTuple

import pytest
import torch

from autotune.batches import batch_size, map_tensors, split_batch
from autotune.errors import BatchError


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


def test_a_nested_batch_splits_into_consecutive_views_of_its_own_containers() -> None:
    x = torch.arange(7 * 2).reshape(7, 2)
    y = torch.arange(7)
    batch = {"pair": Pair(x, y), "ids": [y], "meta": UserDict(mask=y > 2), "name": "padded"}
    parts = split_batch(batch, 3)
    assert [n for _, n in parts] == [3, 3, 1]
    last, _ = parts[2]
    assert type(last) is dict and type(last["pair"]) is Pair and type(last["meta"]) is UserDict
    assert torch.equal(last["pair"].x, torch.tensor([[12, 13]]))
    assert torch.equal(last["ids"][0], torch.tensor([6]))
    assert torch.equal(last["meta"]["mask"], torch.tensor([True]))
    assert last["name"] == "padded"  # a non-tensor leaf is shared by every micro-batch
    assert parts[0][0]["pair"].x.data_ptr() == x.data_ptr()  # a view: no copy
    assert torch.equal(batch["meta"]["mask"], y > 2)  # the user's batch is left as it was


def test_map_tensors_rebuilds_a_user_dict_subclass_with_its_attributes() -> None:
    class Encoding(UserDict[str, torch.Tensor]):
        def __init__(self, data: dict[str, torch.Tensor], tag: str) -> None:
            super().__init__(data)
            self.tag = tag

    enc = Encoding({"input_ids": torch.ones(4, 3)}, tag="t")
    doubled = map_tensors(lambda t: 2 * t, enc)
    assert type(doubled) is Encoding and doubled.tag == "t"
    assert torch.equal(doubled["input_ids"], torch.full((4, 3), 2.0))
    assert torch.equal(enc["input_ids"], torch.ones(4, 3))
    assert batch_size(enc) == 4


def test_a_noise_split_of_a_drawn_micro_batch_splits_its_per_sample_lists_too() -> None:
    """BaseTrainer's split=2 (two halves for the noise estimate) goes through the same split."""
    from autotune import TrainConfig, Workload
    from autotune.train import Trainer

    seen: list[list[int]] = []

    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, object]:
        xs, ys = zip(*samples, strict=True)
        return {"x": torch.stack(xs), "y": torch.stack(ys), "ids": [int(v) for v in ys]}

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        seen.append(list(batch["ids"]))  # type: ignore[call-overload]
        assert batch["y"].tolist() == batch["ids"]
        return (model(batch["x"]).squeeze(-1) - batch["y"]).pow(2).mean()

    data = torch.utils.data.TensorDataset(torch.randn(8, 3), torch.arange(8.0))
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    wl = Workload(name="ids", model=model, dataset=data, loss_fn=loss_fn, batch_size=8, collate_fn=collate)
    trainer = Trainer(wl, TrainConfig(micro_batch_size=8))
    trainer.step(split=2)
    trainer.close()
    assert [len(ids) for ids in seen] == [4, 4]
    assert sorted(seen[0] + seen[1]) == list(range(8))


def test_rows_taken_from_a_batch_take_its_per_sample_lists_along() -> None:
    from autotune.batches import sample_of, select_rows
    from autotune.worst_case import take_rows

    batch = {"x": torch.arange(3), "names": ["a", "b", "c"], "ids": (10, 11, 12), "mode": "train"}
    rows = take_rows(batch, 5)  # cycling: rows 0, 1, 2, 0, 1
    assert torch.equal(rows["x"], torch.tensor([0, 1, 2, 0, 1]))
    assert (rows["names"], rows["ids"], rows["mode"]) == (["a", "b", "c", "a", "b"], (10, 11, 12, 10, 11), "train")
    picked = select_rows(batch, torch.tensor([2, 0]))
    assert (picked["x"].tolist(), picked["names"], picked["ids"]) == ([2, 0], ["c", "a"], (12, 10))
    one = sample_of(batch, 1)
    assert (one["x"].item(), one["names"], one["ids"], one["mode"]) == (1, "b", 11, "train")


def test_a_packed_batch_is_refused_and_padded_rows_with_positions_are_not() -> None:
    # transformers' DataCollatorWithFlattening: one row, positions restarting at each sequence.
    packed = {"input_ids": torch.arange(5)[None], "position_ids": torch.tensor([[0, 1, 2, 0, 1]])}
    with pytest.raises(BatchError, match=r"^a packed batch \(several sequences in one row, told apart by position_ids"):
        batch_size(packed)
    assert batch_size({"input_ids": torch.zeros(2, 3), "position_ids": torch.arange(3).expand(2, 3)}) == 2
    assert batch_size({"input_ids": torch.zeros(1, 3), "position_ids": torch.arange(3)[None]}) == 1  # one sequence
