"""Exporting a configuration: our JSON, a DeepSpeed config, or a Python snippet.

The DeepSpeed file comes from the one generator the DeepSpeed runner itself uses
(:func:`autotune.train.deepspeed_config.deepspeed_config`), so what a user runs on a cluster is
byte for byte what was measured (bucket sizes included: DeepSpeed's defaults allocate a 2 GB
bucket at stage 3). DeepSpeed's config has one precision for the whole model and no notion of
*which* blocks to recompute, nor of recomputing part of a block (that is model code), so the
per-block knobs, selective recompute included, go into the Python snippet, whose ``apply()`` also
puts the outer precision around the model's forward; :func:`recompute_note` is the line that
goes with a DeepSpeed file to say so. For a model
trained by Hugging Face's Trainer the snippet also holds the equivalent ``TrainingArguments``
(:func:`hf_training_arguments`), where the configuration has one.
"""

from __future__ import annotations

import json
from typing import Any, Literal, get_args

from autotune.config import MEASURED_KEY, TrainConfig
from autotune.errors import ConfigError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName

__all__ = [
    "ExportFormat",
    "EXPORT_FORMATS",
    "allocator_note",
    "compile_note",
    "export_config",
    "hf_training_arguments",
    "objective_note",
    "python_snippet",
    "recompute_note",
]

ExportFormat = Literal["json", "deepspeed", "python"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)


def allocator_note(expandable_segments: bool) -> str:
    """One line saying which CUDA allocator setting the measurements assumed."""
    if expandable_segments:
        return (
            "measured with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: set it in the training job's "
            "environment, before its first CUDA allocation"
        )
    return "measured without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the CUDA allocator's default)"


def objective_note(objective: ObjectiveName) -> str:
    """One line saying what the recommendation is for: every export says it, so a file read later
    cannot be taken for the other objective's pick."""
    if objective == DEFAULT_OBJECTIVE:
        return "recommended for the most samples/s per GiB of peak within the memory budget (objective per-gib)"
    return "recommended for the most samples/s within the memory budget (objective throughput), not per GiB"


def compile_note(config: TrainConfig) -> str | None:
    """One line for the DeepSpeed export of a compiled configuration, else None: DeepSpeed's JSON
    has no key that compiles the model (its ``compile`` section configures DeepCompile's passes);
    compiling is a call on the engine."""
    if config.compile == "none":
        return None
    mode = "" if config.compile == "default" else f"mode={config.compile!r}"
    return (
        f"the configuration is compiled (torch.compile {config.compile}): DeepSpeed's JSON has no key for it, "
        f"call engine.compile({mode}) after deepspeed.initialize"
    )


def recompute_note(config: TrainConfig, *, num_blocks: int) -> str | None:
    """The line that goes with a DeepSpeed config of ``config`` when it recomputes any block (the
    file cannot say which, nor a selective recompute), or None.

    Example:
        >>> from autotune import TrainConfig
        >>> note = recompute_note(TrainConfig(checkpoint=("selective", False, True)), num_blocks=3)
        >>> note.split(": ")[0]
        'the DeepSpeed config cannot say the per-block recompute (block 0 selective, block 2 whole)'
        >>> recompute_note(TrainConfig(), num_blocks=3) is None
        True
    """
    levels = config.checkpoint_levels(num_blocks)
    if set(levels) == {"none"}:
        return None
    named = {"full": "whole", "selective": "selective"}
    if len(set(levels)) == 1:
        which = f"every block {named[levels[0]]}"
    else:
        which = ", ".join(f"block {i} {named[x]}" for i, x in enumerate(levels) if x != "none")
    return (
        f"the DeepSpeed config cannot say the per-block recompute ({which}): apply it in the training script "
        "with the Python export's apply(model) (autotune best --format python)"
    )


def hf_training_arguments(config: TrainConfig, *, num_blocks: int) -> dict[str, Any] | None:
    """The keyword arguments of Hugging Face's ``TrainingArguments`` that train as ``config`` does,
    or None where it has no equivalent there: blocks treated differently (per-block precision or
    recompute), or blocks in another precision than the outer parts (``bf16=True`` is the whole
    model, ``gradient_checkpointing=True`` every block), or DeepSpeed ranks (the DeepSpeed export
    is that file), or a selective recompute: ``gradient_checkpointing=True`` recomputes whole
    blocks, and saying which operations to keep would take a callable ``context_fn`` in
    ``gradient_checkpointing_kwargs``, which ``TrainingArguments`` serializes as JSON (the snippet's
    ``apply()`` says it instead).

    Example:
        >>> from autotune import TrainConfig
        >>> recipe = TrainConfig(micro_batch_size=8, precision="bf16", outer_precision="bf16", checkpoint=True)
        >>> args = hf_training_arguments(recipe, num_blocks=12)
        >>> args["per_device_train_batch_size"], args["bf16"], args["gradient_checkpointing"]
        (8, True, True)
        >>> hf_training_arguments(TrainConfig(precision="bf16"), num_blocks=12) is None  # blocks only
        True
    """
    precisions, checkpoints = set(config.block_precisions(num_blocks)), set(config.checkpoint_levels(num_blocks))
    if config.on_deepspeed or len(precisions) > 1 or len(checkpoints) > 1 or "selective" in checkpoints:
        return None
    if precisions != {config.outer_precision}:
        return None
    args: dict[str, Any] = {
        "per_device_train_batch_size": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
    }
    if config.outer_precision != "fp32":
        args[config.outer_precision] = True
    if checkpoints == {"full"}:
        args["gradient_checkpointing"] = True
    if config.compile != "none":
        args["torch_compile"] = True
        if config.compile != "default":
            args["torch_compile_mode"] = config.compile
    return args


