"""``torch.compile`` decided by measurement: a configuration re-timed eager and compiled, side by side.

Compiling changes a step's speed and its memory, and costs compile seconds first. So the
recommended configuration is timed both ways on one training loop of a private copy of the model
(:func:`autotune.measurement.sidebyside.retime`: the same warm-up rule, interleaved rounds,
median and spread), and compile is recommended only when the compiled step wins round by round
beyond the noise (:func:`~autotune.measurement.sidebyside.separated_by_rounds`) and its peak fits
the budget.

* compile seconds: what the compiled configuration's warm-up steps took beyond its steady step
  (the first step compiles; a later one may compile again for a new shape);
* payback: compile seconds / (eager step - compiled step): after that many steps the run has
  saved what the compile cost;
* peaks: the CUDA caching allocator's allocated peak over one untracked step of each. autotune's
  exact tracker (:mod:`autotune.measurement.tracker`) is a ``TorchDispatchMode``, under which
  Dynamo runs the model eagerly, so on the CPU, which has no caching allocator to ask, a compiled
  step's peak is not measured here (None) and the verdict rests on time alone
  (:func:`compiled_step_memory` counts it, and is not part of the verdict yet).

The study's recommendation and ``tune``'s best call :func:`compare_compiled`;
:func:`compile_line` is the one line they print.

:func:`compiled_step_memory` counts what one step holds without a dispatch mode, so a compiled step
on the CPU is seen as it runs: the bytes autograd keeps for backward (``saved_tensors_hooks`` see
the tensors AOTAutograd's compiled function saves, as they see eager autograd's), and the CPU
allocator's own peak of the step under ``torch.profiler``. It is what
``benchmarks/compile_check.py`` compares the compiler's recompute knob
(``torch._functorch.config.activation_memory_budget``) with per-block recompute by.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.config import COMPILE_MODES, CompileMode
from autotune.errors import ConfigError
from autotune.measurement.sidebyside import Timing, retime, separated_by_rounds

if TYPE_CHECKING:
    import torch

    from autotune.config import TrainConfig
    from autotune.train.local import Trainer
    from autotune.workload import Workload

__all__ = ["CompileCheck", "StepMemory", "compare_compiled", "compile_line", "compiled_step_memory", "payback_steps"]

MIB = 1024**2


def payback_steps(*, compile_seconds: float, eager_step: float, compiled_step: float) -> float | None:
    """Steps after which a compiled run has saved its compile seconds: ``compile_seconds /
    (eager_step - compiled_step)``; None when the compiled step is not faster (it never pays back).

    Example:
        >>> payback_steps(compile_seconds=20.0, eager_step=0.25, compiled_step=0.125)
        160.0
    """
    saved = eager_step - compiled_step
    if saved <= 0:
        return None
    return max(compile_seconds, 0.0) / saved


@dataclass(frozen=True, kw_only=True)
class CompileCheck:
    """A configuration timed eager and compiled side by side.

    ``eager`` / ``compiled``: samples/s of the interleaved timed steps. ``samples``: samples per
    step (turns a rate into step seconds). ``warmup_seconds``: each untimed warm-up step of the
    compiled configuration (the first one compiles). ``eager_peak`` / ``compiled_peak``: bytes,
    None where not measured (the CPU). ``memory_budget``: bytes, None for none. ``rounds``: of
    the side-by-side timing. ``other_cores``: cores other processes used while timing.
    """

    mode: CompileMode
    eager: Timing
    compiled: Timing
    samples: int
    warmup_seconds: tuple[float, ...]
    eager_peak: int | None
    compiled_peak: int | None
    memory_budget: int | None = None
    rounds: int = 0
    other_cores: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in COMPILE_MODES or self.mode == "none":
            raise ConfigError(f"CompileCheck.mode must be 'default' or 'max-autotune', but got {self.mode!r}.")
        if self.samples < 1:
            raise ConfigError(f"CompileCheck.samples must be >= 1, but got {self.samples!r}.")

    @property
    def eager_step(self) -> float:
        """Seconds of the median eager step."""
        return self.samples / self.eager.median

    @property
    def compiled_step(self) -> float:
        """Seconds of the median compiled step (steady state)."""
        return self.samples / self.compiled.median

    @property
    def speedup(self) -> float:
        """Compiled samples/s over eager samples/s."""
        return self.compiled.median / self.eager.median

    @property
    def compile_seconds(self) -> float:
        """What the compiled warm-up steps took beyond the steady compiled step."""
        return sum(max(0.0, s - self.compiled_step) for s in self.warmup_seconds)

    @property
    def payback_steps(self) -> float | None:
        return payback_steps(
            compile_seconds=self.compile_seconds, eager_step=self.eager_step, compiled_step=self.compiled_step
        )

    @property
    def faster(self) -> bool:
        """The compiled step is faster round by round, beyond the noise (with fewer than two
        rounds, beyond both spreads)."""
        return separated_by_rounds(self.compiled, self.eager, rounds=self.rounds)

    @property
    def over_budget(self) -> bool:
        """The compiled step's measured peak exceeds the budget."""
        budget, peak = self.memory_budget, self.compiled_peak
        return budget is not None and peak is not None and peak > budget

    @property
    def recommended(self) -> bool:
        """Faster beyond the noise and within the budget."""
        return self.faster and not self.over_budget

    @property
    def verdict(self) -> str:
        if self.over_budget:
            return "not recommended (its peak exceeds the memory budget)"
        if self.recommended:
            return "recommended"
        if self.speedup > 1.0:
            return "not recommended (within the noise)"
        return "not recommended (slower)"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["eager"], d["compiled"] = list(self.eager.rates), list(self.compiled.rates)
        d["warmup_seconds"] = list(self.warmup_seconds)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompileCheck:
        return cls(
            **{
                **d,
                "eager": Timing(rates=tuple(d["eager"])),
                "compiled": Timing(rates=tuple(d["compiled"])),
                "warmup_seconds": tuple(d["warmup_seconds"]),
            }
        )


