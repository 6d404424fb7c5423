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
from autotune.envs.costmodel import SELECTIVE_FRACTION, ranked_settings, step_cost, step_seconds
from autotune.envs.simulated import PROFILE_DIR

from autotune import load_workload
from autotune.measurement.objective import per_gib
from autotune.memory.blocks import profile_blocks
from autotune.memory.predict import predict_memory, profile_memory
from autotune.memory.profile import outer_mode
from autotune.tuning import TUNING
from tests.paths import TINY_WORKLOAD

SHIPPED = load_profile(PROFILE_DIR / "gpt-tiny.json")  # batch 32
# The shipped profile as written before the selective and outer tables: the tests below add the
# figures each needs, and the ones of a profile without them check what is assumed there.
PROFILE = dataclasses.replace(
    SHIPPED,
    blocks=tuple(dataclasses.replace(b, selective_per_sample=None) for b in SHIPPED.blocks),
    selective_peak_table=None,
    outer_peak_table=None,
    outer_selective_peak_table=None,
)


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


def test_the_selective_bands_and_the_outer_precision_are_ranked_where_asked_for() -> None:
    ranked = ranked_settings(PROFILE, 32, selective=True, outer=True)
    # Each checkpoint level c with every selective band 0..4-c (15 pairs), each with the outer parts
    # in fp32 and in bf16.
    assert len(ranked) == 6 * 5 * 15 * 2 and len(set(ranked)) == len(ranked)
    assert {(lv.checkpoint, lv.selective) for _, lv in ranked} == {(c, s) for c in range(5) for s in range(5 - c)}
    for value, levels in ranked:
        cost = step_cost(PROFILE, levels)
        assert value == per_gib(32 / cost.seconds, cost.peak_bytes)
    # The outer parts move with the blocks' reduced precision only.
    fp32 = ranked_settings(PROFILE, 32, reduced=False, selective=True, outer=True)
    assert len(fp32) == 6 * 15 and not any(lv.outer or lv.precision for _, lv in fp32)
    assert ranked_settings(PROFILE, 32, selective=False, outer=False) == ranked_settings(PROFILE, 32)


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


def test_the_memory_tables_on_a_study_s_profile_make_only_the_runs_it_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    # The policy's proposal after a study's baselines: their modes were profiled for their checks.
    from tests.profile_memo import counted_runs

    workload = load_workload(f"{TINY_WORKLOAD}:build")
    study = profile_memory(workload, modes=("fp32", "bf16"), verify=False)
    runs = counted_runs(monkeypatch)  # every fake run made here, none taken from an earlier test
    on_study = memory_table(workload, reuse=study)
    assert runs == ["selective"] * 4  # two sizes, two modes
    runs.clear()
    assert memory_table(workload) == on_study  # byte for byte what the tables alone give
    assert runs == ["none", "none", "full", "full", "selective", "selective"] * 2


# ---- domain randomization of the selective level and the outer precision (issues 42, 40) ----------


def test_a_synthetic_profile_models_the_outer_parts_by_its_blocks_reduced_bytes() -> None:
    """No memory table at all (a synthetic profile): the outer activations and temporaries at the
    blocks' reduced-over-fp32 bytes, their time at the blocks' reduced speed."""
    profile = dataclasses.replace(PROFILE, peak_table=None, reduced_slowdown=2.0)
    fp32, outer = (step_cost(profile, Levels(micro=3, accum=0, outer=o)) for o in (False, True))
    ratio = sum(b.reduced_per_sample for b in PROFILE.blocks) / sum(b.fp32_per_sample for b in PROFILE.blocks)
    outer_bytes = 8 * (PROFILE.other_activation_per_sample + PROFILE.temporaries_per_sample)
    assert 0 < ratio < 1
    assert fp32.peak_bytes - outer.peak_bytes == pytest.approx(outer_bytes * (1 - ratio), abs=1)
    micro = PROFILE.micro_fixed_seconds + 8 * PROFILE.micro_seconds_per_sample
    assert outer.seconds - fp32.seconds == pytest.approx(micro * (1 - PROFILE.blocks_fraction) * (2.0 - 1))


