"""The memory model's promise on architectures nobody wrote by hand (``random2:SEED``, which draws
shared modules, skip connections, BatchNorm, dropout and dict batches as users write them): every
prediction is within the tolerance of a real step or flagged unverified, and recompute leaves the
model's buffers as a plain step does. A fixed set of seeds here (seconds);
``benchmarks/property_sweep.py`` runs hundreds."""

from __future__ import annotations

import random
import warnings

import pytest

from autotune import measure
from autotune.errors import PredictionWarning
from autotune.memory.audit import audit_predictions, draw_configs, same_state_after_recompute
from autotune.zoo import random_workload
from autotune.zoo.random_arch import sample_spec

#: Between them: shared blocks, a tied head, skip connections (added and concatenated),
#: BatchNorm, a custom running buffer, dropout, dict batches and two outputs.
SEEDS = [0, 1, 2, 3, 4, 5]


def test_the_seeds_draw_every_structure() -> None:
    from autotune.zoo.random_structure import FEATURES

    drawn = set().union(*(sample_spec(seed, version=2).features for seed in SEEDS))
    assert drawn == FEATURES


@pytest.mark.parametrize("seed", SEEDS)
def test_every_prediction_holds_or_is_flagged(seed: int) -> None:
    workload = random_workload(seed, version=2)
    n = len(workload.block_names())
    configs = draw_configs(n, random.Random(seed), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PredictionWarning)  # a flagged prediction is what this allows
        rows = audit_predictions(workload, configs, measure=measure)
    broken = [(r.config, r.predicted, r.measured, r.kind) for r in rows if not r.holds]
    assert broken == []
    assert all(same_state_after_recompute(workload, c) for c in configs)
