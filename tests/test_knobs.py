"""The shared knob encoding: validation, per-block expansion, and env <-> study round trips."""

from __future__ import annotations

import dataclasses
import re

import optuna
import pytest
from autotune.envs._codec import Levels, apply_action, knobs_to_config, level_counts, levels_near, levels_of

from autotune import ConfigError, Knobs, TrainConfig
from autotune.errors import SpecError, WorkloadError
from autotune.knobs import check_min_micro_batch, knobs_of_config, neighbours
from autotune.search.space import SearchSpace

RANKING = (2, 0, 3, 1)  # block 2 saves the most activation bytes, block 1 the least


def test_counts_pick_the_hungriest_blocks_and_accumulation_is_derived() -> None:
    k = Knobs(batch_size=64, micro_batch_size=8, ranks=2, zero_stage=3, low_precision_blocks=3, checkpoint_blocks=1)
    assert k.grad_accum_steps == 4
    assert k.blocks(RANKING) == (("bf16", "fp32", "bf16", "bf16"), (False, False, True, False))
    config = k.to_config(RANKING, base=TrainConfig(seed=7, grad_clip=None))
    assert config == TrainConfig(
        micro_batch_size=8,
        grad_accum_steps=4,
        ranks=2,
        zero_stage=3,
        precision=("bf16", "fp32", "bf16", "bf16"),
        checkpoint=(False, False, True, False),
        seed=7,
        grad_clip=None,
    )
    # Uniform settings collapse to one value, as a hand-written config would say them.
    everything = Knobs(batch_size=8, micro_batch_size=8, low_precision_blocks=4, checkpoint_blocks=4)
    assert (everything.to_config(RANKING).precision, everything.to_config(RANKING).checkpoint) == ("bf16", True)
    assert everything.describe() == "8x1 bf16:4 ckpt:4"
    assert k.describe() == "8x4 bf16:3 ckpt:1 zero3x2"


_ONE = {"batch_size": 8, "micro_batch_size": 8}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"batch_size": 30, "micro_batch_size": 8},
            "Knobs.micro_batch_size x ranks must divide batch_size, but got 8 x 1 and 30.",
        ),
        ({"batch_size": 8, "micro_batch_size": 0}, "Knobs.micro_batch_size must be an int >= 1, but got 0."),
        ({**_ONE, "zero_stage": 4}, "Knobs.zero_stage must be one of 0, 1, 2, 3, but got 4."),
        (
            {**_ONE, "low_precision": "int8"},
            "Knobs.low_precision must be one of ('fp32', 'bf16', 'fp16'), but got 'int8'.",
        ),
        ({**_ONE, "checkpoint_blocks": -1}, "Knobs.checkpoint_blocks must be an int >= 0, but got -1."),
        ({**_ONE, "outer_low_precision": 1}, "Knobs.outer_low_precision must be a bool, but got 1."),
    ],
)
def test_invalid_knobs_say_the_rule_and_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Knobs(**kwargs)  # type: ignore[arg-type]


def test_counts_beyond_the_model_are_refused() -> None:
    k = Knobs(batch_size=8, micro_batch_size=8, checkpoint_blocks=5)
    with pytest.raises(
        ConfigError, match=re.escape("Knobs.checkpoint_blocks must be <= the 4 blocks of the model, but got 5.")
    ):
        k.blocks(RANKING)
    with pytest.raises(
        ConfigError, match=re.escape("ranking must be a permutation of the block indices, but got (0, 0).")
    ):
        Knobs(batch_size=8, micro_batch_size=8).blocks((0, 0))


@pytest.mark.parametrize(
    "levels",
    [
        Levels(),
        Levels(accum=2, micro=3, precision=2, checkpoint=1),
        Levels(accum=4, micro=0, precision=4, checkpoint=3),
    ],
)
def test_an_environment_configuration_is_a_study_trial(levels: Levels) -> None:
    """What an agent reaches (levels) is a point of the study's space: enqueue it, read it back."""
    knobs = levels.knobs(len(RANKING))
    assert knobs.to_config(RANKING) == knobs_to_config(levels, RANKING)
    space = SearchSpace(batch_sizes=(knobs.batch_size,), ranking=RANKING, max_micro_batch=1000)
    trial = optuna.trial.FixedTrial(space.params(knobs))
    assert space.suggest(trial) == knobs
    assert space.config(knobs) == knobs_to_config(levels, RANKING)