def test_domain_randomization_draws_selective_figures_and_keeps_a_profile_s_own() -> None:
    import numpy as np
    from autotune.envs.costmodel import SYNTHETIC_SELECTIVE_SHARE, randomized_profile

    assert PROFILE.blocks[0].selective_per_sample is None  # as a profile written before the level
    shares, sigmas = set(), set()
    for seed in range(20):
        synthetic = randomized_profile(PROFILE, np.random.default_rng(seed))
        assert synthetic.peak_table is None and synthetic.outer_peak_table is None
        assert synthetic.selective_fraction is not None
        assert SELECTIVE_FRACTION / 2 <= synthetic.selective_fraction <= min(2 * SELECTIVE_FRACTION, 1.0)
        sigmas.add(synthetic.selective_fraction)
        for b in synthetic.blocks:
            assert b.selective_per_sample is not None
            rest = b.fp32_per_sample - b.input_per_sample
            if rest > 0:
                share = b.selective_per_sample / rest
                assert SYNTHETIC_SELECTIVE_SHARE[0] <= share <= SYNTHETIC_SELECTIVE_SHARE[1]
                shares.add(round(share, 9))
        # So a selective level saves memory there and costs a fraction of recompute's time.
        none, selective, full = (
            step_cost(synthetic, Levels(micro=3, checkpoint=c, selective=s)) for c, s in ((0, 0), (0, 4), (4, 0))
        )
        assert full.peak_bytes <= selective.peak_bytes < none.peak_bytes
        assert none.seconds < selective.seconds < full.seconds
    assert len(shares) == 20 and len(sigmas) == 20  # one draw per synthetic model
    # A profile's own selective figures are scaled with its other bytes, not drawn.
    measured = dataclasses.replace(
        PROFILE, blocks=tuple(dataclasses.replace(b, selective_per_sample=1000.0) for b in PROFILE.blocks)
    )
    synthetic = randomized_profile(measured, np.random.default_rng(0))
    scale = synthetic.blocks[0].input_per_sample / next(
        b.input_per_sample for b in PROFILE.blocks if b.name == synthetic.blocks[0].name
    )
    assert synthetic.blocks[0].selective_per_sample == pytest.approx(1000.0 * scale)


# ---- the reduced precision's two factors (issue 40) ---------------------------------------------


def test_one_factor_is_the_model_before_the_split_and_two_time_each_term_by_its_own() -> None:
    gpu = dataclasses.replace(PROFILE, reduced_slowdown=0.25, micro_fixed_seconds=0.05)
    one = dataclasses.replace(gpu, reduced_fixed_slowdown=None)
    same = dataclasses.replace(gpu, reduced_fixed_slowdown=0.25)
    split = dataclasses.replace(gpu, reduced_fixed_slowdown=1.0)
    everything = range(len(PROFILE.blocks))
    for b in (1, 8, 32):
        kw = {"micro_batch_size": b, "accum_steps": 32 // b, "reduced": everything, "recomputed": ()}
        assert step_seconds(same, **kw) == pytest.approx(step_seconds(one, **kw), rel=1e-12)
        phi = gpu.blocks_fraction
        a_ps = 1 - phi + phi * 0.25
        expected = gpu.step_fixed_seconds + (32 // b) * (0.05 * 1.0 + b * gpu.micro_seconds_per_sample * a_ps)
        assert step_seconds(split, **kw) == pytest.approx(expected, rel=1e-12)
        fp32 = step_seconds(split, **{**kw, "reduced": ()})
        # bf16's speed-up shrinks with the micro-batch where the launches do not speed up.
        assert step_seconds(split, **kw) / fp32 > step_seconds(one, **kw) / fp32
    # A launch-bound micro-batch of one: bf16 gains little over fp32; one factor reads it 4x faster.
    tiny = {"micro_batch_size": 1, "accum_steps": 32, "recomputed": ()}
    assert step_seconds(one, reduced=everything, **tiny) / step_seconds(one, reduced=(), **tiny) < 0.35
    assert step_seconds(split, reduced=everything, **tiny) / step_seconds(split, reduced=(), **tiny) > 0.8
