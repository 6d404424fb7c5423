"""The search space: micro x accum x ranks == effective batch, levels over ranked blocks, params round trip."""

from __future__ import annotations

import re

import optuna
import pytest

from autotune import Knobs
from autotune.config import TrainConfig
from autotune.errors import SpecError
from autotune.search.space import SearchSpace, divisors
from autotune.search.spec import BlockOverride


def _space(**kw: object) -> SearchSpace:
    args: dict[str, object] = {"batch_sizes": (32,), "ranking": (2, 0, 3, 1), "max_micro_batch": 1000}
    args.update(kw)
    return SearchSpace(**args)  # type: ignore[arg-type]


def _knobs(**kw: object) -> Knobs:
    args: dict[str, object] = {
        "batch_size": 32,
        "ranks": 1,
        "micro_batch_size": 8,
        "zero_stage": 0,
        "low_precision": "bf16",
        "low_precision_blocks": 0,
        "checkpoint_blocks": 0,
    }
    args.update(kw)
    return Knobs(**args)  # type: ignore[arg-type]


def test_divisors() -> None:
    assert divisors(12) == (1, 2, 3, 4, 6, 12)


def test_every_micro_batch_choice_keeps_the_effective_batch() -> None:
    space = _space(batch_sizes=(24, 48), ranks=(1, 2, 4), zero_stages=(0, 2))
    for b in space.batch_sizes:
        for r in space.ranks:
            for m in space.micro_batch_choices(b, r):
                assert space.config(_knobs(batch_size=b, ranks=r, micro_batch_size=m)).effective_batch_size == b


def test_the_data_caps_the_micro_batch() -> None:
    assert _space(max_micro_batch=10).micro_batch_choices(32, 1) == (1, 2, 4, 8)


def test_levels_apply_to_the_hungriest_blocks_first() -> None:
    config = _space().config(_knobs(low_precision_blocks=2, checkpoint_blocks=1))
    assert config.precision == ("bf16", "fp32", "bf16", "fp32")  # ranking (2, 0, 3, 1): blocks 2 and 0
    assert config.checkpoint == (False, False, True, False)
    assert config.grad_accum_steps == 4


def test_uniform_levels_collapse_to_one_value() -> None:
    config = _space().config(_knobs(low_precision_blocks=4, checkpoint_blocks=0))
    assert (config.precision, config.checkpoint) == ("bf16", False)


def test_overrides_pin_blocks_whatever_the_levels() -> None:
    space = _space(overrides={2: BlockOverride(precision="fp32"), 1: BlockOverride(checkpoint=True)})
    config = space.config(_knobs(low_precision_blocks=4))
    assert config.precision == ("bf16", "bf16", "fp32", "bf16")
    assert config.checkpoint == (False, True, False, False)


def test_other_fields_come_from_the_base_config() -> None:
    config = _space(base=TrainConfig(seed=5, grad_clip=None)).config(_knobs())
    assert (config.seed, config.grad_clip) == (5, None)


def test_params_read_back_as_the_same_knobs() -> None:
    space = _space(batch_sizes=(16, 32), ranks=(1, 2), zero_stages=(0, 2), low_precisions=("bf16", "fp16"))
    knobs = _knobs(batch_size=16, ranks=2, micro_batch_size=4, zero_stage=2, low_precision="fp16", checkpoint_blocks=3)
    params = space.params(knobs)
    assert params == {
        "batch_size": 16,
        "ranks": 2,
        "micro_batch_size[B=16,R=2]": 4,
        "zero_stage": 2,
        "low_precision": "fp16",
        "low_precision_blocks": 0,
        "outer_low_precision": False,
        "checkpoint_blocks": 3,
    }
    assert space.suggest(optuna.trial.FixedTrial(params)) == knobs


def test_a_single_batch_and_rank_keep_plain_names_and_no_zero_stage() -> None:
    space = _space(low_precisions=())
    params = space.params(_knobs(low_precision="fp32"))
    assert params == {"micro_batch_size": 8, "checkpoint_blocks": 0}
    assert space.suggest(optuna.trial.FixedTrial(params)) == _knobs(low_precision="fp32")


def test_zero_stage_is_sampled_only_with_more_than_one_rank() -> None:
    space = _space(ranks=(1, 2), zero_stages=(0, 3))
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        knobs = space.suggest(trial)
        assert ("zero_stage" in trial.params) == (knobs.ranks > 1)
        study.tell(trial, [1.0, 1.0])


def test_ranks_must_divide_every_batch() -> None:
    message = "space.ranks entry 3 must divide every effective batch size, but got 32."
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        _space(ranks=(1, 3))


def test_an_override_index_must_be_a_block() -> None:
    message = "space.blocks index must be in [0, 3], but got 4."
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        _space(overrides={4: BlockOverride(checkpoint=True)})


# ---- the outer precision (issue 40) ----------------------------------------------------------------


def test_the_outer_precision_is_a_categorical_only_with_a_low_precision() -> None:
    space = _space()
    knobs = _knobs(low_precision_blocks=2, outer_low_precision=True)
    params = space.params(knobs)
    assert params == {
        "micro_batch_size": 8,
        "low_precision_blocks": 2,
        "outer_low_precision": True,
        "checkpoint_blocks": 0,
    }
    assert space.suggest(optuna.trial.FixedTrial(params)) == knobs
    config = space.config(knobs)
    assert (config.precision, config.outer_precision) == (("bf16", "fp32", "bf16", "fp32"), "bf16")
    study = optuna.create_study()
    trial = study.ask()
    space.suggest(trial)
    assert trial.distributions["outer_low_precision"] == optuna.distributions.CategoricalDistribution((False, True))
    assert "outer_low_precision" not in _space(low_precisions=()).params(_knobs(low_precision="fp32"))


