"""Exporting a configuration: our JSON, a DeepSpeed config, or a Python snippet.

``deepspeed_config`` lives here until the config module grows its own DeepSpeed generator (the
DeepSpeed runner, issue #3, needs one too; STYLE.md rule 3 wants it generated from TrainConfig,
never hand-edited). DeepSpeed's config has one precision for the whole model and no notion of
*which* blocks to recompute (that is model code), so the per-block knobs go into the Python
snippet; the DeepSpeed file holds only keys DeepSpeed knows.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from autotune.config import TrainConfig
from autotune.errors import ConfigError

__all__ = ["ExportFormat", "EXPORT_FORMATS", "deepspeed_config", "export_config", "python_snippet"]

ExportFormat = Literal["json", "deepspeed", "python"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)


def deepspeed_config(config: TrainConfig, *, num_blocks: int) -> dict[str, Any]:
    """The DeepSpeed config dict for ``config``.

    Precision: DeepSpeed's ``bf16``/``fp16`` sections cast the whole model, so they are enabled
    only when every block uses that precision; mixed per-block precision stays fp32 here (apply
    it with the Python snippet). Activation checkpointing: which blocks to recompute is decided
    in the model's code (``deepspeed.checkpointing.checkpoint`` around them), so the section only
    configures how, and is present when any block is checkpointed.
    """
    precisions = set(config.block_precisions(num_blocks))
    ds: dict[str, Any] = {
        "train_batch_size": config.effective_batch_size,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "zero_optimization": {"stage": config.zero_stage},
        "bf16": {"enabled": precisions == {"bf16"}},
        "fp16": {"enabled": precisions == {"fp16"}},
    }
    if config.grad_clip is not None:
        ds["gradient_clipping"] = config.grad_clip
    if any(config.block_checkpoints(num_blocks)):
        ds["activation_checkpointing"] = {
            "partition_activations": config.ranks > 1,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return ds


def python_snippet(config: TrainConfig, *, block_names: tuple[str, ...], workload: str) -> str:
    """A Python snippet that applies ``config``'s per-block knobs to a model with these blocks."""
    return f'''"""Apply the configuration autotune found for {workload!r}."""
from autotune import TrainConfig
from autotune.apply import apply_block_knobs

CONFIG = TrainConfig.from_json("""{config.to_json()}""")
BLOCKS = {list(block_names)!r}


def apply(model, device_type="cpu"):
    """Wrap the blocks of `model` with the config's per-block precision and checkpointing.

    Train with micro-batch CONFIG.micro_batch_size and CONFIG.grad_accum_steps accumulation steps
    (effective batch {config.effective_batch_size}). Returns a handle: `handle.remove()` undoes it.
    """
    n = len(BLOCKS)
    return apply_block_knobs(
        model, BLOCKS, CONFIG.block_precisions(n), CONFIG.block_checkpoints(n), device_type=device_type
    )
'''


def export_config(config: TrainConfig, fmt: str, *, block_names: tuple[str, ...], workload: str) -> str:
    """The text of ``config`` in format ``fmt`` (``json``, ``deepspeed`` or ``python``)."""
    if fmt == "json":
        return config.to_json() + "\n"
    if fmt == "deepspeed":
        return json.dumps(deepspeed_config(config, num_blocks=len(block_names)), indent=2) + "\n"
    if fmt == "python":
        return python_snippet(config, block_names=block_names, workload=workload)
    raise ConfigError(f"--format must be one of {EXPORT_FORMATS}, but got {fmt!r}.")