def compile_line(check: CompileCheck) -> str:
    """The one line a study or ``tune`` prints, e.g. ``torch.compile: 1.18x eager (step 41.2 ms vs
    48.6 ms, peak 310 MiB vs 342 MiB), compile 38 s, pays back after 5,100 steps: recommended``."""
    mode = "" if check.mode == "default" else f" (mode {check.mode})"
    step = f"step {check.compiled_step * 1e3:.1f} ms vs {check.eager_step * 1e3:.1f} ms"
    if check.compiled_peak is not None and check.eager_peak is not None:
        memory = f"peak {check.compiled_peak / MIB:.0f} MiB vs {check.eager_peak / MIB:.0f} MiB"
    else:
        memory = "peak not measured: no allocator to ask on the CPU"
    payback = check.payback_steps
    pays = "never pays back" if payback is None else f"pays back after {_round(payback):,} steps"
    return (
        f"torch.compile{mode}: {check.speedup:.2f}x eager ({step}, {memory}), compile {check.compile_seconds:.0f} s, "
        f"{pays}: {check.verdict}"
    )


def _round(steps: float) -> int:
    """Two significant figures: the payback is an estimate from noisy medians."""
    n = max(1, round(steps))
    digits = len(str(n))
    return n if digits <= 2 else round(n, 2 - digits)


def compare_compiled(
    workload: Workload,
    config: TrainConfig,
    *,
    mode: CompileMode = "default",
    device: str | None = None,
    memory_budget: int | None = None,
    rounds: int = 3,
    max_rounds: int = 6,
    steps_per_round: int = 2,
) -> CompileCheck:
    """Time ``config`` eager and compiled in ``mode`` side by side on one training loop of a
    private copy of ``workload``'s model (switching between them swaps only what the step calls:
    the block wrappers stay, so the compiled code is reused), then read each one's peak over one
    more untracked step where an allocator can say it (CUDA).

    Cost: the compile (tens of seconds on a small model on 2 CPU cores; longer with
    ``max-autotune``) plus both configurations' warm-up and (rounds x steps_per_round) steps.

    Raises:
        ConfigError: ``mode`` is not a compile mode, or ``config`` runs on DeepSpeed ranks.
    """
    from autotune.measurement.cuda_memory import AllocatorStats, allocator_source
    from autotune.train.local import Trainer

    if mode not in COMPILE_MODES or mode == "none":
        raise ConfigError(f"compare_compiled: mode must be 'default' or 'max-autotune', but got {mode!r}.")
    if config.on_deepspeed:
        raise ConfigError(f"compare_compiled: a local-runner configuration only, but got {config.describe()}.")
    eager, compiled = dataclasses.replace(config, compile="none"), dataclasses.replace(config, compile=mode)
    trainer = Trainer(workload, eager, device=device, skip_nonfinite=False)
    compiled_seconds: list[float] = []  # every compiled step's, the warm-up's first

    def step(c: TrainConfig) -> tuple[int, float]:
        if trainer.config != c:
            trainer.reconfigure(c)
        r = trainer.step()
        if c is compiled:
            compiled_seconds.append(r.seconds)
        return r.samples, r.seconds

    steps: list[Callable[[], tuple[int, float]]] = [lambda: step(eager), lambda: step(compiled)]
    try:
        # retime warms each configuration up before any timed round: the compiled one's first
        # len(warmup) steps are its warm-up, the compile among them.
        result = retime(steps, rounds=rounds, max_rounds=max_rounds, steps_per_round=steps_per_round)
        warmup = compiled_seconds[: result.warmup[1]]
        allocator = allocator_source(trainer.device)
        peaks: list[int | None] = []
        for c in (eager, compiled):
            if allocator is None:
                peaks.append(None)
                continue
            allocator.reset_peak_memory_stats(trainer.device)
            step(c)
            peaks.append(AllocatorStats.read(allocator, trainer.device).allocated_peak)
    finally:
        trainer.close()
    return CompileCheck(
        mode=mode,
        eager=result.timings[0],
        compiled=result.timings[1],
        samples=config.effective_batch_size,
        warmup_seconds=tuple(warmup),
        eager_peak=peaks[0],
        compiled_peak=peaks[1],
        memory_budget=memory_budget,
        rounds=result.rounds,
        other_cores=result.other_cores,
    )