def python_snippet(
    config: TrainConfig,
    *,
    block_names: tuple[str, ...],
    workload: str,
    expandable_segments: bool = False,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> str:
    """A Python snippet that applies ``config`` to a model with these blocks (its outer precision
    and per-block knobs), with the equivalent ``TrainingArguments`` where there is one."""
    alloc = "expandable_segments:True" if expandable_segments else None
    why = f"Objective: {objective_note(objective)}.\n"
    hf_args = hf_training_arguments(config, num_blocks=len(block_names))
    return f'''"""Apply the configuration autotune found for {workload!r}.

{why}CUDA allocator: {allocator_note(expandable_segments)}.
"""
from autotune import TrainConfig
from autotune.train.wrappers import apply_config

CONFIG = TrainConfig.from_json("""{config.to_json()}""")
BLOCKS = {list(block_names)!r}
# PYTORCH_CUDA_ALLOC_CONF the peaks were measured under (None: the allocator's default).
ALLOC_CONF = {alloc!r}
# Under Hugging Face's Trainer, the same configuration as TrainingArguments(**HF_TRAINING_ARGUMENTS),
# in place of apply(); None where they cannot say it (per-block knobs, selective recompute): call
# apply(model) then.
HF_TRAINING_ARGUMENTS = {hf_args!r}


def apply(model, device_type="cpu"):
    """Put the config on `model`: the outer precision around its forward (the loss too where the
    model computes it), each block's precision and recompute (CONFIG.checkpoint: True recomputes
    the whole block, "selective" keeps its matmul-like outputs and recomputes the rest).

    Train with micro-batch CONFIG.micro_batch_size and CONFIG.grad_accum_steps accumulation steps
    (effective batch {config.effective_batch_size}). Returns a handle: `handle.remove()` undoes it.
    """
{_apply_body(config)}
'''


def _apply_body(config: TrainConfig) -> str:
    """The body of the snippet's ``apply()``: the wrappers, and for a compiled configuration the
    model compiled in place after them (``nn.Module.compile``: the handle stays what it returns)."""
    call = "apply_config(model, BLOCKS, CONFIG, device_type=device_type)"
    if config.compile == "none":
        return f"    return {call}"
    mode = "" if config.compile == "default" else f"mode={config.compile!r}"
    return (
        f"    handle = {call}\n"
        f"    model.compile({mode})  # torch.compile in place ({config.compile}), as it was measured\n"
        "    return handle"
    )


def export_config(
    config: TrainConfig,
    fmt: str,
    *,
    block_names: tuple[str, ...],
    workload: str,
    largest_parameter: int,
    expandable_segments: bool = False,
    measured: dict[str, Any] | None = None,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> str:
    """The text of ``config`` in format ``fmt`` (``json``, ``deepspeed`` or ``python``).

    ``largest_parameter``: elements of the model's largest parameter, which sizes DeepSpeed's buckets.
    ``expandable_segments``: the study measured with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``;
    the Python snippet says so (the DeepSpeed JSON has no field for it: ``autotune best`` says it
    on stderr, :func:`allocator_note`).
    ``measured``: what the study measured for it (JSON only, under the key
    :data:`~autotune.config.MEASURED_KEY`, which :meth:`TrainConfig.from_json` reads past).
    ``objective``: what the recommendation is for; the Python snippet says so
    (:func:`objective_note`; ``autotune best`` puts it in ``measured`` and on stderr).
    """
    if fmt == "json":
        if measured is None:
            return config.to_json() + "\n"
        return json.dumps({**config.to_dict(), MEASURED_KEY: measured}, indent=2) + "\n"
    if fmt == "deepspeed":
        from autotune.train.deepspeed_config import deepspeed_config

        # device_type "cuda": an exported file is for a GPU cluster (on a CPU engine the generator
        # refuses fp16, which a CPU study never measures anyway); the JSON does not depend on it.
        ds = deepspeed_config(
            config, num_blocks=len(block_names), largest_parameter=largest_parameter, device_type="cuda"
        )
        return json.dumps(ds, indent=2) + "\n"
    if fmt == "python":
        return python_snippet(
            config,
            block_names=block_names,
            workload=workload,
            expandable_segments=expandable_segments,
            objective=objective,
        )
    raise ConfigError(f"--format must be one of {EXPORT_FORMATS}, but got {fmt!r}.")