def test_levels_on_ranks_scale_the_effective_batch() -> None:
    knobs = Levels(accum=1, micro=3, zero_stage=2).knobs(4, ranks=2)
    assert (knobs.batch_size, knobs.grad_accum_steps, knobs.zero_stage) == (32, 2, 2)
    assert Levels(zero_stage=2).knobs(4).zero_stage == 0  # one rank: no ZeRO (it only adds a master copy)


# ---- the outer precision (issue 40) ----------------------------------------------------------------


def test_the_outer_low_precision_reaches_the_config_and_round_trips() -> None:
    recipe = Knobs(
        batch_size=8, micro_batch_size=8, low_precision_blocks=4, checkpoint_blocks=4, outer_low_precision=True
    )
    config = recipe.to_config(RANKING)
    assert (config.precision, config.outer_precision, config.checkpoint) == ("bf16", "bf16", True)
    assert recipe.describe() == "8x1 bf16:4+outer ckpt:4"
    head_only = Knobs(batch_size=8, micro_batch_size=8, low_precision="fp16", outer_low_precision=True)
    assert head_only.to_config(RANKING).outer_precision == "fp16"
    assert head_only.describe() == "8x1 fp16:0+outer"
    space = SearchSpace(batch_sizes=(8,), ranking=RANKING, max_micro_batch=64, low_precisions=("bf16",))
    assert space.suggest(optuna.trial.FixedTrial(space.params(recipe))) == recipe


def test_knob_levels_carry_the_outer_precision_outside_the_action_space() -> None:
    from autotune.envs._codec import levels_of

    config = TrainConfig(micro_batch_size=8, precision="bf16")
    assert levels_of(config, 4) == Levels(micro=3, precision=4)
    recipe = TrainConfig(micro_batch_size=8, precision="bf16", outer_precision="bf16", checkpoint=True)
    levels = levels_of(recipe, 4)
    assert levels == Levels(micro=3, precision=4, checkpoint=4, outer=True)
    # The round trip: levels -> knobs -> config -> levels, and knobs -> levels near any start.
    assert levels.knobs(4).outer_low_precision is True
    assert levels.knobs(4).describe() == "8x1 bf16:4+outer ckpt:4"
    assert knobs_to_config(levels, RANKING) == recipe
    assert levels_near(levels.knobs(4), Levels(micro=3), 4) == levels
    head_only = Levels(accum=1, micro=2, outer=True)  # every block fp32, the outer parts bf16
    head_config = knobs_to_config(head_only, RANKING)
    assert (head_config.precision, head_config.outer_precision) == ("fp32", "bf16")
    assert levels_of(head_config, 4) == head_only
    assert Levels(micro=3, precision=4).knobs(4).outer_low_precision is False  # the default keeps it fp32
    # The policy's five entries and a sixth keep it; a seventh moves it (0: fp32, 2: reduced).
    assert apply_action(levels, (1, 1, 1, 1, 0), max_zero_stage=0) == levels
    assert apply_action(levels, (1, 1, 1, 1, 0, 1), max_zero_stage=0) == levels
    assert apply_action(levels, (1, 1, 1, 1, 0, 1, 0), max_zero_stage=0) == Levels(micro=3, precision=4, checkpoint=4)
    assert apply_action(head_only, (1, 1, 1, 1, 0, 1, 2), max_zero_stage=0) == head_only
    plain = Levels(micro=3)
    assert apply_action(plain, (1, 1, 1, 1, 0, 1, 2), max_zero_stage=0) == Levels(micro=3, outer=True)
    with pytest.raises(ConfigError, match=r"^Levels\.outer must be a bool, but got 1\.$"):
        Levels(outer=1)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2"])
def test_a_micro_batch_floor_is_an_int_of_at_least_one_or_none(value: object) -> None:
    message = f"min_micro_batch must be an int >= 1 or None, but got {value!r}."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        check_min_micro_batch(value)
    assert (check_min_micro_batch(None), check_min_micro_batch(1), check_min_micro_batch(4)) == (None, 1, 4)