@dataclass(frozen=True, kw_only=True)
class StepMemory:
    """What one training step held, counted without a dispatch mode (so a compiled step runs compiled).

    Attributes:
        saved: bytes autograd held for backward at the end of a forward: the unique storages the
            step's saved tensors live in (each counted once, whatever views of it were saved), the
            model's parameters and buffers left out (they are held anyway), the batch's tensors
            counted where they are saved. The largest over the step's micro-batches (each one's are
            freed by its backward). What recompute trades: full recompute of every block, or a
            compiled graph partitioned with ``activation_memory_budget=0``, saves the least.
        allocated_peak: the most bytes allocated within the step and alive at once, by the CPU
            allocator's own count (``torch.profiler`` with ``profile_memory=True``): activations,
            backward's temporaries and the gradients, over what was held before the step; None
            where this torch's profiler does not expose its allocation events.
    """

    saved: int
    allocated_peak: int | None


class _SavedStorages:
    """``saved_tensors_hooks``' pack hook: the unique storages saved per micro-batch."""

    def __init__(self, held: set[int]) -> None:
        self.held = held  # data pointers of the storages left out (parameters, buffers)
        self.current: dict[int, int] = {}  # data pointer -> nbytes, this micro-batch
        self.largest = 0

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        # A saved tensor keeps its storage alive until backward, so no other saved storage of the
        # same forward can reuse its address.
        if storage.data_ptr() not in self.held:
            self.current[storage.data_ptr()] = storage.nbytes()
        # Detached, the same storage: a saved output packed as itself holds its own grad_fn, a
        # reference cycle that keeps a graph the forward discards alive past it (not as it runs).
        return tensor.detach()

    def next_micro_batch(self) -> None:
        self.largest = max(self.largest, sum(self.current.values()))
        self.current = {}


def compiled_step_memory(trainer: Trainer) -> StepMemory:
    """Run one real optimizer step of ``trainer`` as it runs (compiled where its configuration
    compiles: no dispatch mode, unlike the exact tracker) and count what it held.

    Run it after the compiling steps: a step that compiles counts the compiler's own allocations.
    Cost: the profiler's per-operator record, a fraction of a step.

    Returns:
        :class:`StepMemory`: the bytes saved for backward and the allocator's peak of the step.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    model = trainer.model
    held = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    saved = _SavedStorages(held)
    with (
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
        torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda tensor: tensor),
    ):
        trainer.step(before_micro_batch=saved.next_micro_batch)
    saved.next_micro_batch()
    return StepMemory(saved=saved.largest, allocated_peak=_allocated_peak(prof))


def _allocated_peak(prof: torch.profiler.profile) -> int | None:
    """The largest ``total_allocated`` of the profile's allocation events: the CPU allocator's
    count of the bytes allocated since the profiler started and not yet freed (blocks allocated
    before it are in no event). The events are reached through the profiler's result tree, which
    torch does not document: None where it is absent."""
    import torch

    allocation = getattr(torch._C._profiler, "_ExtraFields_Allocation", None)
    results = None if prof.profiler is None else getattr(prof.profiler, "kineto_results", None)
    tree = getattr(results, "experimental_event_tree", None)
    if allocation is None or tree is None:
        return None
    peak = 0
    stack = list(tree())
    while stack:
        event = stack.pop()
        if isinstance(event.extra_fields, allocation):
            peak = max(peak, int(event.extra_fields.total_allocated))
        stack.extend(event.children)
    return peak
