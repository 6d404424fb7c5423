"""The one-line config summary of the progress display and tables."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.search.display import config_summary


def test_uniform_knobs() -> None:
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision="bf16", checkpoint=True)
    assert config_summary(config) == "micro x acc x ranks 8x4x1 | bf16 | ckpt all | ZeRO 0"


def test_per_block_knobs_count_blocks() -> None:
    config = TrainConfig(
        micro_batch_size=2, grad_accum_steps=8, precision=("bf16", "fp32", "bf16"), checkpoint=(True, False, False)
    )
    assert config_summary(config) == "micro x acc x ranks 2x8x1 | bf16 2/3 | ckpt 1/3 | ZeRO 0"
