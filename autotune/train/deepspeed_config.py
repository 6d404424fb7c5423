"""TrainConfig -> DeepSpeed config: one function, so the JSON a cluster runs is the one we measured.

Precision. A DeepSpeed engine has one precision for the whole model, TrainConfig one per block:

=====================  ===========================================================================
blocks                 engine
=====================  ===========================================================================
all fp32               fp32 engine, no autocast
all bf16 (all fp16)    DeepSpeed ``bf16`` (``fp16``) mixed precision: the model's parameters and
                       gradients in 16 bits, fp32 master weights + Adam moments in the optimizer
                       (Micikevicius et al. 2018; the model ZeRO's memory formulas assume)
fp32 and bf16 mixed    fp32 engine, each bf16 block autocast by :mod:`autotune.train.wrappers` (an island,
                       as in the local runner)
fp16 and others mixed  unsupported: loss scaling is engine-wide in DeepSpeed
=====================  ===========================================================================

The outer precision (``TrainConfig.outer_precision``: embeddings, head, loss) follows: a 16-bit
engine is the whole model in 16 bits whatever it says (outer fp32 or the blocks' own precision);
on an fp32 engine a bf16 outer precision is the training loop's autocast around the forward and
the loss, the blocks its exceptions, as in the local runner. An fp16 outer precision needs every
block fp16 (an fp16 engine): DeepSpeed has no loss scaling for an fp32 engine under fp16 autocast.

So "all bf16" means bf16 *weights* here but bf16 *autocast* in the local runner (``zero_stage=0``,
``ranks=1``): the two runners measure different things for that config, on purpose.

Buckets. DeepSpeed's defaults (5e8 elements) are sized for billion-parameter models: ZeRO-3's
reduce bucket alone is a 2 GB fp32 ``torch.empty`` (5e8 x 4 bytes). We size every bucket to the largest
parameter (the smallest bucket that still takes any single gradient whole), capped at the default,
much as Hugging Face's ``"auto"`` sizes them from the hidden size (``hidden_size**2``).
"""

from __future__ import annotations

from typing import Any, Literal

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError, UnsupportedError

__all__ = ["EnginePrecision", "bucket_elements", "deepspeed_config", "engine_precision"]

EnginePrecision = Literal["fp32", "bf16", "fp16"]

#: DeepSpeed's default bucket size in elements (``reduce_bucket_size``, ``allgather_bucket_size``).
DEFAULT_BUCKET = 500_000_000


def engine_precision(config: TrainConfig, *, num_blocks: int, device_type: str) -> EnginePrecision:
    """The DeepSpeed engine precision a config runs with (see the module docstring).

    Raises:
        UnsupportedError: for fp16 on a CPU engine, fp16 blocks mixed with other precisions, or an
            fp16 outer precision over blocks that are not all fp16.
    """
    blocks: tuple[Precision, ...] = config.block_precisions(num_blocks)
    if config.outer_precision == "fp16" and set(blocks) != {"fp16"}:
        raise UnsupportedError(
            "TrainConfig.outer_precision fp16 runs on a DeepSpeed engine only with every block fp16 (an fp16 "
            "engine): DeepSpeed scales the loss only on its own fp16 engine, not under autocast on an fp32 one; "
            f"got precision={config.precision!r}."
        )
    if "fp16" in blocks and device_type == "cpu":
        raise UnsupportedError(
            "TrainConfig.precision fp16 cannot run on a CPU DeepSpeed engine (DeepSpeed refuses it: "
            "'Type fp16 is not supported on your device'); use bf16 or fp32, or a CUDA device."
        )
    if len(set(blocks)) == 1:
        return blocks[0]
    if "fp16" in blocks:
        raise UnsupportedError(
            "TrainConfig.precision mixes fp16 with other precisions, but a DeepSpeed engine scales "
            f"the loss for the whole model only; use fp16 on every block or on none, got {config.precision!r}."
        )
    return "fp32"


def bucket_elements(largest_parameter: int) -> int:
    """Bucket size in elements for a model whose largest parameter has ``largest_parameter`` elements.

    Even: ZeRO 1-2 require bucket sizes that are multiples of their all-gather alignment (2).
    """
    if not isinstance(largest_parameter, int) or largest_parameter < 1:
        raise ConfigError(f"largest_parameter must be an int >= 1, but got {largest_parameter!r}.")
    return min(DEFAULT_BUCKET, largest_parameter + largest_parameter % 2)


def deepspeed_config(
    config: TrainConfig, *, num_blocks: int, largest_parameter: int, device_type: str = "cpu"
) -> dict[str, Any]:
    """The DeepSpeed config dict (``deepspeed.initialize(config=...)``, or JSON for the launcher).

    The optimizer is not in it: autotune passes the workload's torch optimizer instance, because an
    ``"optimizer"`` entry of type Adam/AdamW JIT-compiles FusedAdam for minutes on first use.
    """
    precision = engine_precision(config, num_blocks=num_blocks, device_type=device_type)
    bucket = bucket_elements(largest_parameter)
    zero: dict[str, Any] = {"stage": config.zero_stage}
    if config.zero_stage >= 1:
        zero |= {
            "reduce_bucket_size": bucket,
            "allgather_bucket_size": bucket,
            # Overlap allocates extra buckets (and needs CUDA streams to gain anything); off, the
            # memory is what the memory model predicts. A GPU cluster may turn it on.
            "overlap_comm": False,
            "contiguous_gradients": True,
        }
    if config.zero_stage == 3:
        zero |= {
            "stage3_prefetch_bucket_size": bucket,
            # 0: partition every parameter, as Rajbhandari et al.'s Psi/N assumes (the default 1e5
            # would keep every parameter of a small model whole on each rank).
            "stage3_param_persistence_threshold": 0,
            "stage3_max_live_parameters": bucket,
            "stage3_max_reuse_distance": bucket,
        }
    ds: dict[str, Any] = {
        "train_batch_size": config.effective_batch_size,
        "train_micro_batch_size_per_gpu": config.micro_batch_size,
        "gradient_accumulation_steps": config.grad_accum_steps,
        "gradient_clipping": 0.0 if config.grad_clip is None else float(config.grad_clip),
        "zero_optimization": zero,
        # The workload may bring any torch optimizer (SGD, ...); ZeRO refuses untested ones otherwise.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # autotune reports; no periodic DeepSpeed log lines
        "wall_clock_breakdown": False,
    }
    if precision == "bf16":
        ds["bf16"] = {"enabled": True}
    elif precision == "fp16":
        # loss_scale 0 = dynamic loss scaling (Micikevicius et al. 2018), as torch's GradScaler.
        ds["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16}
    if precision != "fp32":
        # Float buffers follow the weights (as module.bfloat16() does): batch norm refuses fp32
        # running statistics next to 16-bit weights ("expected scalar type BFloat16 but found Float").
        ds["data_types"] = {"buffer_dtype": precision}
    return ds
