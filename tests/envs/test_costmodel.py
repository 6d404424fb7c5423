"""The simulator's cost model over every knob setting of a batch (the adaptive run's plan)."""

from __future__ import annotations

import dataclasses

import pytest
from autotune.envs._codec import Levels, knobs_to_config
from autotune.envs.calibration import (
    INFEASIBLE_PEAK,
    load_profile,
    memory_table,
    peak_table_index,
    selective_table_index,
)
from autotune.envs.costmodel import SELECTIVE_FRACTION, ranked_settings, step_cost
from autotune.envs.simulated import PROFILE_DIR

from autotune import load_workload
from autotune.measurement.objective import per_gib
from autotune.memory.blocks import profile_blocks
from autotune.memory.predict import predict_memory, profile_memory
from autotune.memory.profile import outer_mode
from autotune.tuning import TUNING
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
        step_cost(profile, Levels(micro=3, accum=2, checkpoint=c, selective=s)) for c, s in ((0, 0), (0, 4), (4, 0))
    )
    assert full.peak_bytes < selective.peak_bytes < none.peak_bytes
    assert none.seconds < selective.seconds < full.seconds
    assert selective.seconds - none.seconds == pytest.approx(SELECTIVE_FRACTION * (full.seconds - none.seconds))
    # A profile without the selective figures (written before the level): no saving is assumed.
    assert (
        step_cost(PROFILE, Levels(micro=3, accum=2, selective=4)).peak_bytes
        == step_cost(PROFILE, Levels(micro=3, accum=2)).peak_bytes
    )


def test_the_memory_table_predicts_every_selective_setting_between_none_and_full() -> None:
    table, selective, per_sample = memory_table(load_workload(f"{TINY_WORKLOAD}:build"), reduced_runs=False)
    assert len(table) == 8 * 5 * 5 * 2 and len(selective) == 8 * 5 * 10 * 2
    assert all(x > 0 for x in per_sample)
    none, full = (table[peak_table_index(Levels(micro=3, checkpoint=c))] for c in (0, 4))
    every = selective[selective_table_index(Levels(micro=3, selective=4))]
    assert full < every < none


# ---- the outer precision (issue 40) ------------------------------------------------------------


@pytest.mark.parametrize("slowdown", [0.5, 2.0])
def test_the_outer_parts_reduced_follow_the_profile_s_table_and_the_blocks_reduced_speed(slowdown: float) -> None:
    assert PROFILE.peak_table is not None
    # A profile whose memory model says the outer parts in bf16 keep 1 MiB less at every setting.
    profile = dataclasses.replace(
        PROFILE, reduced_slowdown=slowdown, outer_peak_table=tuple(x - 2**20 for x in PROFILE.peak_table)
    )
    fp32, outer = (step_cost(profile, Levels(micro=3, accum=2, checkpoint=2, outer=o)) for o in (False, True))
    assert outer.peak_bytes == fp32.peak_bytes - 2**20
    # The outer share of each micro-batch (1 - phi) at the blocks' reduced speed: 4 micro-batches of 8.
    micro = profile.micro_fixed_seconds + 8 * profile.micro_seconds_per_sample
    assert outer.seconds - fp32.seconds == pytest.approx(4 * micro * (1 - profile.blocks_fraction) * (slowdown - 1))
    assert (outer.seconds < fp32.seconds) == (slowdown < 1)
    # A selective setting without outer selective figures: the outer table without its band.
    banded = step_cost(profile, Levels(micro=3, accum=2, checkpoint=2, selective=1, outer=True))
    assert banded.peak_bytes == outer.peak_bytes
    # A profile without the outer figures (a shipped one, written before the knob): outer fp32.
    plain = dataclasses.replace(PROFILE, reduced_slowdown=slowdown)
    assert step_cost(plain, Levels(micro=3, accum=2, outer=True)) == step_cost(plain, Levels(micro=3, accum=2))


def test_the_memory_table_with_the_outer_parts_reduced_is_the_memory_model_s_prediction() -> None:

    workload = load_workload(f"{TINY_WORKLOAD}:build")
    table, selective, _ = memory_table(workload, selective=False, outer=True)
    assert len(table) == 8 * 5 * 5 * 2 and selective == ()
    profile = profile_memory(workload, modes=(outer_mode("fp32", "bf16"), "bf16@bf16"), verify=False)

    ranking = profile_blocks(workload, micro_batch_size=TUNING.profile_micro_batch).ranked()
    for levels in (Levels(micro=3, outer=True), Levels(micro=3, precision=4, checkpoint=4, outer=True)):
        config = knobs_to_config(levels, ranking)
        assert config.outer_precision == "bf16"
        assert table[peak_table_index(levels)] == predict_memory(workload, config, profile=profile).total
    # Where the model cannot run the reduced precision, every outer setting is refused.
    refused, _, _ = memory_table(workload, selective=False, outer=True, reduced_runs=False)
    assert set(refused) == {INFEASIBLE_PEAK}