def test_the_floor_rule_names_the_callers_field_and_raises_its_error() -> None:
    # SearchSpace and SimulatedEnv took a bool for an int before the one rule: now refused as elsewhere.
    with pytest.raises(SpecError, match=r"^SearchSpace\.min_micro_batch must be an int >= 1 or None, but got True\.$"):
        check_min_micro_batch(True, name="SearchSpace.min_micro_batch", error=SpecError)
    with pytest.raises(WorkloadError, match=r"^Workload\.min_micro_batch must be an int >= 1 or None, but got 0\.$"):
        check_min_micro_batch(0, name="Workload.min_micro_batch", error=WorkloadError)


def _k(micro: int, low: int = 0, ckpt: int = 0, **kwargs: object) -> Knobs:
    return Knobs(batch_size=8, micro_batch_size=micro, low_precision_blocks=low, checkpoint_blocks=ckpt, **kwargs)  # type: ignore[arg-type]


def test_the_neighbours_step_each_knob_along_its_table_throughput_raising_moves_first() -> None:
    tables = {"micro_batches": (1, 2, 4, 8), "block_counts": (0, 1, 2)}
    assert neighbours(_k(2, 1, 1), **tables) == [  # type: ignore[arg-type]
        _k(4, 1, 1),  # a larger micro-batch
        _k(2, 1, 0),  # one recomputed block fewer
        _k(2, 2, 1),  # one low-precision block more
        _k(2, 1, 1, outer_low_precision=True),  # the outer parts in low precision
        _k(1, 1, 1),  # then the reverses
        _k(2, 1, 2),
        _k(2, 0, 1),
    ]
    # At the ends of the tables, and without low precision or the outer parts: fewer moves.
    assert neighbours(_k(8, 0, 2), **tables, low_precision=False) == [_k(8, 0, 1), _k(4, 0, 2)]  # type: ignore[arg-type]
    assert neighbours(_k(8, 2, 0), **tables, outer=False) == [_k(4, 2, 0), _k(8, 2, 1), _k(8, 1, 0)]  # type: ignore[arg-type]


def test_the_neighbours_step_to_the_next_entry_of_a_sparse_table_and_a_value_off_it_stays() -> None:
    # The environments' quarters of 6 blocks, and their power-of-two splits: the next entry, not +1.
    quarters = level_counts(6)
    assert quarters == (0, 2, 3, 4, 6)
    around = neighbours(_k(4, 3, 2), micro_batches=(2, 4, 8), block_counts=quarters, outer=False)
    assert around == [_k(8, 3, 2), _k(4, 3, 0), _k(4, 4, 2), _k(2, 3, 2), _k(4, 3, 3), _k(4, 2, 2)]
    # A micro-batch the table lacks does not move; the counts still do.
    assert neighbours(_k(1, 0, 0), micro_batches=(2, 4), block_counts=(0, 1), outer=False) == [_k(1, 1, 0), _k(1, 0, 1)]


def test_the_neighbours_move_the_zero_stage_where_there_are_stages() -> None:
    here = Knobs(batch_size=8, micro_batch_size=4, ranks=2, zero_stage=1)
    moved = neighbours(here, micro_batches=(4,), block_counts=(0,), zero_stages=(0, 1, 2, 3), low_precision=False)
    assert moved == [dataclasses.replace(here, zero_stage=0), dataclasses.replace(here, zero_stage=2)]


def test_levels_near_picks_the_level_nearest_where_two_cover_the_same_count() -> None:
    assert level_counts(3) == (0, 1, 2, 3)  # levels 2 and 3 both cover 2 of 3 blocks
    two = Knobs(batch_size=8, micro_batch_size=2, checkpoint_blocks=2)
    assert levels_near(two, Levels(micro=1, accum=2, checkpoint=1), 3).checkpoint == 2
    assert levels_near(two, Levels(micro=1, accum=2, checkpoint=4), 3).checkpoint == 3
    assert levels_near(two, Levels(micro=1, accum=2, checkpoint=4, zero_stage=2), 3) == Levels(
        micro=1,
        accum=2,
        checkpoint=3,
        zero_stage=2,  # one rank: the stage is the levels' own
    )


