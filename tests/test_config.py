from __future__ import annotations

import dataclasses
import math
import re

import pytest

from autotune import ConfigError, TrainConfig


def _raises(msg: str) -> pytest.RaisesContext[ConfigError]:
    return pytest.raises(ConfigError, match=f"^{re.escape(msg)}$")


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"micro_batch_size": 0}, "TrainConfig.micro_batch_size must be >= 1, but got 0."),
        ({"micro_batch_size": 2.5}, "TrainConfig.micro_batch_size must be an int, but got 2.5."),
        ({"grad_accum_steps": 0}, "TrainConfig.grad_accum_steps must be >= 1, but got 0."),
        ({"ranks": 0}, "TrainConfig.ranks must be >= 1, but got 0."),
        ({"zero_stage": 4}, "TrainConfig.zero_stage must be in [0, 3], but got 4."),
        ({"zero_stage": -1}, "TrainConfig.zero_stage must be in [0, 3], but got -1."),
        ({"precision": "fp8"}, "TrainConfig.precision must be one of ('fp32', 'bf16', 'fp16'), but got 'fp8'."),
        (
            {"precision": ("fp32", "int8")},
            "TrainConfig.precision must be one of ('fp32', 'bf16', 'fp16'), but got 'int8'.",
        ),
        ({"precision": ()}, "TrainConfig.precision must have at least one entry, but got ()."),
        (
            {"compile": "reduce-overhead"},
            "TrainConfig.compile must be one of ('none', 'default', 'max-autotune'), but got 'reduce-overhead'.",
        ),
        (
            {"compile": "default", "zero_stage": 2},
            "TrainConfig.compile must be 'none' on DeepSpeed ranks (zero_stage > 0 or ranks > 1), but got "
            "'default' with zero_stage=2, ranks=1.",
        ),
        (
            {"outer_precision": "fp8"},
            "TrainConfig.outer_precision must be one of ('fp32', 'bf16', 'fp16'), but got 'fp8'.",
        ),
        (
            {"outer_precision": "fp16", "precision": ("fp32", "bf16")},
            "TrainConfig.precision must be fp32 or the outer precision 'fp16' on every block when "
            "outer_precision is reduced, but got 'bf16'.",
        ),
        (
            {"outer_precision": "bf16", "precision": "fp16"},
            "TrainConfig.precision must be fp32 or the outer precision 'bf16' on every block when "
            "outer_precision is reduced, but got 'fp16'.",
        ),
        ({"checkpoint": (True, 1)}, "TrainConfig.checkpoint entries must be True, False or 'selective', but got 1."),
        (
            {"checkpoint": "full"},
            "TrainConfig.checkpoint entries must be True, False or 'selective', but got 'full'.",
        ),
        (
            {"checkpoint": (False, "Selective")},
            "TrainConfig.checkpoint entries must be True, False or 'selective', but got 'Selective'.",
        ),
        ({"checkpoint": ()}, "TrainConfig.checkpoint must have at least one entry, but got ()."),
        ({"lr_scaling": "cubic"}, "TrainConfig.lr_scaling must be one of ('linear', 'sqrt', 'none'), but got 'cubic'."),
        ({"lr_schedule": "cosine"}, "TrainConfig.lr_decay_steps is required when lr_schedule='cosine', but got None."),
        ({"lr_min_ratio": 1.5}, "TrainConfig.lr_min_ratio must be in [0, 1], but got 1.5."),
        ({"grad_clip": 0.0}, "TrainConfig.grad_clip must be a finite number > 0 or None, but got 0.0."),
        ({"grad_clip": math.inf}, "TrainConfig.grad_clip must be a finite number > 0 or None, but got inf."),
        ({"lr_warmup_steps": -1}, "TrainConfig.lr_warmup_steps must be >= 0, but got -1."),
    ],
)
def test_invalid_values_name_field_rule_and_value(kwargs: dict[str, object], msg: str) -> None:
    with _raises(msg):
        TrainConfig(**kwargs)  # type: ignore[arg-type]


def test_boundaries_accepted() -> None:
    c = TrainConfig(micro_batch_size=1, grad_accum_steps=1, ranks=1, zero_stage=3, lr_min_ratio=0.0, grad_clip=None)
    assert c.effective_batch_size == 1


def test_frozen_and_keyword_only() -> None:
    c = TrainConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.micro_batch_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        TrainConfig(8)  # type: ignore[misc]


def test_json_round_trip_with_per_block_lists() -> None:
    c = TrainConfig(
        micro_batch_size=4,
        grad_accum_steps=3,
        precision=("bf16", "fp32", "fp16"),
        checkpoint=(True, False, True),
        lr_schedule="cosine",
        lr_decay_steps=100,
    )
    again = TrainConfig.from_json(c.to_json())
    assert again == c
    assert again.precision == ("bf16", "fp32", "fp16")
    assert again.uses_fp16


def test_from_dict_rejects_unknown_field() -> None:
    with _raises(
        "TrainConfig has no field 'microbatch' (known fields: checkpoint, compile, grad_accum_steps, grad_clip, "
        "lr_decay_steps, lr_min_ratio, lr_scaling, lr_schedule, lr_warmup_steps, micro_batch_size, "
        "outer_precision, precision, ranks, seed, zero_stage)."
    ):
        TrainConfig.from_dict({"microbatch": 4})


def test_from_json_rejects_non_object() -> None:
    with _raises("TrainConfig JSON must be an object, but got list."):
        TrainConfig.from_json("[1]")


