from __future__ import annotations

import re

import pytest

from autotune import ConfigError, TrainConfig, UnsupportedError
from autotune.train.deepspeed_config import DEFAULT_BUCKET, bucket_elements, deepspeed_config, engine_precision


def test_zero3_bf16_config_scales_buckets_to_the_model() -> None:
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=2, ranks=8, precision="bf16", zero_stage=3, grad_clip=0.5)
    assert deepspeed_config(config, num_blocks=6, largest_parameter=65_536) == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0.5,
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 65_536,
            "allgather_bucket_size": 65_536,
            "overlap_comm": False,
            "contiguous_gradients": True,
            "stage3_prefetch_bucket_size": 65_536,
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": 65_536,
            "stage3_max_reuse_distance": 65_536,
        },
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
        "bf16": {"enabled": True},
        "data_types": {"buffer_dtype": "bf16"},
    }


def test_stage0_fp32_without_clipping_has_no_zero_buckets_and_no_precision_section() -> None:
    ds = deepspeed_config(TrainConfig(ranks=2, grad_clip=None), num_blocks=3, largest_parameter=10)
    assert ds["zero_optimization"] == {"stage": 0}
    assert ds["gradient_clipping"] == 0.0
    assert "bf16" not in ds and "fp16" not in ds and "data_types" not in ds


def test_fp16_runs_on_a_cuda_engine_with_dynamic_loss_scaling() -> None:
    ds = deepspeed_config(
        TrainConfig(ranks=2, precision="fp16"), num_blocks=2, largest_parameter=10, device_type="cuda"
    )
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}


def test_bf16_islands_keep_an_fp32_engine() -> None:
    config = TrainConfig(ranks=2, precision=("bf16", "fp32"))
    assert engine_precision(config, num_blocks=2, device_type="cpu") == "fp32"
    assert "bf16" not in deepspeed_config(config, num_blocks=2, largest_parameter=10)


def test_fp16_on_a_cpu_engine_is_unsupported() -> None:
    msg = (
        "TrainConfig.precision fp16 cannot run on a CPU DeepSpeed engine (DeepSpeed refuses it: "
        "'Type fp16 is not supported on your device'); use bf16 or fp32, or a CUDA device."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        engine_precision(TrainConfig(ranks=2, precision="fp16"), num_blocks=2, device_type="cpu")


def test_fp16_mixed_with_other_blocks_is_unsupported() -> None:
    msg = (
        "TrainConfig.precision mixes fp16 with other precisions, but a DeepSpeed engine scales the loss for "
        "the whole model only; use fp16 on every block or on none, got ('fp16', 'fp32')."
    )
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        engine_precision(TrainConfig(ranks=2, precision=("fp16", "fp32")), num_blocks=2, device_type="cuda")


def test_bucket_elements_bounds() -> None:
    assert (bucket_elements(1), bucket_elements(2)) == (2, 2)  # ZeRO 1-2 need even bucket sizes
    assert bucket_elements(DEFAULT_BUCKET + 1) == DEFAULT_BUCKET
    with pytest.raises(ConfigError, match=f"^{re.escape('largest_parameter must be an int >= 1, but got 0.')}$"):
        bucket_elements(0)


# ---- the outer precision (issue 40) ----------------------------------------------------------------


def test_outer_bf16_is_the_whole_model_bf16_engine_or_autocast_on_an_fp32_one() -> None:
    whole = TrainConfig(ranks=2, precision="bf16", outer_precision="bf16")
    assert engine_precision(whole, num_blocks=2, device_type="cpu") == "bf16"
    # The generator is the one for both: outer bf16 over bf16 blocks writes what all-bf16 blocks wrote.
    same = deepspeed_config(TrainConfig(ranks=2, precision="bf16"), num_blocks=2, largest_parameter=10)
    assert deepspeed_config(whole, num_blocks=2, largest_parameter=10) == same
    mixed = TrainConfig(ranks=2, precision=("bf16", "fp32"), outer_precision="bf16")
    assert engine_precision(mixed, num_blocks=2, device_type="cpu") == "fp32"  # the loop autocasts
    assert "bf16" not in deepspeed_config(mixed, num_blocks=2, largest_parameter=10)


def test_outer_fp16_needs_an_fp16_engine() -> None:
    assert (
        engine_precision(
            TrainConfig(ranks=2, precision="fp16", outer_precision="fp16"), num_blocks=2, device_type="cuda"
        )
        == "fp16"
    )
    msg = (
        "TrainConfig.outer_precision fp16 runs on a DeepSpeed engine only with every block fp16 (an fp16 engine): "
        "DeepSpeed scales the loss only on its own fp16 engine, not under autocast on an fp32 one; "
        "got precision=('fp16', 'fp32')."
    )
    config = TrainConfig(ranks=2, precision=("fp16", "fp32"), outer_precision="fp16")
    with pytest.raises(UnsupportedError, match=f"^{re.escape(msg)}$"):
        engine_precision(config, num_blocks=2, device_type="cuda")
