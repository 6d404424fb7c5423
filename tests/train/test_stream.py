"""ShardStream: a DataLoader's batches over a DistributedSampler, with a micro-batch size per draw;
IterableStream: the same over an IterableDataset in one process."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from autotune.errors import ConfigError, WorkloadError
from autotune.train.stream import IterableStream, ShardStream

DATA = TensorDataset(torch.arange(50).float().unsqueeze(1), torch.arange(50) % 3)


def _loader_batches(rank: int, micro: int, epochs: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    sampler: DistributedSampler[int] = DistributedSampler(DATA, num_replicas=2, rank=rank, seed=7, drop_last=True)
    loader = DataLoader(DATA, batch_size=micro, sampler=sampler, drop_last=True)
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out += list(loader)
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_draws_what_the_data_loader_yields_epoch_after_epoch(rank: int) -> None:
    expected = _loader_batches(rank, micro=4, epochs=3)  # 25 samples per shard: 6 batches, 1 dropped
    stream = ShardStream(DATA, num_replicas=2, rank=rank, seed=7)
    drawn = [stream.next(4) for _ in expected]
    assert len(drawn) == 18 and stream.epoch == 2
    for (x, y), (ex, ey) in zip(drawn, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


def test_a_micro_batch_change_keeps_the_place_in_the_epoch() -> None:
    order = torch.cat([x for x, _ in _loader_batches(0, micro=1, epochs=1)]).flatten()
    stream = ShardStream(DATA, num_replicas=2, rank=0, seed=7)
    first, second, third = stream.next(4)[0], stream.next(8)[0], stream.next(2)[0]
    assert torch.equal(torch.cat([first, second, third]).flatten(), order[:14])
    assert (stream.epoch, stream.offset) == (0, 14)
    stream.next(12)  # 14 + 12 > 25: the rest of epoch 0 is dropped, epoch 1 starts
    assert (stream.epoch, stream.offset) == (1, 12)


@pytest.mark.parametrize("micro", [0, 26])
def test_micro_batch_must_fit_the_shard(micro: int) -> None:
    stream = ShardStream(DATA, num_replicas=2, rank=0, seed=7)
    msg = f"the micro-batch size must be in [1, 25] (this rank's shard of the dataset), but got {micro}."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        stream.next(micro)


class _Count(torch.utils.data.IterableDataset[torch.Tensor]):
    """0, 1, ..., n - 1 as 1-element tensors, in order, every pass."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter([torch.tensor([i]) for i in range(self.n)])


def _firsts(samples: list[torch.Tensor]) -> list[int]:
    """A collate of the user's own: the samples' values as a list (no tensor)."""
    return [int(s) for s in samples]


def test_an_iterable_stream_keeps_its_place_and_drops_the_rest_of_each_pass() -> None:
    stream = IterableStream(_Count(10), collate_fn=_firsts)
    drawn = [stream.next(3), stream.next(4), stream.next(4), stream.next(2)]
    # 0-2 and 3-6 from the first pass; 7-9 are too few for 4: dropped, the second pass begins.
    assert drawn == [[0, 1, 2], [3, 4, 5, 6], [0, 1, 2, 3], [4, 5]]
    assert stream.epoch == 1


def test_an_iterable_stream_uses_the_default_collate_without_one() -> None:
    assert torch.equal(IterableStream(_Count(4)).next(2), torch.tensor([[0], [1]]))


def test_a_micro_batch_longer_than_a_pass_is_a_workload_error() -> None:
    stream = IterableStream(_Count(3), name="counts")
    message = (
        "workload 'counts': a micro-batch of 4 samples must fit in one pass over its IterableDataset, "
        "but a pass yielded 3."
    )
    with pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        stream.next(4)


def test_a_stream_resumed_from_its_state_draws_what_the_uninterrupted_one_draws() -> None:
    whole, first = IterableStream(_Count(10), collate_fn=_firsts), IterableStream(_Count(10), collate_fn=_firsts)
    expected = [whole.next(3) for _ in range(5)]
    drawn = [first.next(3) for _ in range(4)]
    resumed = IterableStream(_Count(10), collate_fn=_firsts)
    resumed.load_state_dict(first.state_dict())
    assert first.state_dict() == {"epoch": 1, "offset": 3}
    assert [*drawn, resumed.next(3)] == expected == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [0, 1, 2], [3, 4, 5]]
    shards = [ShardStream(DATA, num_replicas=2, rank=0, seed=7) for _ in range(3)]
    whole_x = [shards[0].next(4)[0] for _ in range(8)]
    first_x = [shards[1].next(4)[0] for _ in range(7)]
    shards[2].load_state_dict(shards[1].state_dict())
    assert all(torch.equal(a, b) for a, b in zip([*first_x, shards[2].next(4)[0]], whole_x, strict=True))
