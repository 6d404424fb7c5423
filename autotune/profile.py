"""Per-block activation profile: how many bytes each block saves for backward, per sample.

Counted with ``torch.autograd.graph.saved_tensors_hooks`` around each block's forward: every
tensor autograd saves inside the block is seen once, and its storage bytes are summed (storages,
not tensors, so views of one buffer count once). This is exact and cheap (one forward pass),
and it is what checkpointing a block removes and autocast shrinks. The search ranks blocks by
it ("checkpoint the N hungriest blocks"); the memory model scales it by micro-batch size.

:func:`profile_memory` measures what :mod:`autotune.memory_model` needs, once per workload, under
``FakeTensorMode`` (no real compute): per block and mode the saved, input and output bytes, and
the activations, temporaries and gradients of one forward/backward, stretch by stretch.
"""

from __future__ import annotations

import copy
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from autotune.apply import apply_block_knobs
from autotune.config import Precision
from autotune.workload import Workload

__all__ = [
    "BlockProfile",
    "MODES",
    "MemoryProfile",
    "ModeProfile",
    "Moment",
    "Window",
    "profile_blocks",
    "profile_memory",
]


@dataclass(frozen=True, kw_only=True)
class BlockProfile:
    """Bytes saved for backward by each block, in forward order, for one precision.

    ``saved_bytes[i]`` is for a micro-batch of ``micro_batch_size`` samples. Under autocast it
    includes the low-precision weight copies autograd saves, which do not grow with the batch:
    profile at two micro-batch sizes to separate the per-sample part.
    """

    names: tuple[str, ...]
    precision: Precision
    micro_batch_size: int
    saved_bytes: tuple[int, ...]

    def ranked(self) -> tuple[int, ...]:
        """Block indices from most to least activation bytes (ties: earlier block first)."""
        return tuple(sorted(range(len(self.names)), key=lambda i: (-self.saved_bytes[i], i)))


def profile_blocks(workload: Workload, *, micro_batch_size: int = 2, precision: Precision = "fp32") -> BlockProfile:
    """Run one forward pass of a copy of the model on CPU and count each block's saved bytes."""
    model = copy.deepcopy(workload.model).train()
    names = workload.block_names()
    wrappers = apply_block_knobs(model, names, [precision] * len(names), [False] * len(names), device_type="cpu")
    counts = [0] * len(names)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    handles = [
        model.get_submodule(name).register_forward_pre_hook(_enter(counts, i, params), with_kwargs=True)
        for i, name in enumerate(names)
    ] + [model.get_submodule(name).register_forward_hook(_exit, with_kwargs=True) for name in names]
    batch = _first_batch(workload, micro_batch_size)
    try:
        workload.loss_fn(model, batch)
    finally:
        for h in handles:
            h.remove()
        wrappers.remove()
    return BlockProfile(names=names, precision=precision, micro_batch_size=micro_batch_size, saved_bytes=tuple(counts))


def _first_batch(workload: Workload, micro_batch_size: int) -> Any:
    loader = torch.utils.data.DataLoader(workload.dataset, batch_size=micro_batch_size)
    return tree_map_only(torch.Tensor, lambda t: t, next(iter(loader)))


def _enter(counts: list[int], index: int, params: set[int], inputs: list[int] | None = None) -> Any:
    # Storages are told apart by their StorageImpl (``_cdata``): fake tensors have no data pointer.
    def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        seen = set(params)  # parameters saved for backward are model state, not activations
        if inputs is not None:  # what a checkpointed block keeps: its input tensors
            held: dict[int, int] = {}
            tree_map_only(
                torch.Tensor,
                lambda t: held.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes()),
                (args, kwargs),
            )
            inputs[index] = sum(n for key, n in held.items() if key not in params)

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage._cdata not in seen:
                seen.add(storage._cdata)
                counts[index] += storage.nbytes()
            return t

        ctx = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        ctx.__enter__()
        module.__dict__["_autotune_profile_ctx"] = ctx
        module.__dict__["_autotune_profile_seen"] = seen

    return hook


