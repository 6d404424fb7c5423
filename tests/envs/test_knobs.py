from __future__ import annotations

import re

import pytest
from autotune.envs.knobs import KnobLevels, apply_action, blocks_at_level, knobs_to_config

from autotune import ConfigError


def test_levels_pick_the_hungriest_blocks_first() -> None:
    ranking = (2, 0, 3, 1)  # block 2 saves the most activation bytes
    assert blocks_at_level(0, ranking) == frozenset()
    assert blocks_at_level(1, ranking) == frozenset({2})
    assert blocks_at_level(2, ranking) == frozenset({2, 0})
    assert blocks_at_level(4, ranking) == frozenset({0, 1, 2, 3})
    config = knobs_to_config(KnobLevels(accum=2, micro=3, precision=2, checkpoint=1), ranking)
    assert (config.micro_batch_size, config.grad_accum_steps) == (8, 4)
    assert config.precision == ("bf16", "fp32", "bf16", "fp32")
    assert config.checkpoint == (False, False, True, False)


def test_actions_are_deltas_clipped_at_the_ends_and_zero_is_mapped() -> None:
    k = KnobLevels(accum=0, micro=7, precision=4, checkpoint=2)
    assert apply_action(k, (0, 2, 2, 0, 3), max_zero_stage=0) == KnobLevels(accum=0, micro=7, precision=4, checkpoint=1)
    assert apply_action(k, (2, 0, 1, 1, 3), max_zero_stage=2).zero_stage == 2
    assert apply_action(k, (1, 1, 1, 1, 0), max_zero_stage=3) == k


def test_default_knobs_follow_the_workload_batch() -> None:
    assert KnobLevels.default_for(32).micro_batch_size == 32
    assert KnobLevels.default_for(24).micro_batch_size in (16, 32)
    assert KnobLevels.default_for(1000).micro_batch_size == 128


def test_invalid_knobs() -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape('KnobLevels.micro must be an int in [0, 7], but got 8.')}$"):
        KnobLevels(micro=8)
