"""The baselines: the PyTorch default, the seed recipe and the HF recipe, as points of the space."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import replace

import pytest

from autotune import Knobs
from autotune.measurement.admission import Verdict, admission
from autotune.search.baselines import (
    HF_BF16,
    HF_RECIPE,
    PYTORCH_DEFAULT,
    SEED_RECIPE,
    baselines,
    recommended_line,
    smaller_micro_batch,
)
from autotune.search.space import SearchSpace


def _under(budget: int, peak: Callable[[Knobs], int]) -> Callable[[Knobs], Verdict]:
    """The admission rule on an exact ``peak`` of each point against ``budget``."""
    return lambda k: admission(budget=budget, headroom=0.0, measured=peak(k))


def _space(n_blocks: int = 6, **kw: object) -> SearchSpace:
    args: dict[str, object] = {"batch_sizes": (32,), "ranking": tuple(range(n_blocks)), "max_micro_batch": 1000}
    args.update(kw)
    return SearchSpace(**args)  # type: ignore[arg-type]


def test_pytorch_default_is_fp32_whole_batch_no_checkpointing() -> None:
    default, *_ = baselines(_space(), batch_size=32)
    assert default.name == PYTORCH_DEFAULT
    config = _space().config(default.knobs)
    assert (config.micro_batch_size, config.grad_accum_steps, config.precision, config.checkpoint) == (
        32,
        1,
        "fp32",
        False,
    )


def test_seed_recipe_is_accum_4_bf16_everywhere_checkpoints_every_sqrt_l() -> None:
    _, seed, *_ = baselines(_space(n_blocks=6), batch_size=32)
    assert seed.name == SEED_RECIPE
    config = _space(n_blocks=6).config(seed.knobs)
    # sqrt(6) ~ 2.45 -> every 2nd block -> 3 of 6 blocks recomputed
    assert (config.micro_batch_size, config.grad_accum_steps, config.precision) == (8, 4, "bf16")
    assert config.checkpoint == (True, True, True, False, False, False)
    # 16 blocks: every 4th -> 4 blocks
    _, seed16, *_ = baselines(_space(n_blocks=16), batch_size=32)
    assert seed16.knobs.checkpoint_blocks == 4


def test_seed_recipe_uses_zero_2_with_ranks() -> None:
    space = _space(ranks=(1, 2), zero_stages=(0, 1, 2, 3))
    _, seed, *_ = baselines(space, batch_size=32)
    assert (seed.knobs.ranks, seed.knobs.zero_stage, seed.knobs.micro_batch_size) == (2, 2, 4)


def test_seed_recipe_accumulation_closest_to_4_when_4_does_not_divide() -> None:
    _, seed, *_ = baselines(_space(batch_sizes=(6,)), batch_size=6)
    assert seed.knobs.micro_batch_size == 2  # accum 3 (|3-4| = 1) beats accum 6 (2) and 2 (2)


def test_a_memory_prediction_picks_the_largest_micro_batch_that_fits() -> None:
    default, *_ = baselines(_space(), batch_size=32, admits=_under(10, lambda k: k.micro_batch_size))
    assert default.knobs.micro_batch_size == 8


def test_smaller_micro_batch_steps_down_the_divisors() -> None:
    space = _space(batch_sizes=(24,))
    knobs = Knobs(
        batch_size=24,
        ranks=1,
        micro_batch_size=24,
        zero_stage=0,
        low_precision="bf16",
        low_precision_blocks=0,
        checkpoint_blocks=0,
    )
    steps = []
    k: Knobs | None = knobs
    while k is not None:
        steps.append(k.micro_batch_size)
        k = smaller_micro_batch(space, k)
    assert steps == [24, 12, 8, 6, 4, 3, 2, 1]
    assert smaller_micro_batch(space, replace(knobs, micro_batch_size=1)) is None


# ---- the HF recipe (issue 40) ----------------------------------------------------------------------


def test_the_hf_recipe_is_the_whole_model_in_bf16_every_block_recomputed_the_whole_batch() -> None:
    space = _space(n_blocks=4, ranks=(1, 2), zero_stages=(0, 2))
    *_, recipe = baselines(space, batch_size=32)
    assert recipe.name == HF_RECIPE
    assert recipe.knobs == Knobs(
        batch_size=32,
        micro_batch_size=32,
        ranks=1,
        zero_stage=0,
        low_precision="bf16",
        low_precision_blocks=4,
        checkpoint_blocks=4,
        outer_low_precision=True,
    )
    config = space.config(recipe.knobs)
    assert (config.precision, config.outer_precision, config.checkpoint, config.grad_accum_steps) == (
        "bf16",
        "bf16",
        True,
        1,
    )
    assert config.describe() == "micro x acc x ranks 32x1x1 | bf16, outer bf16 | ckpt all | ZeRO 0"


def test_the_hf_recipe_takes_the_largest_micro_batch_that_fits() -> None:
    *_, recipe = baselines(
        _space(), batch_size=32, admits=_under(10, lambda k: 0 if k.outer_low_precision else k.micro_batch_size)
    )
    assert recipe.knobs.micro_batch_size == 32  # the predicate fits it whole: the whole batch
    default, _, recipe = baselines(_space(), batch_size=32, admits=_under(4, lambda k: k.micro_batch_size))
    assert (default.knobs.micro_batch_size, recipe.knobs.micro_batch_size) == (4, 4)
    assert recipe.knobs.outer_low_precision and recipe.knobs.checkpoint_blocks == 6


def test_the_hf_recipe_needs_bf16_in_the_space() -> None:
    assert [b.name for b in baselines(_space(low_precisions=("fp16",)), batch_size=32)] == [
        PYTORCH_DEFAULT,
        SEED_RECIPE,
    ]
    assert [b.name for b in baselines(_space(low_precisions=()), batch_size=32)] == [PYTORCH_DEFAULT, SEED_RECIPE]
    assert [b.name for b in baselines(_space(), batch_size=32)] == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]


def test_on_a_model_held_in_bf16_the_hf_recipe_is_its_checkpointing_alone() -> None:
    # Loaded in bf16, the model's space offers no precision (autocast has nothing to cast), and
    # the recipe of a Trainer user is what gradient_checkpointing=True does to it.
    space = _space(n_blocks=4, low_precisions=())
    names = [b.name for b in baselines(space, batch_size=32, held=True)]
    assert names == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]
    *_, recipe = baselines(space, batch_size=32, held=True)
    assert recipe.knobs == Knobs(
        batch_size=32, micro_batch_size=32, ranks=1, zero_stage=0, low_precision="fp32", checkpoint_blocks=4
    )
    assert space.config(recipe.knobs).describe() == "micro x acc x ranks 32x1x1 | fp32 | ckpt all | ZeRO 0"


def test_under_throughput_the_hf_bf16_only_recipe_is_a_baseline_at_the_largest_micro_batch_that_fits() -> None:
    # What a Trainer user after speed runs: bf16=True alone, nothing recomputed.
    space = _space(n_blocks=4)
    assert [b.name for b in baselines(space, batch_size=32)] == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]
    names = [b.name for b in baselines(space, batch_size=32, objective="throughput")]
    assert names == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE, HF_BF16]
    # Peaks: the recomputing recipe holds a quarter of the rest at the same micro-batch.
    peaks = _under(8, lambda k: k.micro_batch_size // (4 if k.checkpoint_blocks else 1))
    default, _, recipe, fast = baselines(space, batch_size=32, admits=peaks, objective="throughput")
    assert fast.knobs == Knobs(
        batch_size=32,
        micro_batch_size=8,
        ranks=1,
        zero_stage=0,
        low_precision="bf16",
        low_precision_blocks=4,
        checkpoint_blocks=0,
        outer_low_precision=True,
    )
    assert space.config(fast.knobs).describe() == "micro x acc x ranks 8x4x1 | bf16, outer bf16 | ckpt none | ZeRO 0"
    assert (default.knobs.micro_batch_size, recipe.knobs.micro_batch_size) == (8, 32)
    # Without bf16 in the space, or on a model held in bf16 (nothing to cast: the PyTorch default), none.
    no_bf16 = baselines(_space(low_precisions=("fp16",)), batch_size=32, objective="throughput")
    assert [b.name for b in no_bf16] == [PYTORCH_DEFAULT, SEED_RECIPE]
    held = baselines(_space(low_precisions=()), batch_size=32, held=True, objective="throughput")
    assert [b.name for b in held] == [PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE]


def test_the_recommendation_line_compares_with_both_baselines_under_the_objective() -> None:
    def line(objective: str, ratios: dict[str, float | None]) -> str:
        return recommended_line(
            "step 3",
            "8x4",
            throughput=65.94,
            peak_bytes=32 * 2**20,
            per_gib=2110.0,
            objective=objective,
            ratios=ratios,
        )

    head = "step 3: 8x4: 65.9 samples/s, peak 32 MiB, 2110.0 samples/s per GiB"
    assert line("per-gib", {"pytorch-default": 2.044, "hf-recipe": 1.1, "seed-recipe": 3.0}) == (
        f"recommended: {head} (2.04x the PyTorch default and 1.10x the HF recipe per GiB)"
    )
    assert line("throughput", {"pytorch-default": 1.5, "hf-recipe": None}) == (
        f"recommended for the most samples/s within the budget: {head} (1.50x the PyTorch default's samples/s); "
        "the HF recipe (bf16 + checkpointing) was infeasible"
    )
    # A baseline not measured (none given) is neither compared nor called infeasible.
    assert line("per-gib", {}) == f"recommended: {head}"
    # Under throughput a study also has the HF bf16-only recipe: three, listed with one "and".
    assert line("throughput", {"pytorch-default": 3.0, "hf-recipe": 1.25, "hf-bf16": 0.98}) == (
        f"recommended for the most samples/s within the budget: {head} (3.00x the PyTorch default's, "
        "1.25x the HF recipe's and 0.98x the HF bf16-only recipe's samples/s)"
    )


@pytest.mark.parametrize("objective", ["per-gib", "throughput"])
def test_the_recommendation_line_says_when_its_ratios_were_timed_side_by_side(objective: str) -> None:
    line = recommended_line(
        "step 3",
        "8x4",
        throughput=65.94,
        peak_bytes=32 * 2**20,
        per_gib=2110.0,
        objective=objective,
        ratios={"pytorch-default": 2.044, "hf-recipe": 1.1},
        side_by_side=True,
    )
    head = "step 3: 8x4: 65.9 samples/s, peak 32 MiB, 2110.0 samples/s per GiB"
    if objective == "per-gib":
        assert line == (
            f"recommended: {head} (2.04x the PyTorch default and 1.10x the HF recipe per GiB, timed side by side)"
        )
    else:
        assert line == (
            f"recommended for the most samples/s within the budget: {head} "
            "(2.04x the PyTorch default's and 1.10x the HF recipe's samples/s, timed side by side)"
        )


def test_a_point_the_memory_model_puts_far_over_the_budget_is_not_where_a_baseline_starts() -> None:
    # Unchecked predictions do not judge trials, but one far over the budget (GPT-2 small's fp32
    # whole batch: 52 GiB under 20) cannot fit: the retried baselines start below it.
    space = _space(n_blocks=4)
    default, seed, recipe, fast = baselines(
        space, batch_size=32, objective="throughput", hopeless=lambda k: k.micro_batch_size >= 16
    )
    assert [b.knobs.micro_batch_size for b in (default, recipe, fast)] == [8, 8, 8]
    assert seed.knobs.micro_batch_size == 8  # the seed recipe's split is its own: accumulation 4
    # Both rules at once: the admission rule's verified prediction, and the far-over hint.
    admits = _under(5, lambda k: k.micro_batch_size)
    default, *_ = baselines(space, batch_size=32, admits=admits, hopeless=lambda k: k.micro_batch_size >= 16)
    assert default.knobs.micro_batch_size == 4
    # Nothing below the whole batch left: the whole batch, measured (and let fail) as before.
    default, *_ = baselines(space, batch_size=32, hopeless=lambda k: True)
    assert default.knobs.micro_batch_size == 32


def test_far_over_is_the_study_s_unchecked_prediction_against_2_5_times_the_budget() -> None:
    from autotune import TrainConfig, predict_memory
    from autotune.search.budget import FAR_OVER, far_over
    from autotune.search.predictor import load_memory_predictor
    from autotune.search.prepared import prepare
    from autotune.search.spec import StudySpec
    from autotune.units import MemoryBudget
    from tests.paths import TINY_WORKLOAD

    predictor = load_memory_predictor(lazy=True)
    assert predictor is not None
    probe = prepare(StudySpec(workload=f"{TINY_WORKLOAD}:build"))
    whole = TrainConfig(micro_batch_size=16)
    assert predictor.unverified(probe.workload, whole) is None  # no profile taken: no hint, no fake run
    predictor.profile_ahead(probe.workload, [whole], until=lambda: False)
    peak = predictor.unverified(probe.workload, whole)
    profile = predictor.profile_of(probe.workload)
    assert peak == predict_memory(probe.workload, whole, profile=profile).total  # the model's, unchecked
    for budget, far in [(int(peak / FAR_OVER), True), (int(peak / FAR_OVER) + 1, False)]:
        prepared = prepare(StudySpec(workload=f"{TINY_WORKLOAD}:build", memory_budget=MemoryBudget(bytes=budget)))
        prepared = dataclasses.replace(prepared, workload=probe.workload)  # the profiled one
        hopeless = far_over(prepared, predictor)
        assert hopeless is not None
        default = baselines(prepared.space, batch_size=16, hopeless=hopeless)[0]
        assert hopeless(default.knobs) is False
        assert (default.knobs.micro_batch_size < 16) is far
    assert far_over(probe, predictor) is None  # no budget: none


def test_the_line_names_which_ratios_were_timed_side_by_side_when_not_all_were() -> None:
    def line(together: set[str]) -> str:
        return recommended_line(
            "trial 3",
            "8x4",
            throughput=65.94,
            peak_bytes=32 * 2**20,
            per_gib=2110.0,
            objective="per-gib",
            ratios={"pytorch-default": 2.044, "hf-recipe": 1.1},
            side_by_side=together,
        )

    versus = "2.04x the PyTorch default and 1.10x the HF recipe per GiB"
    assert line({"hf-recipe"}).endswith(f"({versus}, the HF recipe timed side by side)")
    assert line({"hf-recipe", "pytorch-default"}).endswith(f"({versus}, timed side by side)")
    assert line(set()).endswith(f"({versus})")