def _exit(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
    module.__dict__.pop("_autotune_profile_ctx").__exit__(None, None, None)
    module.__dict__.pop("_autotune_profile_seen", None)


def _leave(outputs: list[int], index: int) -> Any:
    """Like ``_exit``, and also counts the bytes of the block's output that the block itself saved
    (a final ReLU saves its result): the next block's input, so a checkpointed next block keeps
    nothing new in that case."""

    def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        seen = module.__dict__.get("_autotune_profile_seen", set())
        own: dict[int, int] = {}
        tree_map_only(torch.Tensor, lambda t: own.setdefault(_storage_key(t), t.untyped_storage().nbytes()), output)
        outputs[index] = sum(n for key, n in own.items() if key in seen)
        _exit(module, args, kwargs, output)

    return hook


# ---- the memory profile the memory model scales ------------------------------------------------

#: How the blocks of a model can run: fp32 weights with each block fp32 or autocast (an island,
#: as apply.py makes it), or 16-bit weights throughout (a DeepSpeed bf16/fp16 engine).
MODES: tuple[str, ...] = ("fp32", "bf16", "fp16", "bf16-weights", "fp16-weights")
_WEIGHT_DTYPES = {"bf16-weights": torch.bfloat16, "fp16-weights": torch.float16}
_ISLANDS = ("bf16", "fp16")  # autocast blocks in fp32 weights: corrections to the fp32 profile


class Moment(NamedTuple):
    """Tensor bytes at one moment of a forward/backward."""

    activations: int
    temporaries: int
    gradients: int


class Window(NamedTuple):
    """One stretch of backward: its moment of most activations + temporaries (``peak``); of most
    activations + temporaries + gradients (``kept``, for runners that keep gradients); and of most
    activations + temporaries once a DeepSpeed gradient bucket (the largest parameter's gradient)
    has filled (``reducing``: ZeRO 2-3 hold their reduction buffers from then on)."""

    peak: Moment
    kept: Moment
    reducing: Moment


@dataclass(frozen=True, kw_only=True)
class ModeProfile:
    """One mode's forward/backward, at the profile's two micro-batch sizes (index 0 and 1).

    ``saved[j][i]``: bytes block ``i`` saves for backward; ``inputs[j][i]``: bytes of its input,
    all a checkpointed block keeps; ``outputs[j][i]``: bytes of its output among ``saved`` (the
    next block's input, held either way). ``windows[j]``: backward cut where each block's backward
    starts: ``[0]`` the forward and the backward before any block (the loss and head), ``[1 + k]``
    the backward of block ``n - 1 - k`` (blocks run backward last to first), ``[-1]`` what follows
    block 0 (the embedding). ``checkpointed``: the same with every block checkpointed, i.e.
    recomputed in its window (for fp32 and the 16-bit weight modes). Gradients stay in ``.grad``
    (as in the local runner).
    """

    saved: tuple[tuple[int, ...], tuple[int, ...]]
    inputs: tuple[tuple[int, ...], tuple[int, ...]]
    outputs: tuple[tuple[int, ...], tuple[int, ...]]
    windows: tuple[tuple[Window, ...], tuple[Window, ...]]
    checkpointed: tuple[tuple[Window, ...], tuple[Window, ...]] | None
    gradients: int
    batch: tuple[int, int]  # bytes of the collated micro-batch (16-bit floats in a weights mode)


@dataclass(frozen=True, kw_only=True)
class MemoryProfile:
    """What the memory model needs from a workload, measured once (no real compute: fake tensors).

    Args:
        names: Block names, in forward order.
        micro_batch_sizes: The two micro-batch sizes profiled; activations are linear in between
            and beyond (a constant part, e.g. autocast's weight copies, plus a per-sample part).
        num_parameters, largest_parameter, parameter_tensors: Parameter count, the largest
            parameter's element count (DeepSpeed's bucket size), number of parameter tensors.
        optimizer_state_bytes: The workload optimizer's state after one step, fp32 parameters.
        optimizer_step_bytes: The most a local optimizer step allocates on top of parameters,
            gradients and state (torch's for-loop AdamW: a few parameter-sized temporaries).
        flat_state_ratio: State bytes per element of one flat fp32 parameter (a ZeRO partition):
            8 for Adam's two moments (plus the step counter's share).
        flat_step_ratio: What a step on that flat parameter allocates, per byte of the parameter.
        modes: One :class:`ModeProfile` per profiled mode (see ``MODES``).
    """

    names: tuple[str, ...]
    micro_batch_sizes: tuple[int, int]
    num_parameters: int
    largest_parameter: int
    parameter_tensors: int
    optimizer_state_bytes: int
    optimizer_step_bytes: int
    flat_state_ratio: float
    flat_step_ratio: float
    modes: dict[str, ModeProfile]


def profile_memory(
    workload: Workload,
    *,
    modes: Sequence[str] = ("fp32",),
    micro_batch_sizes: tuple[int, int] = (2, 4),
    checkpointed: bool = True,
) -> MemoryProfile:
    """Profile ``workload`` for the memory model, under ``FakeTensorMode`` (shapes only, no compute).

    ``checkpointed=False`` skips the runs with every block checkpointed (half the time); the
    profile then serves configs without checkpointing only.

    Fake tensors go through the same kernels' shape logic, and MemTracker counts them as real
    ones (the same bytes on the built-in workloads), so this is cheap for any model size: a few
    seconds of Python per mode, mostly MemTracker's bookkeeping.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"profile_memory: modes must be among {MODES}, but got {unknown[0]!r}.")
    params = list(workload.model.parameters())
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    state, step, flat_state, flat_step = _optimizer_costs(workload, fake)
    return MemoryProfile(
        names=workload.block_names(),
        micro_batch_sizes=micro_batch_sizes,
        num_parameters=sum(p.numel() for p in params),
        largest_parameter=max(p.numel() for p in params),
        parameter_tensors=len(params),
        optimizer_state_bytes=state,
        optimizer_step_bytes=step,
        flat_state_ratio=flat_state,
        flat_step_ratio=flat_step,
        modes={m: _profile_mode(workload, fake, m, micro_batch_sizes, checkpointed) for m in modes},
    )


def _fake_model(workload: Workload, fake: Any) -> torch.nn.Module:
    from torch._subclasses.fake_tensor import FakeCopyMode

    with FakeCopyMode(fake):
        return copy.deepcopy(workload.model).train()


def _cast_floats(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters and float buffers to ``dtype``, as a DeepSpeed 16-bit engine casts them.

    ``Module.to`` cannot swap fake tensors in place; tied parameters stay tied (one new object each).
    """
    new: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in new:
                    new[id(p)] = torch.nn.Parameter(p.detach().to(dtype), requires_grad=p.requires_grad)
                module._parameters[name] = new[id(p)]
        for name, b in module._buffers.items():
            if b is not None and b.is_floating_point():
                module._buffers[name] = b.to(dtype)


def _profile_mode(workload: Workload, fake: Any, mode: str, sizes: tuple[int, int], recompute: bool) -> ModeProfile:
    runs = [_profile_run(workload, fake, mode, m) for m in sizes]
    checkpointed = None
    if recompute and mode not in _ISLANDS:
        again = [_profile_run(workload, fake, mode, m, checkpoint=True) for m in sizes]
        checkpointed = (again[0].windows, again[1].windows)
    return ModeProfile(
        saved=(runs[0].saved, runs[1].saved),
        inputs=(runs[0].inputs, runs[1].inputs),
        outputs=(runs[0].outputs, runs[1].outputs),
        windows=(runs[0].windows, runs[1].windows),
        checkpointed=checkpointed,
        gradients=runs[1].gradients,
        batch=(runs[0].batch, runs[1].batch),
    )


class _Run(NamedTuple):
    saved: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    windows: tuple[Window, ...]
    gradients: int
    batch: int


def _profile_run(workload: Workload, fake: Any, mode: str, micro_batch_size: int, *, checkpoint: bool = False) -> _Run:
    """One forward/backward of a fake copy with every block in ``mode`` (checkpointed or not)."""
    model, names = _fake_model(workload, fake), workload.block_names()
    dtype = _WEIGHT_DTYPES.get(mode)
    if dtype is not None:
        with fake:
            _cast_floats(model, dtype)
    island: Precision = "fp32" if dtype is not None else mode  # type: ignore[assignment]
    n = len(names)
    wrappers = apply_block_knobs(model, names, [island] * n, [checkpoint] * n, device_type="cpu")
    counts, inputs, outputs, marks = [0] * n, [0] * n, [0] * n, [-1] * (n + 1)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    tracker = _series_tracker_class()()
    handles = []
    for i, name in enumerate(names):
        block = model.get_submodule(name)
        if not checkpoint:  # saved-tensor counting would see the recompute too
            handles.append(block.register_forward_pre_hook(_enter(counts, i, params, inputs), with_kwargs=True))
            handles.append(block.register_forward_hook(_exit, with_kwargs=True))
        handles.append(block.register_forward_hook(_mark(tracker, marks, i, inputs=False), with_kwargs=True))
    first = model.get_submodule(names[0])
    handles.append(first.register_forward_pre_hook(_mark(tracker, marks, n, inputs=True), with_kwargs=True))
    tracker.track_external(model)
    real_batch = _first_batch(workload, micro_batch_size)  # the data loader's own ops need real tensors
    try:
        with fake:
            batch = tree_map_only(torch.Tensor, fake.from_tensor, real_batch)
            if dtype is not None:
                batch = tree_map_only(torch.Tensor, lambda t: t.to(dtype) if t.is_floating_point() else t, batch)
            with tracker:
                workload.loss_fn(model, batch).backward()
                # The last gradients become gradients in hooks, after the last operation: one
                # more moment, the end of backward.
                tracker.record()
    finally:
        for h in handles:
            h.remove()
        wrappers.remove()
    own: dict[int, int] = {}
    tree_map_only(torch.Tensor, lambda t: own.setdefault(_storage_key(t), t.untyped_storage().nbytes()), batch)
    series = tracker.series
    return _Run(
        saved=tuple(counts),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        windows=_windows(series, marks, bucket=(2 if dtype is not None else 4) * _largest(workload)),
        gradients=max((x.gradients for x in series), default=0),
        batch=sum(own.values()),
    )


def _largest(workload: Workload) -> int:
    """Elements of the largest parameter: DeepSpeed's bucket size (deepspeed_config.bucket_elements)."""
    from autotune.runner.deepspeed_config import bucket_elements

    return bucket_elements(max(p.numel() for p in workload.model.parameters()))


def _storage_key(t: torch.Tensor) -> int:
    key: int = t.untyped_storage()._cdata
    return key


def _mark(tracker: Any, marks: list[int], index: int, *, inputs: bool) -> Any:
    """Forward (pre-)hook that puts a tensor hook on the block's output (or input): it notes the
    position in the tracker's series when the gradient reaches it, i.e. when the block's backward
    starts (or, on block 0's input, when the last block's backward ends).

    A tensor hook, not a module backward hook: those wrap the block's inputs and outputs in
    extra autograd nodes, which changes the memory being measured.
    """

    def note(grad: torch.Tensor) -> None:
        if marks[index] < 0:
            marks[index] = len(tracker.series)

    def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any = None) -> None:
        tensors = tree_flatten((args, kwargs) if inputs else output)[0]
        first = next((t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad), None)
        if first is not None:
            first.register_hook(note)

    return hook


