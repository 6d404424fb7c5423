"""The per-rank training loop on a real DeepSpeed engine.

One :class:`ZeroTrainer` per rank: the workload's model (with per-block checkpoint/autocast
wrappers from :mod:`autotune.train.wrappers`) and its torch optimizer go through ``deepspeed.initialize``
with the config from :func:`~autotune.train.deepspeed_config.deepspeed_config`. The engine does the
ZeRO partitioning, gradient accumulation and bf16/fp16; the batches come from a
:class:`~autotune.train.stream.ShardStream` (a ``DistributedSampler``'s order), so each rank trains
on its own shard. ``ZeroTrainer.reconfigure`` changes the config while training goes on (the
environment's ZeRO action): a new engine when it must, with the training state carried over.

Its exact memory by category: :mod:`autotune.measurement.zero_tracker`.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import logging
from collections.abc import Sequence
from typing import Any

import torch

from autotune.batches import map_tensors
from autotune.config import Precision, TrainConfig
from autotune.dependencies import install_command
from autotune.errors import ConfigError, UnsupportedError
from autotune.train.base import BaseTrainer
from autotune.train.deepspeed_config import deepspeed_config, engine_precision
from autotune.train.stream import workload_stream
from autotune.train.wrappers import BlockWrappers, apply_block_knobs
from autotune.train.zero_state import TrainingState, gather_state, load_into_module, restore_state
from autotune.workload import Workload

__all__ = ["ZeroTrainer", "import_deepspeed"]

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@functools.cache
def import_deepspeed() -> Any:
    """``import deepspeed``, minus its hidden run-time compile, or an error saying what to install."""
    try:
        import deepspeed
    except ImportError as e:
        raise UnsupportedError(
            f"zero_stage > 0 or ranks > 1 runs on DeepSpeed, which cannot be imported ({e}); "
            f"install it with {install_command('zero')}."
        ) from None
    # init_distributed JIT-compiles the shm_comm op (~3 min on this project's 2-core CPU machines), used only for
    # inference all-reduce. Go through sys.modules: `import deepspeed.comm.torch as m` binds torch.
    comm: Any = importlib.import_module("deepspeed.comm.torch")
    comm.build_shm_op = lambda: None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)  # one INFO line per call otherwise
    return deepspeed


class ZeroTrainer(BaseTrainer):
    """Trains a private copy of a workload's model on one rank of a DeepSpeed engine.

    ``reconfigure`` changes the config while training goes on. Per-block precision islands and
    checkpointing, micro-batch size and accumulation change on the live engine; a ZeRO stage,
    engine precision or gradient-clipping change builds a new engine and carries the training
    state over (:mod:`autotune.train.zero_state`): fp32 parameters, optimizer state, the step
    counter (so the LR schedule goes on) and the data stream's position.
    """

    def __init__(self, workload: Workload, config: TrainConfig, *, rank: int, device: torch.device) -> None:
        import_deepspeed()
        super().__init__(workload, config, device=device, world=torch.distributed.get_world_size())
        self.rank = rank
        self._total: torch.Tensor | None = None
        self._stream = workload_stream(workload, num_replicas=self.world, rank=rank, seed=config.seed)
        self._build(config, state=None)

    def _check(self, config: TrainConfig) -> None:
        if config.ranks != self.world:
            raise ConfigError(
                f"TrainConfig.ranks must equal the number of running ranks ({self.world}), but got {config.ranks}."
            )
        super()._check(config)

    def _build(self, config: TrainConfig, *, state: TrainingState | None) -> None:
        """A new engine for ``config``, starting from ``state`` (None: the workload's initial model)."""
        deepspeed = import_deepspeed()
        self.precision = engine_precision(config, num_blocks=len(self.block_names), device_type=self.device.type)
        model = copy.deepcopy(self.workload.model)
        if state is not None:
            load_into_module(model, state)
        self._wrappers = self._wrap(model, config)
        # A torch optimizer instance: DeepSpeed's own "AdamW" would JIT-compile FusedAdam.
        self.optimizer = self.workload.make_optimizer(model.parameters())
        self._track_lrs()
        ds_config = deepspeed_config(
            config,
            num_blocks=len(self.block_names),
            largest_parameter=max(p.numel() for p in model.parameters()),
            device_type=self.device.type,
        )
        self.deepspeed_config = ds_config
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=ds_config)
        if state is not None:
            restore_state(self.engine, self.optimizer, state)

    @property
    def outer_precision(self) -> Precision:
        """The config's outer precision on an fp32 engine; none on a 16-bit engine, whose weights
        are low precision throughout already (DeepSpeed's ``bf16``/``fp16``: the whole model)."""
        return self.config.outer_precision if self.precision == "fp32" else "fp32"

    def _wrap(self, model: torch.nn.Module, config: TrainConfig) -> BlockWrappers:
        n = len(self.block_names)
        # An fp32 engine autocasts bf16 blocks (islands, or exceptions to a bf16 outer region); a
        # bf16/fp16 engine is low precision throughout.
        fp32 = dataclasses.replace(config, precision="fp32", outer_precision="fp32")
        run = config if self.precision == "fp32" else fp32
        return apply_block_knobs(
            model,
            self.block_names,
            run.block_precisions(n),
            config.checkpoint_levels(n),
            device_type=self.device.type,
            outer=run.outer_precision,
        )

    # ---- reconfiguration ------------------------------------------------------------------------

    def _apply(self, config: TrainConfig) -> str | None:
        """Switch to ``config`` between optimizer steps; return why a new engine was built, or None.

        Every rank must call it with the same config (a new engine is built collectively).
        """
        reason = self._new_engine_reason(config)
        if reason is not None:
            state = gather_state(self.engine, self.optimizer)  # sync point: collectives at ZeRO 1-3
            counters = (self.engine.global_steps, self.engine.global_samples)
            self.close()
            self._build(config, state=state)
            self.engine.global_steps, self.engine.global_samples = counters
        else:
            # The block wrappers shadow each block's forward (autotune.train.wrappers): DeepSpeed's ZeRO-3
            # gather/release hooks are module hooks around it and stay as they are.
            self._wrappers.remove()
            self._wrappers = self._wrap(self.engine.module, config)
            # Batch sizes are plain numbers in the engine's config, read on every step; ZeRO 1-3
            # read the accumulation count at init only for CPU offload, which autotune never enables.
            self.engine.set_train_micro_batch_size(config.micro_batch_size)
            self.engine.set_train_batch_size(config.micro_batch_size * config.grad_accum_steps * self.world)
        if config.seed != self.config.seed:  # another data order, from its start (as the local Trainer)
            self._stream = workload_stream(self.workload, num_replicas=self.world, rank=self.rank, seed=config.seed)
        return reason

    def _new_engine_reason(self, config: TrainConfig) -> str | None:
        old = self.config
        if config.zero_stage != old.zero_stage:
            return (
                f"ZeRO stage {old.zero_stage} -> {config.zero_stage}: the stage decides how parameters, "
                "gradients and optimizer state are partitioned, which deepspeed.initialize lays out"
            )
        precision = engine_precision(config, num_blocks=len(self.block_names), device_type=self.device.type)
        if precision != self.precision:
            return (
                f"engine precision {self.precision} -> {precision}: it decides the parameters' dtype and "
                "whether the optimizer keeps fp32 masters, both fixed at initialization"
            )
        if config.grad_clip != old.grad_clip:
            return (
                f"gradient clipping {old.grad_clip} -> {config.grad_clip}: ZeRO's optimizers take the "
                "clipping norm at initialization"
            )
        return None

    # ---- the step hooks ---------------------------------------------------------------------------

    def _draw(self) -> Any:
        return self._stream.next(self.config.micro_batch_size)

    def _begin_step(self, sizes: list[int], items: Sequence[int | torch.Tensor] | None) -> None:
        self._total = torch.zeros((), dtype=torch.float64, device=self.device)

    def _items_total(self, total: int | torch.Tensor) -> torch.Tensor:
        # The engine averages the ranks' gradients: each rank's shares are of the mean count.
        mean = torch.as_tensor(total, dtype=torch.float64, device=self.device).clone()
        torch.distributed.all_reduce(mean)  # one small collective per step, only with counted losses
        return mean / self.world

    def _micro_step(self, batch: Any, *, index: int, count: int, share: float | torch.Tensor | None) -> None:
        # The boundary said explicitly: DeepSpeed's own count ((micro_steps + 1) % k) would be
        # out of phase after an accumulation change on a live engine.
        self.engine.set_gradient_accumulation_boundary(index == count - 1)
        loss = self._loss(self.engine, batch)
        # The engine scales by 1/grad_accum_steps itself: a counted share (autotune.loss_items) is
        # given as its ratio to that. feed() refuses a user's batch here, so a share is only counted.
        weighted = loss if share is None else loss * (share * count)
        self.engine.backward(weighted)
        self.engine.step()  # steps the optimizer only at the accumulation boundary
        assert self._total is not None
        self._total += weighted.detach().double()

    def _end_step(self) -> tuple[float, bool]:
        """``loss`` is the mean over every rank's micro-batches (an all-reduce): the loss of the
        effective batch, the same on every rank, so every rank takes the same decisions on it."""
        assert self._total is not None
        total, self._total = self._total, None
        torch.distributed.all_reduce(total)  # sync point: also ends the step's work on every rank
        return total.item() / (self.config.grad_accum_steps * self.world), not self.engine.was_step_applied()

    def _to_device(self, batch: Any) -> Any:
        # map_tensors, not a pytree map: a Hugging Face BatchEncoding is no pytree node.
        batch = super()._to_device(batch)
        if self.precision == "fp32":
            return batch
        # A bf16/fp16 engine holds 16-bit weights: float inputs must match (integer ids stay).
        dtype = _DTYPES[self.precision]
        return map_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, batch)

    def close(self) -> None:
        """Remove the wrappers and DeepSpeed's hooks, so another engine can follow in this process."""
        self._wrappers.remove()
        self.engine.destroy()
