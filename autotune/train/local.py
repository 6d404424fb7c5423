"""The real training loop in one process, under a TrainConfig that can change while it runs."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.data import DataLoader, RandomSampler

from autotune.config import TrainConfig
from autotune.errors import ConfigError, UnsupportedError, WorkloadError
from autotune.train.gns import GradientNoiseMonitor
from autotune.train.wrappers import BlockWrappers, apply_block_knobs
from autotune.workload import Workload

__all__ = ["Trainer", "StepResult", "check_loss", "resolve_device"]


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """One optimizer step."""

    loss: float  # mean of the micro-batch losses
    samples: int  # samples consumed by this rank
    seconds: float  # wall time of the whole step, data loading included
    lr: float
    overflow: bool  # fp16 loss scaling found inf/nan gradients and skipped the update


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``cpu``, ``cuda``, ``cuda:N`` or ``auto``/None (CUDA when available); anything else, or CUDA
    on a machine without it, is a :class:`ConfigError` (a user mistake, found before any work)."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError):
        resolved = None
    if resolved is None or resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"device must be cpu, cuda, cuda:N or auto, but got {str(device)!r}.")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {str(device)!r} needs CUDA, but torch.cuda.is_available() is False on this machine.")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise ConfigError(
            f"device {str(device)!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)."
        )
    return resolved


class Trainer:
    """Trains a private copy of a workload's model under a config, or the user's own model.

    By default the model is deep-copied, so the workload can be measured again under another
    config. With ``model`` (and optionally ``optimizer``) the trainer trains those objects in
    place: no copy, nothing moved (the device is the model's unless ``device`` says otherwise),
    the optimizer used as given: :class:`autotune.adapt.Adaptive` runs the user's own training
    through it. ``reconfigure`` swaps the config in place (wrappers, batch, LR), keeping weights
    and optimizer state: the Gymnasium environment changes knobs mid-training through it.
    """

    def __init__(
        self,
        workload: Workload,
        config: TrainConfig,
        *,
        device: str | torch.device | None = None,
        gns_decay: float = 0.9,
        track_noise: bool = True,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if config.zero_stage != 0 or config.ranks != 1:
            raise UnsupportedError(
                f"Trainer runs one local process (zero_stage=0, ranks=1), but got zero_stage={config.zero_stage} "
                f"with ranks={config.ranks}; measure() runs those on DeepSpeed ranks."
            )
        if optimizer is not None and model is None:
            raise ConfigError(
                "Trainer(optimizer=...) needs model=... too: the optimizer must hold that model's parameters."
            )
        self.workload = workload
        self.block_names = workload.block_names()
        if model is None:
            self.device = resolve_device(device)
            self.model = copy.deepcopy(workload.model).to(self.device)
        else:
            first = next(model.parameters(), None)
            self.device = resolve_device(device) if device is not None or first is None else first.device
            self.model = model
        self.model.train()
        self.optimizer = optimizer if optimizer is not None else workload.make_optimizer(self.model.parameters())
        self._base_lrs = [float(g["lr"]) for g in self.optimizer.param_groups]
        # track_noise=False exists for the overhead benchmark: no hooks, no per-step sync.
        self.gns = GradientNoiseMonitor(self.model.parameters() if track_noise else [], decay=gns_decay)
        self.step_count = 0
        self._wrappers: BlockWrappers | None = None
        self._loader_key: tuple[int, int] | None = None
        self._batches: Iterator[Any] = iter(())
        self.config = config
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self.reconfigure(config)

    # ---- configuration --------------------------------------------------------------------------

    def reconfigure(self, config: TrainConfig) -> None:
        """Apply ``config`` to the live model: block wrappers, micro-batch, loss scaling."""
        n = len(self.block_names)
        precisions, checkpoints = config.block_precisions(n), config.block_checkpoints(n)
        if config.micro_batch_size > len(self.workload.dataset):  # type: ignore[arg-type]
            raise ConfigError(
                f"TrainConfig.micro_batch_size must be <= the dataset size of workload "
                f"{self.workload.name!r} ({len(self.workload.dataset)}), "  # type: ignore[arg-type]
                f"but got {config.micro_batch_size}."
            )
        if self._wrappers is not None:
            self._wrappers.remove()
        self._wrappers = apply_block_knobs(
            self.model, self.block_names, precisions, checkpoints, device_type=self.device.type
        )
        if config.uses_fp16 and not self.scaler.is_enabled():
            self.scaler = torch.amp.GradScaler(self.device.type)
        elif not config.uses_fp16:
            self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        key = (config.micro_batch_size, config.seed)
        if key != self._loader_key:
            self._batches = self._batch_stream(config.micro_batch_size, config.seed)
            self._loader_key = key
        self.config = config

    def _batch_stream(self, micro_batch_size: int, seed: int) -> Iterator[Any]:
        generator = torch.Generator().manual_seed(seed)
        sampler = RandomSampler(self.workload.dataset, generator=generator)  # type: ignore[arg-type]
        loader = DataLoader(self.workload.dataset, batch_size=micro_batch_size, sampler=sampler, drop_last=True)
        while True:  # endless: a new shuffled epoch each time the loader runs out
            yield from loader

    def lr(self) -> float:
        """Learning rate of the first param group at the current step."""
        return self._base_lrs[0] * self._lr_scale()

    def _lr_scale(self) -> float:
        c = self.config
        return c.lr_multiplier(self.workload.batch_size) * c.lr_factor(self.step_count)

    # ---- the step ---------------------------------------------------------------------------------

    def step(self, *, split: int = 1, before_micro_batch: Callable[[], None] | None = None) -> StepResult:
        """One optimizer step of ``grad_accum_steps`` micro-batches.

        ``split`` > 1 (only with ``grad_accum_steps == 1``) runs the micro-batch as ``split``
        equal chunks: same effective batch and gradient, but the noise monitor sees two batch sizes.
        """
        c = self.config
        scale = self._lr_scale()
        for group, base in zip(self.optimizer.param_groups, self._base_lrs, strict=True):
            group["lr"] = base * scale
        start = time.perf_counter()
        micro_batches = self._micro_batches(split)
        n = len(micro_batches) if split > 1 else c.grad_accum_steps
        # Cost: get_scale() is a device->host sync, paid only when fp16 loss scaling is on.
        loss_scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
        self.gns.begin_step(c.micro_batch_size // split, grad_multiplier=n / loss_scale)
        losses: list[torch.Tensor] = []
        for i in range(n):
            batch = micro_batches[i] if micro_batches else next(self._batches)
            if before_micro_batch is not None:
                before_micro_batch()
            batch = tree_map_only(torch.Tensor, lambda t: t.to(self.device, non_blocking=True), batch)
            loss = self.workload.loss_fn(self.model, batch)
            check_loss(loss, self.workload.name)
            self.scaler.scale(loss / n).backward()
            self.gns.end_micro_batch()
            losses.append(loss.detach())
        overflow = self._optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        mean_loss = torch.stack(losses).float().mean().item()  # sync point: also ends the step's work
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        self.step_count += 1
        return StepResult(
            loss=mean_loss,
            samples=c.micro_batch_size * c.grad_accum_steps,
            seconds=seconds,
            lr=self._base_lrs[0] * scale,
            overflow=overflow,
        )

    def _micro_batches(self, split: int) -> list[Any]:
        if split <= 1:
            return []
        c = self.config
        assert c.grad_accum_steps == 1 and c.micro_batch_size % split == 0, (split, c)
        batch = next(self._batches)
        chunk = c.micro_batch_size // split

        def part(i: int) -> Any:
            return tree_map_only(torch.Tensor, lambda t: t[i * chunk : (i + 1) * chunk], batch)

        return [part(i) for i in range(split)]

    def _optimizer_step(self) -> bool:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        self.gns.end_step([p.grad for p in params if p.grad is not None])
        if self.config.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, self.config.grad_clip)
        if not self.scaler.is_enabled():
            self.optimizer.step()
            return False
        before = self.scaler.get_scale()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return self.scaler.get_scale() < before  # the scaler backs off only after inf/nan grads

    def close(self) -> None:
        """Remove wrappers and hooks from the (private) model."""
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None
        self.gns.remove()


def check_loss(loss: object, workload: str) -> None:
    """Raise :class:`WorkloadError` unless ``loss`` (what ``loss_fn`` returned) is a 0-dim tensor."""
    # Python-side metadata only (type, ndim, shape): no device sync. Without it a non-scalar loss
    # fails inside backward() with PyTorch's "grad can be implicitly created only for scalar outputs".
    if not isinstance(loss, torch.Tensor):
        raise WorkloadError(
            f"workload {workload!r}: loss_fn must return a scalar tensor, but returned {type(loss).__name__}"
        )
    if loss.dim() != 0:
        raise WorkloadError(
            f"workload {workload!r}: loss_fn must return a scalar tensor, but returned shape {tuple(loss.shape)}"
        )