def _windows(series: list[Moment], marks: list[int], bucket: int) -> tuple[Window, ...]:
    """Cut the series where each block's backward starts (last block first) and after block 0."""
    n = len(marks) - 1
    cuts = [marks[i] for i in reversed(range(n))] + [marks[n]]
    if any(c < 0 for c in cuts) or cuts != sorted(cuts):  # no gradient reached a block: one window
        cuts = [len(series)] * (n + 1)
    bounds = [0, *cuts, len(series)]
    return tuple(_window(series[a:b], bucket) for a, b in itertools.pairwise(bounds))


def _window(part: list[Moment], bucket: int) -> Window:
    none = Moment(0, 0, 0)
    if not part:
        return Window(none, none, none)
    peak = max(part, key=lambda x: (x.activations + x.temporaries, -x.gradients))
    kept = max(part, key=lambda x: x.activations + x.temporaries + x.gradients)
    late = [x for x in part if x.gradients >= bucket]
    reducing = max(late, key=lambda x: (x.activations + x.temporaries, -x.gradients)) if late else none
    return Window(peak, kept, reducing)


@functools.cache
def _series_tracker_class() -> type[Any]:
    from autotune.measurement.memory import _tracker_class

    class _SeriesTracker(_tracker_class()):  # type: ignore[misc]
        """Also records (activations, temporaries, gradients) after every operation.

        Cost: one tuple per dispatched op (thousands per step), read once after the step.
        """

        def __init__(self) -> None:
            super().__init__()
            self.series: list[Moment] = []

        def _update_peak_stats(self, peak_state: Any) -> None:
            super()._update_peak_stats(peak_state)
            self.record()

        def record(self) -> None:
            for snap in self._curr_mem_snap.values():
                by_name = {getattr(k, "value", k): v for k, v in snap.items()}
                moment = Moment(by_name.get("Activation", 0), by_name.get("Temp", 0), by_name.get("Gradient", 0))
                self.series.append(moment)

    return _SeriesTracker


def _step_transient(params: list[torch.nn.Parameter], workload: Workload) -> tuple[int, int]:
    """(state bytes, bytes allocated on top during the second step) of the workload's optimizer."""
    from autotune.measurement.memory import _tracker_class

    for p in params:
        p.grad = torch.zeros_like(p)
    opt = workload.make_optimizer(params)
    opt.step()  # creates the state
    tracker = _tracker_class()()
    tracker.track_external(opt, *params, *(p.grad for p in params))
    start = _total(tracker.get_tracker_snapshot("current"))
    with tracker:
        opt.step()
    peak = _total(tracker.get_tracker_snapshot("peak"))
    state = {
        _storage_key(t): t.untyped_storage().nbytes()
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


def _optimizer_costs(workload: Workload, fake: Any) -> tuple[int, int, float, float]:
    model = _fake_model(workload, fake)
    with fake:
        state, step = _step_transient(list(model.parameters()), workload)
        flat = 2**16
        flat_state, flat_step = _step_transient([torch.nn.Parameter(torch.zeros(flat))], workload)
    return state, step, flat_state / flat, flat_step / (4 * flat)
