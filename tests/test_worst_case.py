"""The memory model predicts at the largest batch the data can produce: declared, scanned or the
first batch, and says which (autotune.worst_case)."""

from __future__ import annotations

import dataclasses
import re
from functools import cache

import pytest
import torch

from autotune import TrainConfig, Workload, WorkloadError
from autotune.memory.check import check_step
from autotune.memory.predict import predict_memory
from autotune.worst_case import at_worst_case, profile_batch, sample_bytes, take_rows
from autotune.zoo import CORPUS

#: varlen-lm at its tiny size: 64 sequences of 4-32 tokens in batches of 8, the 32-token one last.
SHORT, LONG = 16, 32  # the first batch's padded length, the last one's
SCANNED = "worst case: scanned 8 batches (the whole epoch), longest at batch 7"


@cache
def varlen() -> Workload:
    entry = CORPUS["varlen-lm"]
    return entry.build(**entry.tiny)


def test_the_scan_finds_the_longest_batch_last_in_the_epoch() -> None:
    worst = varlen().worst_case
    assert worst.describe() == SCANNED
    assert (worst.how, worst.scanned, worst.batches, worst.longest) == ("scanned", 8, 8, 7)
    assert worst.batch["input_ids"].shape == (8, LONG)
    assert worst.sample_bytes == 2 * LONG * 8  # input_ids and attention_mask, int64
    assert varlen().worst_case is worst  # scanned once per workload


def test_a_micro_batch_at_the_worst_case_is_rows_of_the_longest_batch() -> None:
    wl = varlen()
    assert wl.first_batch(8)["input_ids"].shape == (8, SHORT)
    batch = profile_batch(wl, 2)
    rows = wl.worst_case.batch
    assert batch["input_ids"].shape == (2, LONG)
    assert torch.equal(batch["input_ids"], rows["input_ids"][:2])
    assert torch.equal(take_rows(rows, 10)["attention_mask"][8:], rows["attention_mask"][:2])  # cycled


def test_a_workload_of_fixed_shapes_profiles_its_first_batch_as_before() -> None:
    wl = CORPUS["gru-lm"].build(**CORPUS["gru-lm"].tiny)
    assert wl.worst_case.describe() == "worst case: scanned 8 batches (the whole epoch), longest at batch 0"
    assert torch.equal(profile_batch(wl, 4), wl.first_batch(4))
    assert at_worst_case(wl, 4) is wl


def test_the_prediction_is_at_the_longest_batch_and_says_so() -> None:
    config = TrainConfig(micro_batch_size=8)
    worst = predict_memory(varlen(), config)
    first = predict_memory(dataclasses.replace(varlen(), scan_batches=0), config)
    assert (worst.worst_case, first.worst_case) == (SCANNED, "worst case: first batch only (scan_batches=0)")
    assert worst.to_dict()["worst_case"] == SCANNED
    # Both verified on a real step at their own batch: the check runs what the profile ran.
    assert worst.verified and first.verified
    assert worst.verification is not None and worst.verification.measured is not None
    assert abs(worst.verification.relative_error or 0.0) < 1e-4
    assert worst.total > 1.6 * first.total  # twice the tokens, attention quadratic in them


def test_a_declared_worst_case_batch_is_predicted_at() -> None:
    wl = varlen()
    declared = dataclasses.replace(wl, worst_case_batch=wl.worst_case.batch, scan_batches=0)
    assert declared.worst_case.describe() == "worst case: declared (Workload.worst_case_batch)"
    config = TrainConfig(micro_batch_size=8)
    assert predict_memory(declared, config, verify=False).total == predict_memory(wl, config, verify=False).total


def test_an_iterable_dataset_is_not_scanned() -> None:
    wl = CORPUS["stream-lm"].build(**CORPUS["stream-lm"].tiny)
    assert wl.worst_case.describe() == (
        "worst case: first batch only (an IterableDataset is not scanned: declare Workload.worst_case_batch)"
    )
    assert sample_bytes(wl.worst_case.batch) == 17 * 8  # seq_len + 1 int64 tokens


def _raises(msg: str) -> pytest.RaisesContext[WorkloadError]:
    return pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$")


@pytest.mark.parametrize("value", [-1, True, 1.5])
def test_scan_batches_must_be_an_int_of_at_least_0(value: object) -> None:
    with _raises(f"Workload.scan_batches must be an int >= 0, but got {value!r}."):
        dataclasses.replace(varlen(), scan_batches=value)


@pytest.mark.parametrize(
    ("batch", "msg"),
    [
        ({"n": 3}, "a batch must hold at least one tensor, but got dict."),
        (torch.tensor(1.0), "every tensor of a batch must have a leading batch dimension, but batch is 0-dim."),
        (
            {"a": torch.zeros(2, 3), "b": torch.zeros(3)},
            "every tensor of a batch must have the same leading (batch) size, but batch['a'] has 2 and "
            "batch['b'] has 3.",
        ),
    ],
)
def test_a_worst_case_batch_must_be_a_batch(batch: object, msg: str) -> None:
    with _raises(f"Workload.worst_case_batch: {msg}"):
        dataclasses.replace(varlen(), worst_case_batch=batch)


def test_a_shuffled_dataset_is_checked_at_its_worst_rows_even_where_its_first_batch_is_longest() -> None:
    from tests.data.padded_workload import build_labels

    wl = build_labels()
    assert not wl.worst_case.uniform
    assert sample_bytes(wl.first_batch(4)) >= wl.worst_case.sample_bytes
    # The loop shuffles a map-style dataset: its first step is not the first batch. Before, the check
    # trained the workload as it is, and measured a shorter batch than it predicted (34% under).
    assert at_worst_case(wl, 4) is not wl
    assert at_worst_case(wl, 4).loss_weighting is wl.loss_weighting  # measured once, not per check
    config = TrainConfig(micro_batch_size=4)
    assert check_step(wl, config).measured == predict_memory(wl, config, verify=False).total
