"""The simulator's cost model over every knob setting of a batch (the adaptive run's plan)."""

from __future__ import annotations

from autotune.envs.calibration import load_profile
from autotune.envs.costmodel import ranked_settings, step_cost
from autotune.envs.simulated import PROFILE_DIR

from autotune.measurement.objective import per_gib

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
