"""``Adaptive``: the user's own training run, kept at the best configuration as training changes.

The user's model and optimizer are trained in place (no copy) by the local training loop
(:class:`autotune.adapt.loop.InPlaceTrainer`); :meth:`Adaptive.on_ranks` trains a workload on
DeepSpeed ranks instead (:class:`autotune.adapt.ranks.RankLoop`), where the ZeRO stage is a knob
too. Either way, every ``decide_every`` steps a decision source (the pretrained policy, a fixed
configuration, a user's policy file, any :class:`DecisionSource`) may propose another
configuration; the budget gate (:mod:`autotune.memory.gate`) admits it only if its peak memory
(per rank) is known to fit. The first step under a configuration whose prediction the gate
does not trust runs under exact memory tracking (1.1-15x a step, once per configuration; every
configuration with ``track_memory=True``, and on ranks); a configuration measured over the
budget is left at once. The decisions themselves are :class:`autotune.adapt.controller.Controller`'s, which
the framework callbacks share: on the local loop a proposal is measured side by side with the
configuration it replaced (steps alternating) and kept only if clearly better. Every decision,
applied or refused, is in :attr:`Adaptive.history`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from autotune.adapt.arguments import check_decisions, check_int, check_optimizer, track_mode
from autotune.adapt.controller import Controller
from autotune.adapt.loop import AdaptLoop, LoopHooks, in_place
from autotune.adapt.on_ranks import rank_start
from autotune.adapt.prepared import framework_inner
from autotune.adapt.recompiles import Recompiles, user_compiled
from autotune.adapt.records import AdaptStep
from autotune.adapt.run_resume import RunResume
from autotune.adapt.shape_guard import ShapeGuard
from autotune.adapt.source_choice import PolicyArg, decision_source
from autotune.adapt.sources import outer_in_play, reduced_in_play, selective_in_play
from autotune.batches import batch_size
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.progress import Note, notes
from autotune.memory.gate import BudgetGate
from autotune.tuning import TUNING
from autotune.units import DEFAULT_PEAK, MemoryBudget
from autotune.workload import Workload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.utils.data import Dataset

    from autotune.procs.session import RankSession
    from autotune.train.base import StepResult


# decision_source and selective_in_play stay importable from here, where they were first.
__all__ = ["Adaptive", "PolicyArg", "decision_source", "selective_in_play"]


class Adaptive(RunResume):
    """Train ``model`` with ``optimizer`` in place, adapting how each step is computed.

    Every ``decide_every`` steps the decision source may propose another configuration
    (micro-batch split, per-block precision, activation checkpointing); the budget gate admits it
    only if its peak memory is known to fit ``memory_budget``. The effective batch stays
    ``batch_size`` unless ``adapt_batch``. Every decision, applied or refused, is in
    :attr:`history`. On DeepSpeed ranks, with the ZeRO stage as a knob too: :meth:`on_ranks`
    (a workload reference: the model lives in the rank processes).

    Args:
        model: The user's model: the one trained (no copy, nothing moved). What Lightning
            Fabric's ``fabric.setup`` or Accelerate's ``accelerator.prepare`` returned on one
            device is trained inside its wrapper (:mod:`autotune.adapt.prepared`: the framework's
            precision is where the knobs take over).
        optimizer: The user's optimizer over ``model``'s parameters (the memory model counts
            the state of its class with its parameter groups: :mod:`autotune.optimizers`), or
            Fabric's or Accelerate's wrapper of it.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``.
        dataset: A map-style dataset or an ``IterableDataset`` (see :class:`~autotune.Workload`):
            the data of :meth:`step` with no batch, and the memory model's profile either way.
        batch_size: The effective batch in samples: by default it never changes (only its split
            into micro-batches x accumulation does).
        memory_budget: Peak tensor bytes allowed: ``"8GiB"``, bytes, ``"75%"`` of the default
            configuration's predicted peak, or None (100%: adaptation never uses more memory
            than the default run). A budget below the default's peak starts from the first of
            smaller micro-batches, then recompute, that fits.
        policy: Where decisions come from (see :func:`~autotune.adapt.decision_source`); default
            the pretrained policy; None makes no decisions.
        decide_every: Optimizer steps between decisions (>= 2: never every step).
        adapt_batch: Let the effective batch grow with the gradient noise scale (see
            :mod:`autotune.adapt.batch`), up to ``max_batch_size``.
        min_efficiency: With ``adapt_batch``: the batch doubles only while the doubled batch keeps
            at least this fraction, in (0, 1], of ``batch_size``'s per-sample progress.
        max_batch_size: With ``adapt_batch``: the largest effective batch (default 8 x
            ``batch_size``; at least ``batch_size``).
        blocks: Block module names (default: auto-detected, see :func:`autotune.block_detection.find_blocks`).
        device: Where batches go (default: the model's device).
        grad_clip: Max global gradient norm, as in :class:`~autotune.TrainConfig` (default None:
            no clipping, the user's loop decides that).
        lr_scaling: How the learning rate follows the effective batch, as in
            :class:`~autotune.TrainConfig` (``"linear"``, ``"sqrt"``, ``"none"``).
        seed: Seed of data order and any randomness in the loop.
        track_memory: Which configurations' first step runs under exact memory tracking (their
            measured bytes then replace the prediction, and one measured over the budget is left
            at once): ``"unverified"`` (default) those whose prediction the gate does not trust
            (:meth:`BudgetGate.trusts`: verified by a check against a real step that came within
            the gate's 2% headroom), True or ``"all"`` every one, False or ``"none"`` none (then
            only verified predictions admit). Why not always: a tracked step costs more than a
            plain one, up to an order of magnitude more on the CPU.
        name: The run's name in reports and warnings.
        collate_fn: Batches the dataset's samples (default: the DataLoader's default collate).
        worst_case_batch: A batch at the longest shapes the data can produce: the budget gate
            predicts at it (``Workload.worst_case_batch``); None scans a map-style dataset. A
            :meth:`step` batch larger still is predicted at its shape before it runs, and the
            step split if it would not fit (:mod:`autotune.adapt.shape_guard`).
        min_micro_batch: The smallest micro-batch the run may split the batch into
            (``Workload.min_micro_batch``); None: any, except for a model with BatchNorm layers
            in training, whose micro-batch stays the batch (their statistics are the micro-batch's).
        loss_items: What ``loss_fn``'s mean is over, so that each split of your batch trains its
            gradient (``Workload.loss_items``): ``"auto"`` (default: for batches with Hugging
            Face ``labels``, their tokens or samples, whichever reproduces your loss's gradient,
            measured once), ``"samples"``, or ``batch -> count``.
        objective: Which measured configuration within the budget the run keeps (a trial is
            kept only if it measures better by it, else the run goes back to the best by it; and
            :attr:`best`): ``"per-gib"`` (default), the most samples/s per GiB of peak, or
            ``"throughput"``, the most samples/s (one dedicated GPU: its memory up to the budget
            is free to use). The pretrained policy proposes as it was trained (per GiB) either way.
        progress: What the setup before the first step does, one line per phase with its seconds
            (the memory model's fake-tensor profile and checks, the machine probe, the start
            plan's calibration: on the CPU a minute or more for a real model): True (default) on
            stderr after ``autotune:``, False none, or a callable given each line.

    Raises:
        ConfigError: an argument out of range, or no configuration (smaller micro-batches, then
            recompute) fits ``memory_budget`` (the callbacks raise the same from their
            train-begin hooks: see :class:`~autotune.adapt.Controller`).
        WorkloadError: ``model``, ``dataset``, ``loss_fn`` or ``blocks`` break the workload
            contract (:class:`~autotune.Workload`).
        UnsupportedError: a model wrapped for several ranks (DDP, FSDP, a DeepSpeed engine,
            Fabric's multi-device strategies), or prepared with a precision autotune cannot take
            over (:func:`autotune.adapt.prepared.framework_inner`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from autotune import Adaptive, TrainConfig
        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return nn.functional.cross_entropy(model(x), y)
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        >>> run = Adaptive(model, optimizer, loss_fn, data, batch_size=16,
        ...                policy=TrainConfig(micro_batch_size=8, grad_accum_steps=2))
        >>> for _ in range(3):
        ...     step = run.step()
        >>> step.step, run.config.describe()
        (2, 'micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0')
        >>> print(run.history[0].describe())  # doctest: +ELLIPSIS
        step 0: applied micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0 (fixed: the fixed configuration; ...)
        >>> run.close()  # the model is exactly as it was given, trained
    """

    # Entered around every use of the model (autotune.adapt.prepared.Prepared.in_use); on ranks: nothing.
    _in_use: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        dataset: Dataset[Any],
        *,
        batch_size: int,
        memory_budget: MemoryBudget | str | int | None = None,
        policy: PolicyArg = "pretrained",
        decide_every: int = 50,
        adapt_batch: bool = False,
        min_efficiency: float = 0.9,
        max_batch_size: int | None = None,
        blocks: Sequence[str] | None = None,
        device: str | torch.device | None = None,
        grad_clip: float | None = None,
        lr_scaling: str = "linear",
        seed: int = 0,
        track_memory: bool | str = "unverified",
        name: str = "user",
        collate_fn: Callable[[list[Any]], Any] | None = None,
        worst_case_batch: Any = None,
        min_micro_batch: int | None = None,
        loss_items: str | Callable[[Any], Any] = "auto",
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        progress: bool | Note = True,
    ) -> None:
        check_int("batch_size", batch_size, 1)
        check_optimizer(optimizer)
        prepared = framework_inner(model, optimizer)
        if prepared.line is not None:
            notes(progress)(prepared.line)
        model, optimizer, self._in_use = prepared.model, prepared.optimizer, prepared.in_use
        # Accelerate's model runs its own forward while autotune profiles, checks and trains it.
        with self._in_use():
            workload = Workload(
                name=name,
                model=model,
                dataset=dataset,
                loss_fn=loss_fn,
                blocks=blocks,
                optimizer=optimizer,  # each copy gets one of its class and groups (autotune.optimizers)
                batch_size=batch_size,
                collate_fn=collate_fn,
                worst_case_batch=worst_case_batch,
                min_micro_batch=min_micro_batch,
                loss_items=loss_items,
            )
            if workload.loss_weighting.said:  # how each step splits your batch: its gradient
                notes(progress)(workload.loss_weighting.line)
            self._setup(
                workload,
                _default_config(workload, grad_clip=grad_clip, lr_scaling=lr_scaling, seed=seed),
                in_place(workload, model=model, optimizer=optimizer, device=device),
                memory_budget=memory_budget,
                policy=policy,
                decide_every=decide_every,
                adapt_batch=adapt_batch,
                min_efficiency=min_efficiency,
                max_batch_size=max_batch_size,
                track_memory=track_memory,
                device_type=next((p.device.type for p in model.parameters()), "cpu"),
                paired=True,
                objective=objective,
                compiled=user_compiled(model),
                progress=progress,
            )

    @classmethod
    def on_ranks(
        cls,
        workload: str | Workload,
        *,
        ranks: int,
        memory_budget: MemoryBudget | str | int | None = None,
        policy: PolicyArg = "pretrained",
        decide_every: int = 50,
        device: str | None = None,
        grad_clip: float | None = None,
        lr_scaling: str = "linear",
        seed: int = 0,
        track_memory: bool | str = True,
        timeout: float = 600.0,
        session: RankSession | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        progress: bool | Note = True,
    ) -> Adaptive:
        """Train a workload on ``ranks`` DeepSpeed ranks, adapting its configuration, ZeRO stage included.

        The model lives in the rank processes, each rebuilding it from the workload's reference, so
        this takes a reference and there is no ``model`` here. The workload's batch is the effective
        batch over all ranks; the budget and the gate's predictions are per rank. How the ranks
        share the batch, the budget and the decisions: "On DeepSpeed ranks" in the adaptive
        training guide (``docs/adaptive.md``).

        Args:
            workload: A workload reference (``"gpt-tiny"``, ``"path/to/file.py:build"``,
                ``"package.module:build"``), or a :class:`~autotune.Workload` loaded from one.
            ranks: DeepSpeed data-parallel ranks, >= 2 (one process: construct :class:`Adaptive`).
            memory_budget: Per rank, as for :class:`Adaptive` (a percentage: of the default
                configuration's predicted peak per rank).
            policy: As for :class:`Adaptive`.
            decide_every: As for :class:`Adaptive`.
            device: ``cpu``, ``cuda`` (one GPU per rank) or None (CUDA when available).
            grad_clip: As for :class:`Adaptive`.
            lr_scaling: As for :class:`Adaptive`.
            seed: As for :class:`Adaptive`.
            track_memory: As for :class:`Adaptive`, but every configuration by default.
            timeout: Seconds one command to the ranks (a step, a reconfiguration) may take.
            session: A running :class:`~autotune.procs.session.RankSession` of ``ranks`` ranks to
                train in instead of starting one; :meth:`close` leaves it open for its owner.
            objective: As for :class:`Adaptive`.
            progress: As for :class:`Adaptive`.

        Returns:
            The run, its ranks started.

        Raises:
            ConfigError: an argument out of range, a ``session`` closed or of another rank
                count, a batch that does not divide by ``ranks``, or nothing fits the budget.
            WorkloadError: the workload reference cannot be resolved.
            UnsupportedError: a device the DeepSpeed runner does not run on.

        Example:
            It starts DeepSpeed processes, so it runs in CI as ``examples/ranks.py``
            (``make examples``), not as a doctest::

                with Adaptive.on_ranks("path/to/file.py:build", ranks=2, memory_budget="85%") as run:
                    losses = [run.step().loss for _ in range(12)]
                print(run.history)
        """
        start = rank_start(
            workload,
            ranks=ranks,
            device=device,
            grad_clip=grad_clip,
            lr_scaling=lr_scaling,
            seed=seed,
            timeout=timeout,
            session=session,
        )
        self = cls.__new__(cls)
        self._setup(
            start.workload,
            start.default,
            start.loop,
            memory_budget=memory_budget,
            policy=policy,
            decide_every=decide_every,
            adapt_batch=False,
            min_efficiency=1.0,
            max_batch_size=None,
            track_memory=track_memory,
            device_type=start.device_type,
            objective=objective,
            progress=progress,
        )
        return self

    def _setup(
        self,
        workload: Workload,
        default: TrainConfig,
        loop: Callable[[TrainConfig, bool], AdaptLoop],
        *,
        memory_budget: MemoryBudget | str | int | None,
        policy: PolicyArg,
        decide_every: int,
        adapt_batch: bool,
        min_efficiency: float,
        max_batch_size: int | None,
        track_memory: bool | str,
        device_type: str,
        paired: bool = False,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        compiled: bool = False,
        progress: bool | Note = True,
    ) -> None:
        """What both loops share: the source, the gate, the starting config, then ``loop(start, noise)``."""
        objective, self.max_batch_size = check_decisions(
            batch_size=workload.batch_size,
            decide_every=decide_every,
            objective=objective,
            min_efficiency=min_efficiency,
            max_batch_size=max_batch_size,
        )
        self.workload = workload
        self.source = decision_source(policy)
        self.decide_every, self.adapt_batch, self.min_efficiency = decide_every, adapt_batch, min_efficiency
        self.track_memory = track_mode(track_memory)
        self._device_type = device_type
        budget = MemoryBudget.parse(memory_budget, default=DEFAULT_PEAK)
        note = notes(progress)
        self._build_gate(budget, default, device_type, note)
        # The local loop switches configuration in ~1 ms: a proposal is measured side by side there.
        self._hooks = LoopHooks(paired=paired)
        self.controller = self._controller(default, budget.fraction, objective=objective, compiled=compiled, note=note)
        self.decider = self.controller.decider
        start = self.controller.begin(workload, device_type=device_type)  # raises if nothing fits
        wants_noise = adapt_batch or (self.source is not None and self.source.needs_noise)
        self.trainer = self._hooks.trainer = loop(start, wants_noise)  # the ranks start here: after every check
        self._noise = self._hooks.noise = wants_noise and self.trainer.noise is not None
        self.steps = []
        self._ran = set()

    def _build_gate(self, budget: MemoryBudget, default: TrainConfig, device_type: str, note: Note) -> None:
        """The budget gate, and the shape guard of ``step(batch)`` over it."""
        reduced = reduced_in_play(self.source, self.workload)
        selective = selective_in_play(self.source, default, len(self.workload.block_names()))
        outers = outer_in_play(self.source, default, held=self.workload.held_in_16_bits is not None)  # default's first
        self.gate = BudgetGate.build(
            self.workload,
            budget,
            default,
            reduced_precision=reduced,
            device_type=device_type,
            selective=selective,
            outers=outers[1:],
            note=note,
        )
        self.guard = ShapeGuard(self.workload, self.gate, reduced_precision=reduced, selective=selective, outers=outers)

    def _controller(
        self, default: TrainConfig, fraction: float | None, *, objective: ObjectiveName, compiled: bool, note: Note
    ) -> Controller:
        """The run's controller over its hooks, source and gate."""
        workload = self.workload
        return Controller(
            frontend=self._hooks,
            source=self.source,
            gate=self.gate,
            default=default,
            fraction=fraction,
            decide_every=self.decide_every,
            adapt_batch=self.adapt_batch,
            min_efficiency=self.min_efficiency,
            max_batch_size=self.max_batch_size,
            min_micro_batch=workload.micro_batch_floor,
            micro_why=workload.micro_batch_reason,
            objective=objective,
            # The user's compiled model: each change of block knobs recompiles (adapt/recompiles.py).
            recompiles=(
                Recompiles(num_blocks=len(workload.block_names()), horizon=self.decide_every) if compiled else None
            ),
            note=note,
        )

    def step(self, batch: Any = None) -> AdaptStep:
        """One optimizer step of the user's model; every ``decide_every`` steps, one decision.

        Args:
            batch: None: the next batch of the dataset given at construction. Else the user's own
                batch for the whole step, as their DataLoader yields it at the effective batch
                size (or fewer samples: the last batch of an epoch): any pytree of tensors sharing
                a leading batch dimension (dicts, tuples, ``BatchEncoding``). The step splits it
                into the configuration's micro-batches, each loss weighted by its share of the
                samples or label tokens (``loss_items``): the gradient of the one full batch.

        Returns:
            The step's record: its loss, samples, seconds, learning rate, configuration and, when
            it ran under exact memory tracking, its peak bytes.

        A step whose loss or any gradient is NaN or infinite is skipped before the optimizer runs
        (in one process): the parameters, the optimizer's state and learning rates are exactly the
        step before's, the gradients cleared; it still counts as a step (its record is in
        :attr:`steps`, with its loss), as an fp16 overflow step does.

        Raises:
            NonFiniteLossError: The step's loss or a gradient is NaN or infinite and the run makes
                decisions (a decision source, or ``adapt_batch``); the step is in :attr:`steps`,
                its update skipped (a checkpoint saved after catching it holds the weights of the
                step before). A run without decisions warns
                (:class:`~autotune.errors.NonFiniteLossWarning`) at its first one and goes on.
            BatchError: ``batch`` breaks that contract (see :mod:`autotune.batches`).
            ConfigError: ``batch`` with ``adapt_batch=True`` (the batch given is the batch trained).
            UnsupportedError: ``batch`` on ranks (each rank draws its shard of the workload's dataset).
        """
        with self._in_use():
            return self._step(batch)

    def _step(self, batch: Any) -> AdaptStep:
        t = self.trainer
        if batch is not None:
            self._check_batch(batch)
        want = self.controller.before_step()  # a side-by-side trial alternates configurations
        if want is not None and want != t.config:
            t.reconfigure(want)
        if batch is not None:
            self.guard.apply(batch, t, self.decider)  # a batch longer than any seen: checked before it runs
            t.feed(batch)
        record, result, throughput = self._run_step(t)
        peak = record.peak_bytes
        self.controller.after_step(
            record.step,
            config=record.config,
            loss=result.loss,
            throughput=throughput,
            peak=peak,
            allocator=t.allocator_stats if peak is not None else None,
            skipped=result.skipped,
            seconds=result.seconds,
        )
        return record

    def _check_batch(self, batch: Any) -> None:
        """Refuse a user's batch before anything changes (see :meth:`step`'s Raises)."""
        if self.adapt_batch:
            raise ConfigError(
                "step(batch) trains the batch it is given, so the effective batch cannot grow: "
                "adapt_batch must be False, but got True."
            )
        batch_size(batch)  # a malformed batch is refused before anything changes

    def _run_step(self, t: AdaptLoop) -> tuple[AdaptStep, StepResult, float | None]:
        """The loop's next step under its configuration: tracked, split for the noise estimate, or
        plain; recorded in :attr:`steps`.

        Returns:
            Its record, its result and its throughput (a timed step; else None).
        """
        config, index, peak, throughput = t.config, t.step_count, None, None
        if t.noise is not None:
            # The noise estimate folds in only the last steps before a decision (see SampledNoise).
            t.noise.enabled = self._noise and (-(index + 1)) % self.decide_every < TUNING.noise_steps
        # Adam creates its state in the first step, after the activation peak: track from step 1.
        if index >= 1 and config not in self.gate.measured and self._tracks(config):
            result, peak = t.measured_step()
        elif self._noise and (index + 1) % self.decide_every == 0 and t.noise_split == 2:
            result = t.step(split=2)  # two batch sizes for the noise estimate: same gradient
        else:
            result = t.step()
            # A configuration's first step in this process pays one-time costs (oneDNN kernels
            # compiled per new shape and dtype, cuDNN autotuning, allocator growth): never timed.
            if index >= 1 and config in self._ran and not result.skipped:
                throughput = result.samples / result.seconds
        self._ran.add(config)
        record = AdaptStep(
            step=index,
            loss=result.loss,
            samples=result.samples,
            seconds=result.seconds,
            lr=result.lr,
            config=config,
            peak_bytes=peak,
        )
        self.steps.append(record)
        return record, result, throughput

    def _tracks(self, config: TrainConfig) -> bool:
        if self.track_memory == "unverified":
            return not self.gate.trusts(config)
        return self.track_memory == "all"

    def close(self) -> None:
        """Remove every wrapper and hook from the user's model: it is exactly as it was given.

        On ranks: close their engines and reap every process. ``with Adaptive(...) as run:``
        closes it on leaving the block.
        """
        self.trainer.close()

    def __enter__(self) -> Adaptive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _default_config(workload: Workload, *, grad_clip: float | None, lr_scaling: str, seed: int) -> TrainConfig:
    """The local run's own configuration: the user's batch in one micro-batch (at most the dataset), fp32."""
    batch_size = workload.batch_size
    return TrainConfig(
        micro_batch_size=min(batch_size, workload.dataset_size or batch_size),
        grad_clip=grad_clip,
        lr_scaling=lr_scaling,  # type: ignore[arg-type]
        seed=seed,
    )