def test_a_trial_from_before_the_outer_precision_reads_back_with_it_off() -> None:
    space = _space()
    older = {"micro_batch_size": 8, "low_precision_blocks": 2, "checkpoint_blocks": 1}  # a resumed study's
    assert space.knobs_of(older) == _knobs(low_precision_blocks=2, checkpoint_blocks=1)
    with pytest.raises(ValueError, match="checkpoint_blocks"):
        space.knobs_of({"micro_batch_size": 8, "low_precision_blocks": 2})  # another space's: no default


def test_a_space_with_the_selective_level_samples_it_after_the_wholly_recomputed_blocks() -> None:
    space = _space(selective=True, low_precisions=())
    # The parameter's range is every count; above the blocks left, every one of those is selective.
    assert space.suggest(
        optuna.trial.FixedTrial({"micro_batch_size": 8, "checkpoint_blocks": 1, "selective_blocks": 2})
    ) == (_knobs(checkpoint_blocks=1, selective_blocks=2, low_precision="fp32"))
    clipped = space.suggest(
        optuna.trial.FixedTrial({"micro_batch_size": 8, "checkpoint_blocks": 3, "selective_blocks": 4})
    )
    assert (clipped.checkpoint_blocks, clipped.selective_blocks) == (3, 1)
    knobs = _knobs(checkpoint_blocks=1, selective_blocks=2, low_precision="fp32")
    assert space.params(knobs) == {"micro_batch_size": 8, "checkpoint_blocks": 1, "selective_blocks": 2}
    # Ranking (2, 0, 3, 1): block 2 recomputed whole, blocks 0 and 3 selectively.
    assert space.config(knobs).checkpoint == ("selective", False, True, "selective")
    # Sampled by a real sampler: the parameter is there, with its range.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    space.suggest(trial)
    assert trial.distributions["selective_blocks"] == optuna.distributions.IntDistribution(0, 4)


def test_an_older_studys_trial_without_the_selective_parameter_reads_back_as_none_selective() -> None:
    space = _space(selective=True)
    older = {"micro_batch_size": 4, "low_precision_blocks": 1, "outer_low_precision": False, "checkpoint_blocks": 2}
    assert space.knobs_of(older) == _knobs(micro_batch_size=4, low_precision_blocks=1, checkpoint_blocks=2)


def test_a_space_reaching_the_level_by_enqueued_trials_only_never_suggests_it_to_the_sampler() -> None:
    space = _space(selective=True, selective_sampled=False, low_precisions=())
    assert space.selective and not space.samples_selective
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    # A sampled trial: no parameter, no selective block, the same point as without the level.
    sampled = study.ask()
    without = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    assert space.suggest(sampled) == _space(low_precisions=()).suggest(without)
    assert sampled.params == without.params and "selective_blocks" not in sampled.distributions
    # An enqueued trial with the parameter runs it (stored as its param), one without it runs none.
    point = _knobs(checkpoint_blocks=1, selective_blocks=2, low_precision="fp32")
    assert space.params(point) == {"micro_batch_size": 8, "checkpoint_blocks": 1, "selective_blocks": 2}
    study.enqueue_trial(space.params(point))
    enqueued = study.ask()
    assert space.suggest(enqueued) == point
    assert enqueued.params == {"micro_batch_size": 8, "checkpoint_blocks": 1, "selective_blocks": 2}
    assert enqueued.distributions["selective_blocks"] == optuna.distributions.IntDistribution(0, 4)
    plain = _knobs(checkpoint_blocks=1, low_precision="fp32")
    assert space.params(plain) == {"micro_batch_size": 8, "checkpoint_blocks": 1}
    study.enqueue_trial(space.params(plain))
    assert space.suggest(study.ask()) == plain
    # Read back: a trial without the parameter has no selective block, one with it has its own.
    assert space.knobs_of({"micro_batch_size": 8, "checkpoint_blocks": 1}) == plain
    assert space.knobs_of(space.params(point)) == point


def test_a_space_without_the_selective_level_has_no_parameter_and_refuses_a_selective_point() -> None:
    space = _space()
    trial = optuna.create_study().ask()
    space.suggest(trial)
    assert "selective_blocks" not in trial.distributions
    message = (
        "this space recomputes no block selectively (space.selective = false), but got 1 selective blocks "
        "(8x4 ckpt:1 sel:1)."
    )
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        space.params(_knobs(checkpoint_blocks=1, selective_blocks=1))


def test_the_space_moves_the_selective_level_where_it_has_it() -> None:
    here = _knobs(micro_batch_size=32, checkpoint_blocks=1, low_precision="fp32")
    with_level = _space(selective=True, low_precisions=()).neighbours(here)
    assert [(k.micro_batch_size, k.checkpoint_blocks, k.selective_blocks) for k in with_level] == [
        (32, 0, 0),  # one recomputed count fewer
        (32, 0, 1),  # the full block selective instead
        (16, 1, 0),  # a smaller micro-batch
        (32, 2, 0),  # one recomputed count more
        (32, 1, 1),  # one selective block more
    ]
    assert [k.selective_blocks for k in _space(low_precisions=()).neighbours(here)] == [0, 0, 0]
