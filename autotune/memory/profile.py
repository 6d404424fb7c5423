"""What :mod:`autotune.memory.model` composes a config's memory from, measured once per workload.

:func:`fake_profile` runs forward/backward passes of a fake copy of the model under
``FakeTensorMode`` (shapes only, no compute) while ``MemTracker`` counts every storage: per
*mode* (every block fp32, every block an autocast island, 16-bit weights throughout, or every block
alike under a reduced outer precision), plain, with every block checkpointed and (if asked) with
every block recomputed selectively (:mod:`autotune.train.selective`), at two micro-batch sizes:
one run each (:mod:`autotune.memory.fake_run`), cut into windows (:mod:`autotune.memory.windows`),
recorded in a :class:`MemoryProfile` (:mod:`autotune.memory.profile_record`, whose names this
module re-exports).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, TypedDict, TypeGuard

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from autotune.config import Precision, RecomputeLevel
from autotune.errors import AutotuneError, PredictionError, one_line
from autotune.memory.fake_kernels import kernels_for
from autotune.memory.fake_logs import quiet_fake_logs
from autotune.memory.fake_run import Run, fake_model, profile_run, storage_key
from autotune.memory.profile_record import (
    MODES,
    BlockSaves,
    MemoryProfile,
    ModeProfile,
    Moment,
    Window,
    mode_precisions,
    outer_mode,
)
from autotune.memory.windows import paired_windows
from autotune.workload import Workload

__all__ = [
    "BlockSaves",
    "DEFAULT_SIZES",
    "MODES",
    "MemoryProfile",
    "ModeProfile",
    "Moment",
    "Window",
    "fake_profile",
    "mode_precisions",
    "outer_mode",
]

_WEIGHT_DTYPES = {"bf16-weights": torch.bfloat16, "fp16-weights": torch.float16}


#: The micro-batch sizes a profile runs at unless told: small, so that its real check steps are
#: cheap on the host; predictions elsewhere are on the line through them.
DEFAULT_SIZES = (2, 4)


def fake_profile(
    workload: Workload,
    *,
    modes: Sequence[str] = ("fp32",),
    micro_batch_sizes: tuple[int, int] = DEFAULT_SIZES,
    checkpointed: bool = True,
    selective: bool = False,
    reuse: MemoryProfile | None = None,
    device_type: str = "cpu",
    on_mode: Callable[[str, float], None] | None = None,
) -> MemoryProfile:
    """Profile ``workload`` for the memory model, under ``FakeTensorMode`` (shapes only, no compute),
    unchecked (``checks`` empty): :func:`autotune.memory.predict.profile_memory` also checks it
    against real steps.

    ``device_type``: whose kernels the runs save for (``"cpu"`` or ``"cuda"``), on the host either
    way (:mod:`autotune.memory.fake_kernels`: CUDA's fused attention keeps no dropout mask).

    ``checkpointed=False`` skips the runs with every block checkpointed (half the time); the
    profile then serves configs without checkpointing only. ``selective=True`` adds the runs with
    every block recomputed selectively (two more per mode), which configs with a ``"selective"``
    block need. ``reuse``: an earlier profile of the same workload, whose modes (at the same
    sizes and device type) are taken as they are, grown by the recompute runs asked for that they lack, so
    growing a profile by a mode runs only that mode's passes, and by a level only that level's.
    ``on_mode``: called with each mode ``reuse`` lacked and its seconds, as it is done (at real
    size several seconds each: a caller says each as it ends instead of one line at the end).

    Fake tensors go through the same kernels' shape logic, and MemTracker counts them as real
    ones (the same bytes on the built-in workloads, to a few hundred bytes with bf16 blocks), so
    this is cheap for any model size: under a second of Python per run (four per mode: two sizes,
    plain and checkpointed), mostly MemTracker's bookkeeping. A model the fake run cannot go
    through (a data-dependent operation, an operator without a meta kernel) raises
    :class:`PredictionError` with the reason.
    """
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"fake_profile: modes must be among {MODES}, but got {unknown[0]!r}.")
    kernels_for(device_type)  # an unknown device type fails here, before any run
    held = _held(workload, modes, micro_batch_sizes, (checkpointed, selective), reuse, device_type)
    if held is not None:
        return held
    try:
        with quiet_fake_logs():  # torch's traceback of the error below: ours is one line
            profile = _profile(
                workload, modes, micro_batch_sizes, (checkpointed, selective), reuse, device_type, on_mode
            )
    except AutotuneError:
        raise
    # The fake run executes the user's model code: whatever it raises there (FakeTensorMode's
    # DataDependentOutputException on ``.item()``/``nonzero``, an operator with no meta kernel)
    # means "cannot predict", with the reason, never a traceback in the caller.
    except Exception as e:
        raise PredictionError(f"cannot profile workload {workload.name!r} under fake tensors: {one_line(e)}") from e
    from autotune.memory.structure import detect_structure

    return dataclasses.replace(
        profile,
        structure=detect_structure(workload),
        worst_case=workload.worst_case.describe(),
        device_type=device_type,
    )


def _held(
    workload: Workload,
    modes: Sequence[str],
    sizes: tuple[int, int],
    recomputed: tuple[bool, bool],
    reuse: MemoryProfile | None,
    device_type: str,
) -> MemoryProfile | None:
    """``reuse`` cut to ``modes`` where it already holds every run asked for, of this workload's
    blocks and parameters (unchecked, as a new profile is), else None. Nothing then runs: its
    optimizer step and its block structure are this workload's too, and at GPT-2-small size those
    alone were 1.4 s of fake runs per call (the simulator's memory tables call twice with a study's
    profile holding every mode)."""
    if not _reusable(reuse, sizes, device_type):
        return None
    held = {m: reuse.modes[m] for m in modes if m in reuse.modes}
    asked: tuple[RecomputeLevel, ...] = ("full", "selective")
    levels = [level for level, wanted in zip(asked, recomputed, strict=True) if wanted]
    if len(held) < len(modes) or any(p.recomputed(level) is None for p in held.values() for level in levels):
        return None
    same = (
        reuse.names == workload.block_names()
        and all(getattr(reuse, field) == value for field, value in _parameter_counts(workload).items())
        and reuse.worst_case == workload.worst_case.describe()
    )
    return dataclasses.replace(reuse, modes=held, checks=()) if same else None


def _reusable(reuse: MemoryProfile | None, sizes: tuple[int, int], device_type: str) -> TypeGuard[MemoryProfile]:
    """Whether ``reuse``'s modes can stand in this profile: run at the same sizes, for the same kernels."""
    return reuse is not None and (reuse.micro_batch_sizes, reuse.device_type) == (sizes, device_type)


class _ParameterCounts(TypedDict):
    num_parameters: int
    largest_parameter: int
    parameter_tensors: int
    trainable_parameters: int
    parameter_bytes: int
    trainable_bytes: int


def _parameter_counts(workload: Workload) -> _ParameterCounts:
    """A profile's parameter fields (:class:`MemoryProfile`'s), of ``workload``'s parameters now."""
    params = list(workload.model.parameters())
    return {
        "num_parameters": sum(p.numel() for p in params),
        "largest_parameter": max(p.numel() for p in params),
        "parameter_tensors": len(params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "parameter_bytes": sum(p.numel() * p.element_size() for p in params),
        "trainable_bytes": sum(p.numel() * p.element_size() for p in params if p.requires_grad),
    }


def _profile(
    workload: Workload,
    modes: Sequence[str],
    micro_batch_sizes: tuple[int, int],
    recomputed: tuple[bool, bool],
    reuse: MemoryProfile | None,
    device_type: str,
    on_mode: Callable[[str, float], None] | None = None,
) -> MemoryProfile:
    from torch._subclasses.fake_tensor import FakeTensorMode

    def reused(mode: str) -> ModeProfile | None:
        if not _reusable(reuse, micro_batch_sizes, device_type):
            return None
        return reuse.modes.get(mode)

    fake = FakeTensorMode(allow_non_fake_inputs=False)
    state, step, flat_state, flat_step = _optimizer_costs(workload, fake)
    profiled: dict[str, ModeProfile] = {}
    for m in modes:
        start, found = time.perf_counter(), reused(m)
        profiled[m] = _profile_mode(workload, fake, m, micro_batch_sizes, recomputed, found, device_type)
        if on_mode is not None and found is None:
            on_mode(m, time.perf_counter() - start)
    return MemoryProfile(
        names=workload.block_names(),
        micro_batch_sizes=micro_batch_sizes,
        **_parameter_counts(workload),
        optimizer_state_bytes=state,
        optimizer_step_bytes=step,
        flat_state_ratio=flat_state,
        flat_step_ratio=flat_step,
        modes=profiled,
    )


def _profile_mode(
    workload: Workload,
    fake: Any,
    mode: str,
    sizes: tuple[int, int],
    recomputed: tuple[bool, bool],
    found: ModeProfile | None = None,
    device_type: str = "cpu",
) -> ModeProfile:
    """``mode``'s profile: ``found`` (the same mode at the same sizes, profiled before) grown by
    the recompute levels ``recomputed`` asks for and it lacks, two fake runs each, or every run
    anew without it: a study's profile grown by the selective level, or the simulator's tables
    made after a study's trials, runs no pass twice."""
    weights = _WEIGHT_DTYPES.get(mode)
    bucket = (2 if weights is not None else 4) * _largest(workload)
    n = len(workload.block_names())
    fp32: Precision = "fp32"
    island, outer = mode_precisions(mode) if weights is None else (fp32, fp32)

    def uniform(level: RecomputeLevel) -> list[Run]:
        # Islands too: a recomputed bf16 block recomputes in bf16.
        return [
            profile_run(
                workload,
                fake,
                m,
                weights=weights,
                precisions=[island] * n,
                checkpoints=[level] * n,
                outer=outer,
                device_type=device_type,
            )
            for m in sizes
        ]

    if found is None:
        runs = uniform("none")
        found = ModeProfile(
            blocks=(runs[0].blocks, runs[1].blocks),
            windows=paired_windows(runs[0], runs[1], sizes, bucket),
            checkpointed=None,
            gradients=runs[1].gradients,
            batch=(runs[0].batch, runs[1].batch),
        )
    if recomputed[0] and found.checkpointed is None:
        again = uniform("full")
        found = dataclasses.replace(found, checkpointed=paired_windows(again[0], again[1], sizes, bucket))
    if recomputed[1] and found.selective is None:
        chosen = uniform("selective")
        # What the selective runs' caches kept, next to what the plain runs' blocks saved.
        small, large = (
            b._replace(selective=run.blocks.selective, selective_outputs=run.blocks.selective_outputs)
            for b, run in zip(found.blocks, chosen, strict=True)
        )
        found = dataclasses.replace(
            found, blocks=(small, large), selective=paired_windows(chosen[0], chosen[1], sizes, bucket)
        )
    return found


def _largest(workload: Workload) -> int:
    """Elements of the largest parameter: DeepSpeed's bucket size (deepspeed_config.bucket_elements)."""
    from autotune.train.deepspeed_config import bucket_elements

    return bucket_elements(max(p.numel() for p in workload.model.parameters()))


def _step_transient(params: list[torch.nn.Parameter], workload: Workload) -> tuple[int, int]:
    """(state bytes, bytes allocated on top during the second step) of the workload's optimizer."""
    from autotune.measurement.tracker import tracker_class

    # A frozen parameter gets no gradient, so the optimizer keeps no state for it (torch's
    # optimizers skip a parameter whose .grad is None, weight decay included).
    for p in params:
        p.grad = torch.zeros_like(p) if p.requires_grad else None
    opt = workload.make_optimizer(params)
    opt.step()  # creates the state
    tracker = tracker_class()()
    tracker.track_external(opt, *params, *(p.grad for p in params if p.grad is not None))
    start = _total(tracker.get_tracker_snapshot("current"))
    with tracker:
        opt.step()
    peak = _total(tracker.get_tracker_snapshot("peak"))
    state = {
        storage_key(t): t.untyped_storage().nbytes()
        for s in opt.state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor)
    }
    return sum(state.values()), peak - start


def _total(snapshot: dict[Any, dict[Any, int]]) -> int:
    """The "Total" of a MemTracker snapshot's (only) device."""
    for device in snapshot.values():
        return int(sum(v for k, v in device.items() if getattr(k, "value", k) == "Total"))
    return 0


class _ScalarsRead(TorchDispatchMode):
    """Inside the fake mode, for the optimizer's step: a scalar read from a tensor (``.item()``) is 1.

    Some optimizers read values to scale their update: torch's and Hugging Face's Adafactor take
    ``param.norm(2).item()`` for the relative step size, which a fake tensor cannot answer
    (``DataDependentOutputException``), so the memory model had no optimizer costs for them. The
    value scales arithmetic only: the state and the step's temporaries are the parameters' shapes.
    """

    _READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in self._READS:
            dtype = args[0].dtype
            return True if dtype == torch.bool else 1.0 if dtype.is_floating_point else 1
        return func(*args, **(kwargs or {}))


def _optimizer_costs(workload: Workload, fake: Any) -> tuple[int, int, float, float]:
    model = fake_model(workload, fake)
    # A compiled step (nanochat's MuonAdamW compiles its fused updates) runs eagerly here: Dynamo
    # does not trace fake parameters made outside it, and the state it creates is the eager one's.
    with fake, _ScalarsRead(), torch.compiler.set_stance("force_eager"):
        state, step = _step_transient(list(model.parameters()), workload)
        flat = 2**16
        flat_state, flat_step = _step_transient([torch.nn.Parameter(torch.zeros(flat))], workload)
    return state, step, flat_state / flat, flat_step / (4 * flat)
