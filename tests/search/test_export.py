"""Exports: our JSON, the DeepSpeed config generated from TrainConfig, a Python snippet."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.search.export import deepspeed_config, export_config
from tests.conftest import make_resmlp

BLOCKS = ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
CONFIG = TrainConfig(
    micro_batch_size=8, grad_accum_steps=4, precision="bf16", checkpoint=(True, True, False, False), grad_clip=1.0
)


def test_json_is_the_train_config() -> None:
    assert TrainConfig.from_json(export_config(CONFIG, "json", block_names=BLOCKS, workload="w")) == CONFIG


def test_deepspeed_config_from_train_config() -> None:
    assert deepspeed_config(CONFIG, num_blocks=4) == {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 4,
        "zero_optimization": {"stage": 0},
        "bf16": {"enabled": True},
        "fp16": {"enabled": False},
        "gradient_clipping": 1.0,
        "activation_checkpointing": {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        },
    }


def test_deepspeed_mixed_per_block_precision_stays_fp32_and_no_checkpoint_section() -> None:
    config = TrainConfig(micro_batch_size=4, precision=("bf16", "fp32", "fp32", "fp32"), grad_clip=None)
    ds = deepspeed_config(config, num_blocks=4)
    assert (ds["bf16"], ds["fp16"]) == ({"enabled": False}, {"enabled": False})
    assert "activation_checkpointing" not in ds and "gradient_clipping" not in ds
    text = export_config(config, "deepspeed", block_names=BLOCKS, workload="w")
    assert json.loads(text) == ds


def test_python_snippet_applies_the_knobs_to_a_model() -> None:
    code = export_config(CONFIG, "python", block_names=BLOCKS, workload="resmlp")
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    assert namespace["CONFIG"] == CONFIG
    model = make_resmlp().model
    handle = namespace["apply"](model)
    assert all("forward" in model.get_submodule(b).__dict__ for b in BLOCKS)  # every block is wrapped (bf16)
    handle.remove()
    assert not any("forward" in model.get_submodule(b).__dict__ for b in BLOCKS)


def test_an_unknown_format_is_refused() -> None:
    message = "--format must be one of ('json', 'deepspeed', 'python'), but got 'yaml'."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        export_config(CONFIG, "yaml", block_names=BLOCKS, workload="w")
