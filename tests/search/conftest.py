"""Fixtures of the search tests: a memory budget for the tiny workload, derived by measuring it."""

from __future__ import annotations

import pytest

from autotune import TrainConfig, load_workload, measure
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD


@pytest.fixture(scope="session")
def tiny_budget() -> int:
    """A budget between the peaks of the tiny workload's micro-batch 8 and 16 (fp32, no
    checkpointing): the PyTorch default (16) does not fit, its retry (8 x 2) does. Measured rather
    than written down, so the tests follow the memory tracker if it changes."""
    workload = load_workload(f"{TINY}:build")
    peaks = [
        measure(workload, TrainConfig(micro_batch_size=m, grad_accum_steps=16 // m), steps=1, warmup=1).peak_bytes
        for m in (8, 16)
    ]
    assert peaks[0] is not None and peaks[1] is not None and peaks[0] < peaks[1]
    return (peaks[0] + peaks[1]) // 2
