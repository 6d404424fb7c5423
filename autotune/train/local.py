"""The real training loop in one process, under a TrainConfig that can change while it runs."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import RandomSampler

from autotune.config import TrainConfig
from autotune.errors import ConfigError, UnsupportedError, WorkloadError
from autotune.train.base import BaseTrainer, finite_gradients
from autotune.train.gns import GradientNoiseMonitor
from autotune.train.stream import IterableStream, ShardStream
from autotune.train.wrappers import BlockWrappers, apply_block_knobs
from autotune.workload import Workload

__all__ = ["Trainer", "resolve_device"]


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


class Trainer(BaseTrainer):
    """Trains a private copy of a workload's model under a config, or the user's own model.

    By default the model is deep-copied, so the workload can be measured again under another
    config. With ``model`` (and optionally ``optimizer``) the trainer trains those objects in
    place: no copy, nothing moved (the device is the model's unless ``device`` says otherwise),
    the optimizer used as given: :class:`autotune.adapt.Adaptive` runs the user's own training
    through it. ``reconfigure`` swaps the config in place (wrappers, batch, LR), keeping weights
    and optimizer state: the Gymnasium environment changes knobs mid-training through it.

    Micro-batches come from a shuffled ``DataLoader`` per micro-batch size (a new epoch at each
    micro-batch change: a DataLoader fixes its batch size; an ``IterableDataset`` in its own order),
    with the workload's collate, or, given ``stream``, from that one
    :class:`~autotune.train.stream.ShardStream`, which keeps its place across micro-batch changes.

    ``skip_nonfinite`` (default True): a step whose loss or a gradient is NaN or infinite leaves the
    weights and optimizer state as they were (:meth:`BaseTrainer.step`); False where a step is
    measured for what it costs (a copy's weights do not matter, its optimizer state must exist).
    """

    supports_split = True

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
        stream: ShardStream | IterableStream | None = None,
        skip_nonfinite: bool = True,
    ) -> None:
        if config.on_deepspeed:
            raise UnsupportedError(
                f"Trainer runs one local process (zero_stage=0, ranks=1), but got zero_stage={config.zero_stage} "
                f"with ranks={config.ranks}; measure() runs those on DeepSpeed ranks."
            )
        if optimizer is not None and model is None:
            raise ConfigError(
                "Trainer(optimizer=...) needs model=... too: the optimizer must hold that model's parameters."
            )
        if model is None:
            resolved = resolve_device(device)
        else:
            first = next(model.parameters(), None)
            resolved = resolve_device(device) if device is not None or first is None else first.device
        super().__init__(workload, config, device=resolved, skip_nonfinite=skip_nonfinite)
        self.stream = stream
        self.model = workload.model_copy(self.device) if model is None else model
        self.model.train()
        self.optimizer = optimizer if optimizer is not None else workload.make_optimizer(self.model.parameters())
        self._track_lrs()
        # track_noise=False exists for the overhead benchmark: no hooks, no per-step sync.
        self.gns = GradientNoiseMonitor(self.model.parameters() if track_noise else [], decay=gns_decay)
        self._wrappers: BlockWrappers | None = None
        self._block_knobs: tuple[object, ...] | None = None  # what the installed wrappers do
        # torch.compile of the model, one per mode, made on first use and kept: switching back
        # to a mode reuses its compiled code (Dynamo's cache, guarded by what the forward reads).
        self._compiled: dict[str, torch.nn.Module] = {}
        self._eager = False  # see eagerly()
        self._loader_key: tuple[int, int] | None = None
        self._batches: Iterator[Any] = iter(())
        self._losses: list[torch.Tensor] = []
        self._loss_value: float | None = None  # the step's mean loss, where _check_step read it
        self._noisy = True  # whether this step feeds the gradient noise monitor
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        self._apply(config)

    # ---- configuration --------------------------------------------------------------------------

    def _apply(self, config: TrainConfig) -> None:
        """Block wrappers, micro-batch stream and loss scaling for ``config`` on the live model."""
        n = len(self.block_names)
        precisions, checkpoints = config.block_precisions(n), config.checkpoint_levels(n)
        knobs = (precisions, checkpoints, config.outer_precision)
        # The same block knobs keep the same wrappers: new wrapper functions are a new forward
        # for a compiled model (Dynamo guards on them), so reinstalling them would recompile.
        if knobs != self._block_knobs:
            if self._wrappers is not None:
                self._wrappers.remove()
            self._wrappers = apply_block_knobs(
                self.model,
                self.block_names,
                precisions,
                checkpoints,
                device_type=self.device.type,
                outer=config.outer_precision,
            )
            self._block_knobs = knobs
        if config.uses_fp16 and not self.scaler.is_enabled():
            self.scaler = torch.amp.GradScaler(self.device.type)
        elif not config.uses_fp16:
            self.scaler = torch.amp.GradScaler(self.device.type, enabled=False)
        key = (config.micro_batch_size, config.seed)
        if key != self._loader_key:
            self._batches = self._batch_stream(config.micro_batch_size, config.seed)
            self._loader_key = key
        return None

    def _batch_stream(self, micro_batch_size: int, seed: int) -> Iterator[Any]:
        stream = self.stream
        if stream is not None:
            while True:  # lazy: draws only when a step asks, so a reconfiguration loses no samples
                yield stream.next(micro_batch_size)
        wl = self.workload
        if wl.iterable:  # no sampler, no shuffle: the dataset's own order
            loader = wl.loader(micro_batch_size, drop_last=True)
        else:
            generator = torch.Generator().manual_seed(seed)
            sampler = RandomSampler(wl.dataset, generator=generator)  # type: ignore[arg-type]
            loader = wl.loader(micro_batch_size, sampler=sampler, drop_last=True)
        while True:  # endless: a new (shuffled) epoch each time the loader runs out
            drawn = 0
            for batch in loader:
                drawn += 1
                yield batch
            if drawn == 0:  # an iterable dataset's epoch shorter than one micro-batch: it would never end
                raise WorkloadError(
                    f"workload {wl.name!r}: a micro-batch of {micro_batch_size} samples must fit in one pass over "
                    "its IterableDataset, but a pass yielded fewer."
                )

    @property
    def forward_model(self) -> torch.nn.Module:
        """What the step calls: the model, or its ``torch.compile`` in the configuration's mode
        (compiled on first use, then kept; the weights are the model's own)."""
        mode = self.config.compile
        if mode == "none" or self._eager:
            return self.model
        if mode not in self._compiled:
            # The compile itself happens at the first call (the next step), not here. The first
            # torch.compile of a process imports inductor, whose import of torch.utils.mkldnn
            # warns that torch.jit.script_method is deprecated: torch's noise, not the user's.
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.script_method", category=DeprecationWarning)
                compiled = torch.compile(self.model, mode=None if mode == "default" else mode)
            assert isinstance(compiled, torch.nn.Module)
            self._compiled[mode] = compiled
        return self._compiled[mode]

    @contextlib.contextmanager
    def eagerly(self) -> Iterator[None]:
        """Steps inside call the model itself, compiled configuration or not: for the exact memory
        tracker, a ``TorchDispatchMode``, under which Dynamo runs the model eagerly anyway (and the
        tracker's global module hooks would fire twice through a compiled wrapper)."""
        self._eager = True
        try:
            yield
        finally:
            self._eager = False

    # ---- the step hooks ---------------------------------------------------------------------------

    def _draw(self) -> Any:
        return next(self._batches)

    def _begin_step(self, sizes: list[int], items: Sequence[int | torch.Tensor] | None) -> None:
        # The noise estimator compares micro-batches of one size with their sum (McCandlish et al.
        # 2018, App. A): a user's batch that did not divide evenly is left out of it.
        self._noisy = len(set(sizes)) == 1
        if self._noisy:
            # Cost: get_scale() is a device->host sync, paid only when fp16 loss scaling is on.
            loss_scale = self.scaler.get_scale() if self.scaler.is_enabled() else 1.0
            self.gns.begin_step(sizes[0], grad_multiplier=len(sizes) / loss_scale, items=items)
        self._losses = []

    def _micro_step(self, batch: Any, *, index: int, count: int, share: float | torch.Tensor | None) -> None:
        loss = self._loss(self.forward_model, batch)
        self.scaler.scale(loss / count if share is None else loss * share).backward()
        if self._noisy:
            self.gns.end_micro_batch()
        # Scaled so that the step's mean over micro-batches is the weighted mean loss (autotune.loss_items).
        self._losses.append(loss.detach() if share is None else loss.detach() * (share * count))

    def _check_step(self) -> tuple[float, bool]:
        mean = torch.stack(self._losses).float().mean()
        finite = torch.isfinite(mean)
        if not self.scaler.is_enabled():  # fp16 loss scaling finds inf gradients itself: an overflow step
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            finite = finite & finite_gradients(grads).to(finite.device)
        # One sync point, before the optimizer step (the step's mean loss is read here rather than after it).
        loss, ok = torch.stack([mean, finite.float()]).tolist()
        self._loss_value = loss
        return loss, ok == 1.0

    def _skip_step(self) -> None:
        super()._skip_step()
        self.gns.end_step([])  # the noise estimate leaves the step out
        self._losses, self._loss_value = [], None

    def _end_step(self) -> tuple[float, bool]:
        overflow = self._optimizer_step()
        self.optimizer.zero_grad(set_to_none=True)
        loss, self._loss_value = self._loss_value, None
        if loss is None:  # not checked before the update (skip_nonfinite=False): a sync point, after it
            loss = torch.stack(self._losses).float().mean().item()
        self._losses = []
        if self.device.type == "cuda":  # ends the step's work on the device
            torch.cuda.synchronize(self.device)
        return loss, overflow

    def _optimizer_step(self) -> bool:
        params = [p for p in self.model.parameters() if p.grad is not None]
        if self.scaler.is_enabled():
            self.scaler.unscale_(self.optimizer)
        if self._noisy:
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
        """Remove wrappers and hooks from the model, and drop the batch stream: a suspended
        generator holds the trainer in a reference cycle, which only the cyclic collector frees,
        so a closed trainer's model copy and optimizer state would stay on the GPU into the next
        configuration's measurement, counted in its peak (one more for every configuration
        measured before it in the process)."""
        if self._wrappers is not None:
            self._wrappers.remove()
            self._wrappers = None
        self._block_knobs = None
        self._compiled.clear()
        self.gns.remove()
        self._batches = iter(())
        self._loader_key = None
