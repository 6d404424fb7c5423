"""The policy's proposal for a model it never saw, as ``autotune study --policy-proposal`` enqueues it."""

from __future__ import annotations

from autotune.policies.transfer import propose

from autotune import Knobs
from tests.conftest import make_resmlp


def test_the_proposal_keeps_the_batch_and_fits_the_budget_in_the_simulator() -> None:
    workload = make_resmlp(n=256)
    knobs = propose(workload, memory_budget=None, seconds=0)
    assert isinstance(knobs, Knobs)
    assert knobs.batch_size == workload.batch_size  # the user's batch
