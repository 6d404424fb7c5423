"""Workloads for the multi-rank tests, loaded by reference so that every rank can rebuild them."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from torch import nn

from autotune import Workload
from tests.data.my_workload import build as build_tiny


def build() -> Workload:
    """3 blocks of Linear(32, 32) + Tanh and a head: 3,234 parameters in 8 tensors."""
    return build_tiny()


def fails_on_rank_1() -> Workload:
    base = build_tiny()

    def loss_fn(model: nn.Module, batch: Any) -> Any:
        if os.environ.get("RANK") == "1":
            raise RuntimeError("rank 1 refuses this batch")
        return base.loss_fn(model, batch)

    return dataclasses.replace(base, name="my-net-fails", loss_fn=loss_fn)


def hangs_on_rank_1() -> Workload:
    """Rank 1 never finishes building it: the session's timeout must end the ranks."""
    if os.environ.get("RANK") == "1":
        time.sleep(600)
    return dataclasses.replace(build_tiny(), name="my-net-hangs")
