from __future__ import annotations

import re

import pytest
from autotune.envs._codec import Levels, apply_action, blocks_at_level, knobs_to_config

from autotune import ConfigError


def test_levels_pick_the_hungriest_blocks_first() -> None:
    ranking = (2, 0, 3, 1)  # block 2 saves the most activation bytes
    assert blocks_at_level(0, ranking) == frozenset()
    assert blocks_at_level(1, ranking) == frozenset({2})
    assert blocks_at_level(2, ranking) == frozenset({2, 0})
    assert blocks_at_level(4, ranking) == frozenset({0, 1, 2, 3})
    config = knobs_to_config(Levels(accum=2, micro=3, precision=2, checkpoint=1), ranking)
    assert (config.micro_batch_size, config.grad_accum_steps) == (8, 4)
    assert config.precision == ("bf16", "fp32", "bf16", "fp32")
    assert config.checkpoint == (False, False, True, False)


def test_actions_are_deltas_clipped_at_the_ends_and_zero_is_mapped() -> None:
    k = Levels(accum=0, micro=7, precision=4, checkpoint=2)
    assert apply_action(k, (1, 1, 2, 0, 3), max_zero_stage=0) == Levels(accum=0, micro=7, precision=4, checkpoint=1)
    assert apply_action(k, (1, 1, 1, 1, 3), max_zero_stage=2).zero_stage == 2
    assert apply_action(k, (1, 1, 1, 1, 0), max_zero_stage=3) == k


def test_the_split_action_moves_micro_batch_and_accumulation_never_the_batch() -> None:
    k = Levels(accum=0, micro=5)  # 32 x 1
    smaller = apply_action(k, (2, 1, 1, 1, 0), max_zero_stage=0)
    assert (smaller.micro_batch_size, smaller.accum_steps) == (16, 2)
    assert apply_action(smaller, (0, 1, 1, 1, 0), max_zero_stage=0) == k
    assert apply_action(k, (0, 1, 1, 1, 0), max_zero_stage=0) == k  # accumulation 1 cannot halve
    one = Levels(accum=5, micro=0)  # 1 x 32
    assert apply_action(one, (2, 1, 1, 1, 0), max_zero_stage=0) == one  # micro-batch 1 cannot halve
    # the batch action is ignored without batch adaptation
    assert apply_action(k, (1, 2, 1, 1, 0), max_zero_stage=0) == k
    assert apply_action(k, (1, 0, 1, 1, 0), max_zero_stage=0) == k


def test_batch_adaptation_grows_by_accumulation_and_never_goes_below_the_minimum() -> None:
    k = Levels(accum=0, micro=5)
    grown = apply_action(k, (1, 2, 1, 1, 0), max_zero_stage=0, adapt_batch=True, min_batch=32)
    assert (grown.micro_batch_size, grown.accum_steps) == (32, 2)
    assert apply_action(grown, (1, 0, 1, 1, 0), max_zero_stage=0, adapt_batch=True, min_batch=32) == k
    assert apply_action(k, (1, 0, 1, 1, 0), max_zero_stage=0, adapt_batch=True, min_batch=32) == k
    top = Levels(accum=7, micro=6)
    assert apply_action(top, (1, 2, 1, 1, 0), max_zero_stage=0, adapt_batch=True).micro == 7


def test_default_knobs_keep_the_workload_batch() -> None:
    assert Levels.default_for(32).micro_batch_size == 32
    assert Levels.default_for(24).micro_batch_size in (16, 32)
    big = Levels.default_for(1024)
    assert (big.micro_batch_size, big.accum_steps) == (128, 8)
    assert Levels.default_for(1).effective_batch_size == 1


def test_invalid_knobs() -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape('Levels.micro must be an int in [0, 7], but got 8.')}$"):
        Levels(micro=8)
