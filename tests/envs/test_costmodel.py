"""The simulator's cost model over every knob setting of a batch (the adaptive run's plan)."""

from __future__ import annotations

import dataclasses

import pytest
from autotune.envs.calibration import load_profile, memory_table, peak_table_index, selective_table_index
from autotune.envs.costmodel import SELECTIVE_FRACTION, ranked_settings, step_cost
from autotune.envs.simulated import PROFILE_DIR

from autotune import load_workload
from autotune.knobs import KnobLevels
from autotune.measurement.objective import per_gib
from tests.paths import TINY_WORKLOAD

PROFILE = load_profile(PROFILE_DIR / "gpt-tiny.json")  # batch 32


def test_every_split_of_the_batch_is_ranked_by_the_simulated_objective() -> None:
    ranked = ranked_settings(PROFILE, 32)
    splits = {(lv.micro_batch_size, lv.accum_steps) for _, lv in ranked}
    assert splits == {(32, 1), (16, 2), (8, 4), (4, 8), (2, 16), (1, 32)}
    assert len(ranked) == 6 * 5 * 5  # precision and checkpoint quarters of each split
    for value, levels in ranked:
        cost = step_cost(PROFILE, levels)
        assert value == per_gib(32 / cost.seconds, cost.peak_bytes)
    values = [value for value, _ in ranked]
    assert values == sorted(values, reverse=True)


def test_without_reduced_precision_only_fp32_settings_are_ranked() -> None:
    ranked = ranked_settings(PROFILE, 32, reduced=False)
    assert len(ranked) == 6 * 5 and {lv.precision for _, lv in ranked} == {0}


def test_a_selective_block_costs_a_fraction_of_recompute_and_keeps_between_none_and_full() -> None:
    # The block-sum model (a synthetic profile's): each block keeps its input and a third of the rest.
    blocks = tuple(
        dataclasses.replace(b, selective_per_sample=(b.fp32_per_sample - b.input_per_sample) / 3)
        for b in PROFILE.blocks
    )
    profile = dataclasses.replace(PROFILE, blocks=blocks, peak_table=None)
    none, selective, full = (
        step_cost(profile, KnobLevels(micro=3, accum=2, checkpoint=c, selective=s)) for c, s in ((0, 0), (0, 4), (4, 0))
    )
    assert full.peak_bytes < selective.peak_bytes < none.peak_bytes
    assert none.seconds < selective.seconds < full.seconds
    assert selective.seconds - none.seconds == pytest.approx(SELECTIVE_FRACTION * (full.seconds - none.seconds))
    # A profile without the selective figures (written before the level): no saving is assumed.
    assert (
        step_cost(PROFILE, KnobLevels(micro=3, accum=2, selective=4)).peak_bytes
        == step_cost(PROFILE, KnobLevels(micro=3, accum=2)).peak_bytes
    )


def test_the_memory_table_predicts_every_selective_setting_between_none_and_full() -> None:
    table, selective, per_sample = memory_table(load_workload(f"{TINY_WORKLOAD}:build"), reduced_runs=False)
    assert len(table) == 8 * 5 * 5 * 2 and len(selective) == 8 * 5 * 10 * 2
    assert all(x > 0 for x in per_sample)
    none, full = (table[peak_table_index(KnobLevels(micro=3, checkpoint=c))] for c in (0, 4))
    every = selective[selective_table_index(KnobLevels(micro=3, selective=4))]
    assert full < every < none
