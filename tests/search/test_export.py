"""Exports: our JSON, the DeepSpeed config generated from TrainConfig, a Python snippet."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.search.export import allocator_note, export_config
from autotune.train.deepspeed_config import deepspeed_config
from tests.conftest import make_resmlp

BLOCKS = ("blocks.0", "blocks.1", "blocks.2", "blocks.3")
CONFIG = TrainConfig(
    micro_batch_size=8, grad_accum_steps=4, precision="bf16", checkpoint=(True, True, False, False), grad_clip=1.0
)


def test_json_is_the_train_config() -> None:
    assert (
        TrainConfig.from_json(export_config(CONFIG, "json", block_names=BLOCKS, workload="w", largest_parameter=1))
        == CONFIG
    )


def test_deepspeed_export_is_the_config_the_deepspeed_runner_measures() -> None:
    """One generator: the exported file equals, key for key, what ZeroTrainer hands to
    deepspeed.initialize for the same config and model (buckets sized to the largest parameter)."""
    workload = make_resmlp()
    for config in (CONFIG, TrainConfig(micro_batch_size=4, zero_stage=3, ranks=2, grad_clip=None)):
        text = export_config(
            config, "deepspeed", block_names=BLOCKS, workload="w", largest_parameter=workload.largest_parameter
        )
        measured = deepspeed_config(
            config, num_blocks=len(BLOCKS), largest_parameter=workload.largest_parameter, device_type="cpu"
        )
        assert text == json.dumps(measured, indent=2) + "\n"
    zero3 = json.loads(text)["zero_optimization"]
    assert zero3["reduce_bucket_size"] == workload.largest_parameter  # not DeepSpeed's 5e8-element default


def test_python_snippet_applies_the_knobs_to_a_model() -> None:
    code = export_config(CONFIG, "python", block_names=BLOCKS, workload="resmlp", largest_parameter=1)
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
        export_config(CONFIG, "yaml", block_names=BLOCKS, workload="w", largest_parameter=1)


@pytest.mark.parametrize("expandable", [False, True])
def test_the_python_snippet_says_which_allocator_setting_it_assumes(expandable: bool) -> None:
    code = export_config(
        CONFIG, "python", block_names=BLOCKS, workload="resmlp", largest_parameter=1, expandable_segments=expandable
    )
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    assert namespace["ALLOC_CONF"] == ("expandable_segments:True" if expandable else None)
    assert f"CUDA allocator: {allocator_note(expandable)}." in code


def test_the_allocator_note() -> None:
    assert allocator_note(True) == (
        "measured with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: set it in the training job's "
        "environment, before its first CUDA allocation"
    )
    assert allocator_note(False) == (
        "measured without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the CUDA allocator's default)"
    )


# ---- the outer precision (issue 40) ----------------------------------------------------------------

RECIPE = TrainConfig(micro_batch_size=8, grad_accum_steps=2, precision="bf16", outer_precision="bf16", checkpoint=True)


def test_the_exported_apply_sets_the_outer_precision() -> None:
    import torch

    mixed = TrainConfig(micro_batch_size=8, precision=("bf16", "fp32", "fp32", "bf16"), outer_precision="bf16")
    code = export_config(mixed, "python", block_names=BLOCKS, workload="resmlp", largest_parameter=1)
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    assert namespace["CONFIG"] == mixed and namespace["HF_TRAINING_ARGUMENTS"] is None  # per-block: apply()
    model = make_resmlp().model
    x = torch.randn(2, 32, 16)
    reference = model(x)
    handle = namespace["apply"](model)
    assert "forward" in model.__dict__  # the outer region around the model's own forward
    assert [("forward" in model.get_submodule(b).__dict__) for b in BLOCKS] == [False, True, True, False]
    assert model(x).dtype == torch.bfloat16  # the head ran in bf16
    handle.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert torch.equal(model(x), reference)


def test_the_hf_training_arguments_say_bf16_where_the_whole_model_is_bf16() -> None:
    from autotune.search.export import hf_training_arguments

    assert hf_training_arguments(RECIPE, num_blocks=4) == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "bf16": True,
        "gradient_checkpointing": True,
    }
    assert hf_training_arguments(TrainConfig(micro_batch_size=4), num_blocks=4) == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
    }
    whole_fp16 = TrainConfig(micro_batch_size=4, precision="fp16", outer_precision="fp16")
    assert hf_training_arguments(whole_fp16, num_blocks=4) == {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "fp16": True,
    }
    # No equivalent: the blocks alone in bf16 (bf16=True is the whole model), per-block knobs, ranks.
    assert hf_training_arguments(CONFIG, num_blocks=4) is None
    assert hf_training_arguments(TrainConfig(precision="bf16", checkpoint=True), num_blocks=4) is None
    assert hf_training_arguments(TrainConfig(precision="fp32", outer_precision="bf16"), num_blocks=4) is None
    assert hf_training_arguments(dataclasses.replace(RECIPE, ranks=2, zero_stage=2), num_blocks=4) is None
    code = export_config(RECIPE, "python", block_names=BLOCKS, workload="w", largest_parameter=1)
    assert (
        "HF_TRAINING_ARGUMENTS = {'per_device_train_batch_size': 8, 'gradient_accumulation_steps': 2, "
        "'bf16': True, 'gradient_checkpointing': True}\n" in code
    )


def test_the_deepspeed_export_of_the_whole_model_in_bf16_is_the_bf16_engine() -> None:
    text = export_config(
        dataclasses.replace(RECIPE, ranks=2, zero_stage=2),
        "deepspeed",
        block_names=BLOCKS,
        workload="w",
        largest_parameter=10,
    )
    blocks_only = deepspeed_config(
        dataclasses.replace(RECIPE, ranks=2, zero_stage=2, outer_precision="fp32"), num_blocks=4, largest_parameter=10
    )
    assert json.loads(text) == blocks_only and json.loads(text)["bf16"] == {"enabled": True}


# ---- torch.compile (issue 42) -----------------------------------------------------------------------


def test_the_exports_of_a_compiled_configuration_compile() -> None:
    from autotune.search.export import compile_note, hf_training_arguments

    compiled = dataclasses.replace(RECIPE, compile="default")
    assert hf_training_arguments(compiled, num_blocks=4) == {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 2,
        "bf16": True,
        "gradient_checkpointing": True,
        "torch_compile": True,
    }
    autotuned = dataclasses.replace(RECIPE, compile="max-autotune")
    assert hf_training_arguments(autotuned, num_blocks=4)["torch_compile_mode"] == "max-autotune"  # type: ignore[index]
    code = export_config(autotuned, "python", block_names=BLOCKS, workload="w", largest_parameter=1)
    assert code.endswith(
        "    handle = apply_config(model, BLOCKS, CONFIG, device_type=device_type)\n"
        "    model.compile(mode='max-autotune')  # torch.compile in place (max-autotune), as it was measured\n"
        "    return handle\n"
    )
    eager = export_config(RECIPE, "python", block_names=BLOCKS, workload="w", largest_parameter=1)
    assert eager.endswith("    return apply_config(model, BLOCKS, CONFIG, device_type=device_type)\n")
    assert compile_note(RECIPE) is None
    assert compile_note(compiled) == (
        "the configuration is compiled (torch.compile default): DeepSpeed's JSON has no key for it, call "
        "engine.compile() after deepspeed.initialize"
    )


# The first torch.compile of a process imports inductor, which warns about torch.jit (torch's own noise).
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method:DeprecationWarning")
def test_the_exported_apply_compiles_the_model_in_place() -> None:
    code = export_config(
        dataclasses.replace(CONFIG, compile="default"), "python", block_names=BLOCKS, workload="w", largest_parameter=1
    )
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    model = make_resmlp().model
    handle = namespace["apply"](model)
    assert model._compiled_call_impl is not None  # nn.Module.compile: compiled at its first call
    handle.remove()


# ---- selective recompute (issue 42) ---------------------------------------------------------------

SELECTIVE = TrainConfig(micro_batch_size=8, checkpoint=("selective", "selective", True, False))


def test_the_python_snippet_applies_selective_recompute() -> None:
    import torch

    code = export_config(SELECTIVE, "python", block_names=BLOCKS, workload="resmlp", largest_parameter=1)
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    assert namespace["CONFIG"] == SELECTIVE
    assert namespace["HF_TRAINING_ARGUMENTS"] is None
    model = make_resmlp().model
    x = torch.randn(2, 32, 16)
    model(x).square().mean().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    handle = namespace["apply"](model)
    assert [("forward" in model.get_submodule(b).__dict__) for b in BLOCKS] == [True, True, True, False]
    model(x).square().mean().backward()
    handle.remove()
    assert all(torch.equal(a, p.grad) for a, p in zip(plain, model.parameters(), strict=True))


def test_no_hf_training_arguments_and_a_deepspeed_note_for_selective_recompute() -> None:
    from autotune.search.export import hf_training_arguments, recompute_note

    assert hf_training_arguments(TrainConfig(micro_batch_size=4, checkpoint="selective"), num_blocks=4) is None
    assert recompute_note(SELECTIVE, num_blocks=4) == (
        "the DeepSpeed config cannot say the per-block recompute (block 0 selective, block 1 selective, "
        "block 2 whole): apply it in the training script with the Python export's apply(model) "
        "(autotune best --format python)"
    )
    assert recompute_note(TrainConfig(), num_blocks=4) is None
    ds = json.loads(export_config(SELECTIVE, "deepspeed", block_names=BLOCKS, workload="w", largest_parameter=1))
    assert "selective" not in json.dumps(ds)  # the file cannot say it: the note does