def test_selective_blocks_follow_the_wholly_recomputed_ones_and_round_trip_through_a_config() -> None:
    knobs = Knobs(batch_size=8, micro_batch_size=2, checkpoint_blocks=1, selective_blocks=2, low_precision_blocks=1)
    assert knobs.describe() == "2x4 bf16:1 ckpt:1 sel:2"
    config = knobs.to_config([3, 1, 0, 2])  # block 3 hungriest: full; blocks 1 and 0 selective
    assert config.checkpoint == ("selective", "selective", False, True)
    assert config.precision == ("fp32", "fp32", "fp32", "bf16")
    assert knobs_of_config(config, 4) == knobs
    every = Knobs(batch_size=8, micro_batch_size=8, selective_blocks=4).to_config([0, 1, 2, 3])
    assert every.checkpoint == "selective"  # uniform: one value
    assert knobs_of_config(every, 4) == Knobs(batch_size=8, micro_batch_size=8, selective_blocks=4)


def test_more_recomputed_blocks_than_the_model_has_is_refused_with_both_counts() -> None:
    knobs = Knobs(batch_size=8, micro_batch_size=8, checkpoint_blocks=3, selective_blocks=2)
    message = "Knobs.checkpoint_blocks + selective_blocks must be <= the 4 blocks of the model, but got 3 + 2."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        knobs.to_config([0, 1, 2, 3])
    with pytest.raises(ConfigError, match=r"^Knobs\.selective_blocks must be an int >= 0, but got -1\.$"):
        Knobs(batch_size=8, micro_batch_size=8, selective_blocks=-1)


def test_the_neighbours_move_the_selective_level_when_asked() -> None:
    tables = {"micro_batches": (2,), "block_counts": (0, 1, 2, 3), "low_precision": False}
    here = _k(2, 0, 1, selective_blocks=1)  # block 0 full, block 1 selective, of 3
    assert neighbours(here, **tables, selective=True) == [  # type: ignore[arg-type]
        _k(2, 0, 0, selective_blocks=1),  # the band one count down: one recomputed count fewer
        _k(2, 0, 0, selective_blocks=2),  # the full block selective instead
        _k(2, 0, 1),  # one selective block fewer
        _k(2, 0, 2, selective_blocks=1),  # then the reverses: the band one count up
        _k(2, 0, 2),  # the selective block full instead
        _k(2, 0, 1, selective_blocks=2),  # one selective block more
    ]
    # Without the level a selective block stays one: it moves with the band only.
    assert neighbours(here, **tables) == [_k(2, 0, 0, selective_blocks=1), _k(2, 0, 2, selective_blocks=1)]  # type: ignore[arg-type]
    # With none selective, the moves are the same as before the level, plus its two.
    plain = neighbours(_k(2, 0, 1), **tables, selective=True)  # type: ignore[arg-type]
    assert plain == [_k(2, 0, 0), _k(2, 0, 0, selective_blocks=1), _k(2, 0, 2), _k(2, 0, 1, selective_blocks=1)]


def test_knob_levels_carry_the_selective_band_outside_the_action_space() -> None:
    levels = Levels(micro=1, accum=2, checkpoint=1, selective=2)
    assert levels.knobs(8).checkpoint_blocks == 2 and levels.knobs(8).selective_blocks == 4
    config = knobs_to_config(levels, ranking=tuple(range(8)))
    assert config.checkpoint == (True, True, "selective", "selective", "selective", "selective", False, False)
    assert levels_of(config, 8) == levels
    assert levels_near(levels.knobs(8), Levels(micro=1, accum=2), 8) == levels
    message = "Levels.checkpoint + selective must be <= 4, but got 3 + 2."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        Levels(checkpoint=3, selective=2)
    # The policy's five entries keep the band; a sixth moves it; a full level up at the end takes
    # one of its quarters.
    assert apply_action(levels, (1, 1, 1, 1, 0), max_zero_stage=0) == levels
    assert apply_action(levels, (1, 1, 1, 1, 0, 2), max_zero_stage=0).selective == 3
    assert apply_action(levels, (1, 1, 1, 1, 0, 0), max_zero_stage=0).selective == 1
    moved = apply_action(Levels(checkpoint=1, selective=3), (1, 1, 1, 2, 0), max_zero_stage=0)
    assert (moved.checkpoint, moved.selective) == (2, 2)