def test_per_block_broadcast_and_length_check() -> None:
    assert TrainConfig(precision="bf16").block_precisions(3) == ("bf16", "bf16", "bf16")
    assert TrainConfig(checkpoint=True).block_checkpoints(2) == (True, True)
    with _raises("TrainConfig.precision must have one entry per block (4 blocks), but got 2 entries."):
        TrainConfig(precision=("bf16", "fp32")).block_precisions(4)


def test_effective_batch_and_linear_lr_scaling() -> None:
    c = TrainConfig(micro_batch_size=8, grad_accum_steps=4, ranks=2)
    assert c.effective_batch_size == 64
    assert c.lr_multiplier(32) == 2.0  # eta = eta_base * B_eff / B_base
    assert dataclasses.replace(c, lr_scaling="sqrt").lr_multiplier(16) == 2.0
    assert dataclasses.replace(c, lr_scaling="none").lr_multiplier(16) == 1.0


def test_warmup_then_cosine_schedule() -> None:
    c = TrainConfig(lr_warmup_steps=4, lr_schedule="cosine", lr_decay_steps=10, lr_min_ratio=0.1)
    assert [c.lr_factor(i) for i in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert c.lr_factor(4) == 1.0
    assert c.lr_factor(9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert c.lr_factor(14) == pytest.approx(0.1)
    assert c.lr_factor(1000) == pytest.approx(0.1)


# ---- the outer precision (issue 40) ----------------------------------------------------------------


def test_outer_precision_allows_fp32_or_its_own_precision_on_the_blocks() -> None:
    mixed = TrainConfig(precision=("bf16", "fp32"), outer_precision="bf16")
    assert mixed.block_precisions(2) == ("bf16", "fp32")
    assert not mixed.uses_fp16
    assert TrainConfig(outer_precision="fp16").uses_fp16  # fp16 anywhere scales the loss
    assert TrainConfig(precision="fp16").uses_fp16  # an fp32 outer part still allows any block


def test_outer_precision_shows_only_when_reduced() -> None:
    fp32 = TrainConfig(precision=("bf16", "fp32", "bf16", "fp32"), checkpoint=True)
    assert fp32.describe() == "micro x acc x ranks 8x1x1 | bf16 2/4 | ckpt all | ZeRO 0"
    assert "outer_precision" not in fp32.to_dict()  # an fp32 config's JSON is as it was
    whole = dataclasses.replace(fp32, precision="bf16", outer_precision="bf16")
    assert whole.describe() == "micro x acc x ranks 8x1x1 | bf16, outer bf16 | ckpt all | ZeRO 0"
    assert whole.knob_cells()[1] == "bf16, outer bf16"
    assert dataclasses.replace(fp32, outer_precision="bf16").knob_cells()[1] == "bf16 2/4, outer bf16"


def test_outer_precision_round_trips_through_json() -> None:
    c = TrainConfig(precision=("bf16", "fp32"), outer_precision="bf16")
    assert c.to_dict()["outer_precision"] == "bf16"
    assert TrainConfig.from_json(c.to_json()) == c
    assert TrainConfig.from_dict({"micro_batch_size": 4}).outer_precision == "fp32"


# ---- torch.compile (issue 42) -----------------------------------------------------------------------


def test_compile_shows_only_when_on() -> None:
    eager = TrainConfig(checkpoint=True)
    assert "compile" not in eager.to_dict()  # an eager config's JSON is as it was
    compiled = dataclasses.replace(eager, compile="max-autotune")
    assert compiled.describe() == "micro x acc x ranks 8x1x1 | fp32 | ckpt all | ZeRO 0 | compile max-autotune"
    assert compiled.to_dict()["compile"] == "max-autotune"
    assert TrainConfig.from_json(compiled.to_json()) == compiled
    assert TrainConfig.from_dict({"micro_batch_size": 4}).compile == "none"


# ---- selective recompute, the third per-block level (issue 42) -------------------------------------


def test_checkpoint_levels_name_the_three_levels_and_block_checkpoints_stay_full_only() -> None:
    mixed = TrainConfig(checkpoint=(True, "selective", False, "selective"))
    assert mixed.checkpoint_levels(4) == ("full", "selective", "none", "selective")
    assert mixed.block_checkpoints(4) == (True, False, False, False)  # whole-block recompute only
    assert TrainConfig(checkpoint="selective").checkpoint_levels(2) == ("selective", "selective")
    assert TrainConfig().checkpoint_levels(3) == ("none", "none", "none")
    assert TrainConfig(checkpoint=True).checkpoint_levels(1) == ("full",)
    with _raises("TrainConfig.checkpoint must have one entry per block (2 blocks), but got 4 entries."):
        mixed.checkpoint_levels(2)


def test_selective_describe_and_knob_cells() -> None:
    mixed = TrainConfig(checkpoint=(True, "selective", True, False))
    assert mixed.describe() == "micro x acc x ranks 8x1x1 | fp32 | ckpt 2/4 + sel 1/4 | ZeRO 0"
    assert TrainConfig(checkpoint="selective").knob_cells()[2] == "sel all"
    assert TrainConfig(checkpoint=(True, False)).knob_cells()[2] == "1/2"  # as before the third level


def test_selective_json_round_trip_and_old_json_reads_the_same() -> None:
    mixed = TrainConfig(checkpoint=(True, "selective", False))
    assert mixed.to_dict()["checkpoint"] == [True, "selective", False]
    assert TrainConfig.from_json(mixed.to_json()) == mixed
    every = TrainConfig(checkpoint="selective")
    assert TrainConfig.from_json(every.to_json()) == every
    old = TrainConfig.from_json('{"micro_batch_size": 4, "checkpoint": [true, false]}')
    assert old.checkpoint == (True, False) and old.checkpoint_levels(2) == ("full", "none")
