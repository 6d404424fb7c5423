"""What :mod:`autotune.memory.model` composes a config's memory from, measured once per workload.

:func:`fake_profile` runs forward/backward passes of a fake copy of the model under
``FakeTensorMode`` (shapes only, no compute) while ``MemTracker`` counts every storage: per
*mode* (every block fp32, every block an autocast island, 16-bit weights throughout, or every block
alike under a reduced outer precision), plain, with every block checkpointed and (if asked) with
every block recomputed selectively (:mod:`autotune.train.selective`), at two micro-batch sizes. A
config that mixes modes is never run; it is composed from these uniform runs, so the profile
records what composing needs:

* per block, what it keeps for backward, split at its boundaries (:class:`BlockSaves`): a
  block's input is one storage that the block before it, the block itself, both or neither may
  save, depending on *their* modes. A bf16 island casts its output back to fp32, so the input of
  every block is fp32 whatever the modes: only who keeps it changes. Under a reduced outer
  precision nothing is cast back, so a block's input is in whatever dtype the block before it
  hands on (fp32 after a residual sum with an fp32 stream, 16 bits after a bare matmul): the
  composition of mixed blocks there holds where the dtypes agree, which the ``outer-*`` check
  (:mod:`autotune.memory.check`) verifies on one real step;
* the (activations, temporaries, gradients) series, cut into windows of forward and backward
  (:class:`Window`) at the blocks' boundaries, as lines in the micro-batch size: an operation's
  bytes at the two sizes, matched by position in the series (the two runs execute the same
  operations).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from autotune.config import Precision, RecomputeLevel
from autotune.errors import AutotuneError, PredictionError, one_line
from autotune.memory.fake_branches import RealBranches
from autotune.memory.fake_logs import quiet_fake_logs
from autotune.memory.fake_workspaces import RealWorkspaces
from autotune.train.wrappers import apply_block_knobs, outer_autocast
from autotune.workload import Workload, swap_tensors
from autotune.worst_case import profile_batch

if TYPE_CHECKING:
    from autotune.memory.check import Verification
    from autotune.memory.structure import BlockStructure

__all__ = [
    "BlockSaves",
    "MODES",
    "MemoryProfile",
    "ModeProfile",
    "Moment",
    "Window",
    "fake_profile",
    "mode_precisions",
    "outer_mode",
]

#: How the blocks of a model can run: fp32 weights with each block fp32 or autocast (an island,
#: as apply.py makes it), 16-bit weights throughout (a DeepSpeed bf16/fp16 engine), or fp32
#: weights under a reduced outer precision (``BLOCK@OUTER``: the forward and the loss under
#: autocast in OUTER, each block fp32 with autocast disabled or in OUTER itself: ``bf16@bf16``
#: everywhere is Hugging Face's ``bf16=True``).
MODES: tuple[str, ...] = (
    "fp32",
    "bf16",
    "fp16",
    "bf16-weights",
    "fp16-weights",
    "fp32@bf16",
    "bf16@bf16",
    "fp32@fp16",
    "fp16@fp16",
)
_WEIGHT_DTYPES = {"bf16-weights": torch.bfloat16, "fp16-weights": torch.float16}


def outer_mode(block: Precision, outer: Precision) -> str:
    """The profile mode of a block in ``block`` precision under the ``outer`` precision."""
    return block if outer == "fp32" else f"{block}@{outer}"


def mode_precisions(mode: str) -> tuple[Precision, Precision]:
    """(block precision, outer precision) of an autocast mode (not a weights mode)."""
    block, _, outer = mode.partition("@")
    return block, outer or "fp32"  # type: ignore[return-value]


class Moment(NamedTuple):
    """Tensor bytes at one moment of a forward/backward."""

    activations: int
    temporaries: int
    gradients: int


class Window(NamedTuple):
    """One stretch of a forward/backward, as the moments that can be its maximum, by three measures.

    ``peak``: most activations + temporaries; ``kept``: most activations + temporaries +
    gradients (for runners that keep gradients); ``reducing``: most activations + temporaries
    once a DeepSpeed gradient bucket (the largest parameter's gradient) has filled (ZeRO 2-3 hold
    their reduction buffers from then on). Each is a tuple of candidates, aligned between the
    profile's two micro-batch sizes: the moments that are the maximum at *some* micro-batch size
    (the upper envelope of their lines). Which moment is highest moves with the batch: at a small
    one, gradients and weight copies weigh more than activations.
    """

    peak: tuple[Moment, ...]
    kept: tuple[Moment, ...]
    reducing: tuple[Moment, ...]


class BlockSaves(NamedTuple):
    """Bytes each block keeps for backward in one mode at one micro-batch size (forward order).

    ``saved``: storages the block saves (not parameters or buffers: model state), its input included.
    ``inputs``: its input, all a checkpointed block keeps. ``saved_inputs``: the part of
    ``saved`` that is its input (an fp32 LayerNorm or convolution saves it, a bf16 one saves a
    cast). ``outputs``: the part of ``saved`` that the next block takes as input (a final ReLU
    saves its result). ``external``: the part of its input that code outside this block and the
    one before it saved (the stem's last ReLU): kept whatever the blocks' modes.
    ``selective``: what the block keeps recomputed selectively, besides its input: the outputs of
    its matmul-like operations (:data:`autotune.train.selective.SAVED_OPS`), held by torch's
    selective-checkpoint cache from its forward to its recompute; ``selective_outputs``: the part
    of that the next block takes as input (a block ending in a bare ``nn.Linear``). Both empty
    where the selective runs were not profiled.
    """

    saved: tuple[int, ...]
    inputs: tuple[int, ...]
    saved_inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    external: tuple[int, ...]
    selective: tuple[int, ...] = ()
    selective_outputs: tuple[int, ...] = ()


#: Per micro-batch size: the windows of one run, in time order, with ``n`` blocks: ``[i]`` for
#: ``i < n`` the forward of block ``i`` (block 0's with the stem before it), ``[n]`` the head's
#: forward and backward, ``[3n - 2i - 1]`` and ``[3n - 2i]`` the backward of block ``i`` before and
#: after its input is freed, ``[3n + 1]`` what follows block 0's backward (the embedding's).
Windows = tuple[tuple[Window, ...], tuple[Window, ...]]


@dataclass(frozen=True, kw_only=True)
class ModeProfile:
    """One mode's forward/backward, at the profile's two micro-batch sizes (index 0 and 1).

    ``blocks``: what each block keeps (see :class:`BlockSaves`). ``windows``: the run, window by
    window (see ``Windows``); ``checkpointed``: the same with every block checkpointed,
    i.e. recomputed in its window (``None`` if not profiled); ``selective``: the same with every
    block recomputed selectively (``None`` if not profiled). Gradients stay in ``.grad`` (as in
    the local runner).
    """

    blocks: tuple[BlockSaves, BlockSaves]
    windows: Windows
    checkpointed: Windows | None
    gradients: int
    batch: tuple[int, int]  # bytes of the collated micro-batch (16-bit floats in a weights mode)
    selective: Windows | None = None

    def recomputed(self, level: RecomputeLevel) -> Windows | None:
        """The windows of the run with every block at recompute ``level`` (None if not profiled)."""
        return {"none": self.windows, "full": self.checkpointed, "selective": self.selective}[level]


@dataclass(frozen=True, kw_only=True)
class MemoryProfile:
    """What the memory model needs from a workload, measured once (no real compute: fake tensors).

    Args:
        names: Block names, in forward order.
        micro_batch_sizes: The two micro-batch sizes profiled; activations are linear in between
            and beyond (a constant part, e.g. autocast's weight copies, plus a per-sample part).
        num_parameters, largest_parameter, parameter_tensors: Parameter count, the largest
            parameter's element count (DeepSpeed's bucket size), number of parameter tensors.
        trainable_parameters: Elements of the parameters that require gradients: frozen ones
            (``requires_grad=False``) have no gradient and no optimizer state.
        optimizer_state_bytes: The workload optimizer's state after one step, fp32 parameters.
        optimizer_step_bytes: The most a local optimizer step allocates on top of parameters,
            gradients and state (torch's for-loop AdamW: a few parameter-sized temporaries).
        flat_state_ratio: State bytes per element of one flat fp32 parameter (a ZeRO partition):
            8 for Adam's two moments (plus the step counter's share).
        flat_step_ratio: What a step on that flat parameter allocates, per byte of the parameter.
        modes: One :class:`ModeProfile` per profiled mode (see ``MODES``).
        structure: How the blocks are joined (:func:`autotune.memory.structure.detect_structure`):
            where they are not a chain, configurations that treat blocks differently are unverified.
        checks: The profile's predictions checked against real steps, one per kind of
            configuration (:func:`autotune.memory.check.verify_profile`); empty if not checked.
        worst_case: Which batch the profile ran at: declared, scanned or the first
            (:meth:`autotune.worst_case.WorstCase.describe`).
    """

    names: tuple[str, ...]
    micro_batch_sizes: tuple[int, int]
    num_parameters: int
    largest_parameter: int
    parameter_tensors: int
    trainable_parameters: int
    optimizer_state_bytes: int
    optimizer_step_bytes: int
    flat_state_ratio: float
    flat_step_ratio: float
    modes: dict[str, ModeProfile]
    structure: BlockStructure | None = None
    checks: tuple[Verification, ...] = ()
    worst_case: str = ""

    @property
    def verification(self) -> Verification | None:
        """The check of the default configuration (fp32, nothing recomputed), or None."""
        return next((v for v in self.checks if v.kind == "default"), None)


def fake_profile(
    workload: Workload,
    *,
    modes: Sequence[str] = ("fp32",),
    micro_batch_sizes: tuple[int, int] = (2, 4),
    checkpointed: bool = True,
    selective: bool = False,
    reuse: MemoryProfile | None = None,
) -> MemoryProfile:
    """Profile ``workload`` for the memory model, under ``FakeTensorMode`` (shapes only, no compute),
    unchecked (``checks`` empty): :func:`autotune.memory.predict.profile_memory` also checks it
    against real steps.

    ``checkpointed=False`` skips the runs with every block checkpointed (half the time); the
    profile then serves configs without checkpointing only. ``selective=True`` adds the runs with
    every block recomputed selectively (two more per mode), which configs with a ``"selective"``
    block need. ``reuse``: an earlier profile of the same workload, whose modes (at the same
    sizes, with the checkpointed and selective runs if asked for) are taken as they are, so
    growing a profile by a mode runs only that mode's passes.

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
    try:
        with quiet_fake_logs():  # torch's traceback of the error below: ours is one line
            profile = _profile(workload, modes, micro_batch_sizes, (checkpointed, selective), reuse)
    except AutotuneError:
        raise
    # The fake run executes the user's model code: whatever it raises there (FakeTensorMode's
    # DataDependentOutputException on ``.item()``/``nonzero``, an operator with no meta kernel)
    # means "cannot predict", with the reason, never a traceback in the caller.
    except Exception as e:
        raise PredictionError(f"cannot profile workload {workload.name!r} under fake tensors: {one_line(e)}") from e
    from autotune.memory.structure import detect_structure

    return dataclasses.replace(profile, structure=detect_structure(workload), worst_case=workload.worst_case.describe())


def _profile(
    workload: Workload,
    modes: Sequence[str],
    micro_batch_sizes: tuple[int, int],
    recomputed: tuple[bool, bool],
    reuse: MemoryProfile | None,
) -> MemoryProfile:
    from torch._subclasses.fake_tensor import FakeTensorMode

    checkpointed, selective = recomputed

    def reused(mode: str) -> ModeProfile | None:
        if reuse is None or reuse.micro_batch_sizes != micro_batch_sizes or mode not in reuse.modes:
            return None
        found = reuse.modes[mode]
        enough = (found.checkpointed is not None or not checkpointed) and (found.selective is not None or not selective)
        return found if enough else None

    params = list(workload.model.parameters())
    fake = FakeTensorMode(allow_non_fake_inputs=False)
    state, step, flat_state, flat_step = _optimizer_costs(workload, fake)
    return MemoryProfile(
        names=workload.block_names(),
        micro_batch_sizes=micro_batch_sizes,
        num_parameters=sum(p.numel() for p in params),
        largest_parameter=max(p.numel() for p in params),
        parameter_tensors=len(params),
        trainable_parameters=sum(p.numel() for p in params if p.requires_grad),
        optimizer_state_bytes=state,
        optimizer_step_bytes=step,
        flat_state_ratio=flat_state,
        flat_step_ratio=flat_step,
        modes={m: reused(m) or _profile_mode(workload, fake, m, micro_batch_sizes, recomputed) for m in modes},
    )


def _fake_model(workload: Workload, fake: Any) -> torch.nn.Module:
    # On the host (the profile's batch, autocast and kernels are the CPU's), whatever device the
    # model is on: a Trainer moves it to the GPU before a callback sees it.
    return workload.model_copy("cpu", fake=fake)


def _cast_floats(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters and float buffers to ``dtype``, as a DeepSpeed 16-bit engine casts them."""
    swap_tensors(model, lambda t: t.to(dtype) if t.is_floating_point() else t)


def _profile_mode(
    workload: Workload, fake: Any, mode: str, sizes: tuple[int, int], recomputed: tuple[bool, bool]
) -> ModeProfile:
    weights = _WEIGHT_DTYPES.get(mode)
    bucket = (2 if weights is not None else 4) * _largest(workload)
    n = len(workload.block_names())
    fp32: Precision = "fp32"
    island, outer = mode_precisions(mode) if weights is None else (fp32, fp32)

    def uniform(level: RecomputeLevel) -> list[_Run]:
        # Islands too: a recomputed bf16 block recomputes in bf16.
        return [
            _profile_run(
                workload, fake, m, weights=weights, precisions=[island] * n, checkpoints=[level] * n, outer=outer
            )
            for m in sizes
        ]

    runs = uniform("none")
    small, large = runs[0].blocks, runs[1].blocks
    checkpointed = selective = None
    if recomputed[0]:
        again = uniform("full")
        checkpointed = _paired_windows(again[0], again[1], sizes, bucket)
    if recomputed[1]:
        chosen = uniform("selective")
        selective = _paired_windows(chosen[0], chosen[1], sizes, bucket)
        # What the selective runs' caches kept, next to what the plain runs' blocks saved.
        small, large = (
            b._replace(selective=run.blocks.selective, selective_outputs=run.blocks.selective_outputs)
            for b, run in zip((small, large), chosen, strict=True)
        )
    return ModeProfile(
        blocks=(small, large),
        windows=_paired_windows(runs[0], runs[1], sizes, bucket),
        checkpointed=checkpointed,
        selective=selective,
        gradients=runs[1].gradients,
        batch=(runs[0].batch, runs[1].batch),
    )


class _Run(NamedTuple):
    blocks: BlockSaves
    series: list[Moment]  # after every operation
    cuts: list[int] | None  # where each window but the first starts in ``series`` (see Windows)
    gradients: int
    batch: int


def _profile_run(
    workload: Workload,
    fake: Any,
    micro_batch_size: int,
    *,
    weights: torch.dtype | None,
    precisions: Sequence[Precision],
    checkpoints: Sequence[RecomputeLevel] | None = None,
    outer: Precision = "fp32",
) -> _Run:
    """One forward/backward of a fake copy, its weights in ``weights`` (None: fp32), each block
    in its precision and recompute level (default: none), the forward and the loss in the
    ``outer`` precision's region (:func:`autotune.train.wrappers.outer_autocast`), as the trainers run them.

    The profile runs every block alike; a mixed config run this way is the exact reference the
    memory model's composition is tested against.
    """
    model, names = _fake_model(workload, fake), workload.block_names()
    n = len(names)
    if weights is not None:
        with fake:
            _cast_floats(model, weights)
    checkpoints = ["none"] * n if checkpoints is None else checkpoints
    wrappers = apply_block_knobs(model, names, precisions, checkpoints, device_type="cpu", outer=outer)
    # Parameters and buffers (BatchNorm's running statistics) saved for backward are model state.
    params = {_storage_key(t) for t in itertools.chain(model.parameters(), model.buffers())}
    ledger, tracker = _SavedLedger(n, params), _series_tracker_class()()
    kept = _SelectiveLedger(n, params)
    timeline = _Timeline(tracker, n, params)
    blocks = [model.get_submodule(name) for name in names]
    handles = _hook(blocks, ledger.enter_hook, ledger.exit_hook) + _hook(
        blocks, timeline.enter_hook, timeline.exit_hook
    )
    if "selective" in checkpoints:  # what torch's cache keeps of each selective block
        handles += _hook(blocks, kept.enter_hook, kept.exit_hook)
    tracker.track_external(model)
    real_batch = profile_batch(workload, micro_batch_size)  # the data loader's own ops need real tensors
    # Checkpointing drops what the blocks save (and would show the ledger its recompute): count
    # saved tensors in the plain runs only.
    plain = all(c == "none" for c in checkpoints)
    saving = torch.autograd.graph.saved_tensors_hooks(ledger.pack, _same) if plain else contextlib.nullcontext()
    try:
        with fake:
            batch = tree_map_only(torch.Tensor, fake.from_tensor, real_batch)
            if weights is not None:
                batch = tree_map_only(torch.Tensor, lambda t: t.to(weights) if t.is_floating_point() else t, batch)
            # RealWorkspaces below the tracker: it must see the real sizes (LSTM workspaces).
            # RealBranches: transformers' mask checks answered from the real batch.
            with RealBranches(real_batch), RealWorkspaces(), tracker:
                with saving, outer_autocast(outer, "cpu"):
                    loss = workload.loss_fn(model, batch)
                loss.backward()
                timeline.backward_ended()
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
    gradients = max((x.gradients for x in series), default=0)
    saves = ledger.result()._replace(selective=tuple(kept.kept), selective_outputs=tuple(kept.outputs))
    return _Run(saves, series, timeline.cuts(), gradients, sum(own.values()))


def _same(t: torch.Tensor) -> torch.Tensor:
    return t


def _hook(
    blocks: list[torch.nn.Module],
    enter: Callable[[int], Callable[[torch.nn.Module, Any, Any], None]],
    leave: Callable[[int], Callable[[torch.nn.Module, Any, Any, Any], None]],
) -> list[Any]:
    """Forward pre- and post-hooks on each block, made for its index; their removable handles."""
    handles = [b.register_forward_pre_hook(enter(i), with_kwargs=True) for i, b in enumerate(blocks)]
    return handles + [b.register_forward_hook(leave(i), with_kwargs=True) for i, b in enumerate(blocks)]


class _SavedLedger:
    """Who saves which storage for backward in one forward pass, and the blocks' inputs.

    One ``saved_tensors_hooks`` pair around the whole forward sees every saved tensor (inside
    blocks and outside: stem, head); block pre/post hooks say which block is running (-1: none).
    Storages are told apart by their StorageImpl (``_cdata``): fake tensors have no data pointer;
    a saved storage lives until backward, so no other takes its key during the forward.
    """

    def __init__(self, n: int, params: set[int]) -> None:
        self.params = params  # parameters and buffers: model state, not activations
        self.running = -1
        self.savers: dict[int, set[int]] = {}
        self.inputs: list[dict[int, int]] = [{} for _ in range(n)]  # per block: storage -> bytes
        self.saved, self.outputs, self.external = [0] * n, [0] * n, [0] * n

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in self.params:
            savers = self.savers.setdefault(key, set())
            if self.running >= 0 and self.running not in savers:
                self.saved[self.running] += t.untyped_storage().nbytes()
            savers.add(self.running)
        return t

    def enter_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            inputs = {_storage_key(t): t.untyped_storage().nbytes() for t in tensors}
            self.inputs[index] = {k: v for k, v in inputs.items() if k not in self.params}
            previous = {index - 1} if index > 0 else set()  # (-1 is code outside the blocks)
            for key, nbytes in self.inputs[index].items():
                savers = self.savers.get(key, set())
                if savers & previous:
                    self.outputs[index - 1] += nbytes
                if savers - previous:
                    self.external[index] += nbytes
            self.running = index

        return hook

    def exit_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            self.running = -1
            if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(output)[0]):
                # Outside autograd (frozen, and its input needs no gradient: a frozen backbone):
                # the block saves nothing, and checkpointed it keeps nothing either, not its input.
                self.inputs[index] = {}

        return hook

    def result(self) -> BlockSaves:
        saved_inputs = [
            sum(v for k, v in inputs.items() if i in self.savers.get(k, ())) for i, inputs in enumerate(self.inputs)
        ]
        return BlockSaves(
            saved=tuple(self.saved),
            inputs=tuple(sum(x.values()) for x in self.inputs),
            saved_inputs=tuple(saved_inputs),
            outputs=tuple(self.outputs),
            external=tuple(self.external),
        )


class _SelectiveLedger:
    """What each selectively recomputed block keeps from its forward to its recompute, besides its
    input: the outputs of :data:`~autotune.train.selective.SAVED_OPS`, which torch's
    selective-checkpoint cache holds. A dispatch mode entered around each block's forward sees
    the operations the cache does (its policy is a function of the operation only); the
    recompute runs in backward, outside it. Storages are told apart as in :class:`_SavedLedger`.
    """

    def __init__(self, n: int, params: set[int]) -> None:
        self.params = params
        self.owner: dict[int, int] = {}  # storage -> the block whose cache keeps it
        self.kept, self.outputs = [0] * n, [0] * n
        self._mode: Any = None

    def saved(self, index: int, out: Any) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = _storage_key(t)
                if key not in self.params and key not in self.owner:
                    self.owner[key] = index
                    self.kept[index] += t.untyped_storage().nbytes()

    def enter_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            inputs = {_storage_key(t): t.untyped_storage().nbytes() for t in tensors}
            for key, nbytes in inputs.items():
                if index > 0 and self.owner.get(key) == index - 1:
                    self.outputs[index - 1] += nbytes
            self._mode = _saved_outputs_class()(lambda out: self.saved(index, out))
            self._mode.__enter__()

        return hook

    def exit_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            self._mode.__exit__(None, None, None)
            self._mode = None
            if not any(isinstance(t, torch.Tensor) and t.requires_grad for t in tree_flatten(output)[0]):
                # Outside autograd (a frozen block): no backward holds the cache; it goes with the forward.
                self.kept[index] = 0

        return hook


@functools.cache
def _saved_outputs_class() -> type[Any]:
    from torch.utils._python_dispatch import TorchDispatchMode

    from autotune.train.selective import saved_output

    class _SavedOutputs(TorchDispatchMode):
        """Hands ``note`` the output of every operation a selective block keeps."""

        def __init__(self, note: Callable[[Any], None]) -> None:
            super().__init__()
            self.note = note

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if saved_output(func):
                self.note(out)
            return out

    return _SavedOutputs


def _largest(workload: Workload) -> int:
    """Elements of the largest parameter: DeepSpeed's bucket size (deepspeed_config.bucket_elements)."""
    from autotune.train.deepspeed_config import bucket_elements

    return bucket_elements(max(p.numel() for p in workload.model.parameters()))


def _storage_key(t: torch.Tensor) -> int:
    key: int = t.untyped_storage()._cdata
    return key


class _Timeline:
    """Where, in the tracker's series of moments, each window starts (see ``Windows``).

    Block pre/post hooks note where forwards start and the last one ends. A tensor hook on each
    block's output notes where its backward starts (the gradient reaches it), one on block 0's
    input where the last backward ends. A weak reference to each block's input storage notes
    where the input is freed: from there on, only what *other* code keeps of it counts, so a
    block's backward is cut in two there. Tensor hooks, not module backward hooks: those wrap the
    block's inputs and outputs in extra autograd nodes, which changes the memory being measured.
    What is freed between operations is recorded at the next one, so a position is the first
    moment after the event.
    """

    def __init__(self, tracker: Any, n: int, params: set[int]) -> None:
        self.tracker, self.params = tracker, params
        self.starts, self.backward, self.released = [-1] * n, [-1] * n, [-1] * n
        self.head, self.done = -1, -1
        self._refs: list[weakref.ref[torch.UntypedStorage]] = []

    def _now(self) -> int:
        return len(self.tracker.series)

    def enter_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            if self.starts[index] >= 0:
                return
            self.starts[index] = self._now()
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            inputs = [t for t in tensors if _storage_key(t) not in self.params]
            if inputs:  # the largest input stands for all (one tensor, in the built-in workloads)
                storage = max(inputs, key=lambda t: t.untyped_storage().nbytes()).untyped_storage()
                self._refs.append(weakref.ref(storage, lambda _: self._note(self.released, index)))
            if index == 0:
                self._on_gradient(tensors, lambda: setattr(self, "done", self._now()))

        return hook

    def exit_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            if index == len(self.starts) - 1 and self.head < 0:
                self.head = self._now()
            self._on_gradient(tree_flatten(output)[0], lambda: self._note(self.backward, index))

        return hook

    def backward_ended(self) -> None:
        """The backward returned. Where no gradient reached block 0's input (block 0 takes the
        batch itself: no stem before it, as in a plain ``nn.Sequential`` of blocks), block 0's
        backward ends here: the end-of-backward moment that follows is the last window. Without
        this mark every window would be one (the run uncut), and a config mixing modes would be
        composed wholly from block 0's."""
        if self.done < 0:
            self.done = self._now()

    def _note(self, marks: list[int], index: int) -> None:
        if marks[index] < 0:
            marks[index] = self._now()

    def _on_gradient(self, tensors: list[Any], note: Callable[[], None]) -> None:
        first = next((t for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad), None)
        if first is not None:
            first.register_hook(lambda grad: note())

    def cuts(self) -> list[int] | None:
        """Window starts in time order, or None if they are out of order (a block whose forward
        hooks did not run, a block called out of its declared order)."""
        n = len(self.starts)
        # Frozen parameters: where block 0's input needs no gradient (frozen embeddings) none
        # reaches it, and the backward ends at the last moment (the one recorded after it). Where
        # no gradient reaches a block's output (it and every block before it frozen, a frozen
        # backbone), the blocks' backward windows are empty: autograd never runs them.
        done = self.done if self.done >= 0 else len(self.tracker.series) - 1
        backward = [done if b < 0 else b for b in self.backward]
        order = [*self.starts[1:], self.head]
        for i in reversed(range(n)):
            start, end = backward[i], backward[i - 1] if i > 0 else done
            # Freed before its backward (no one kept it) or not before the next: an empty half.
            released = end if self.released[i] < 0 else min(max(self.released[i], start), end)
            order += [start, released]
        order.append(done)
        return order if min(order) >= 0 and order == sorted(order) else None


def _paired_windows(a: _Run, b: _Run, sizes: tuple[int, int], bucket: int) -> Windows:
    """Cut both runs' series into windows (see ``Windows``) and keep in each the moments that are
    its maximum at some micro-batch size."""
    if len(a.series) != len(b.series) or a.cuts != b.cuts:
        # The sizes ran different operations (shape-dependent code): no line per moment, only
        # each size's own maximum.
        return tuple(_window(p, bucket) for p in _cut(a)), tuple(_window(p, bucket) for p in _cut(b))
    pairs = [_window_pair(p, q, sizes, bucket) for p, q in zip(_cut(a), _cut(b), strict=True)]
    return tuple(x for x, _ in pairs), tuple(y for _, y in pairs)


def _cut(run: _Run) -> list[list[Moment]]:
    n = len(run.blocks.saved)
    cuts = run.cuts if run.cuts is not None else [len(run.series)] * (3 * n + 1)  # all in the first
    bounds = [0, *cuts, len(run.series)]
    return [run.series[lo:hi] for lo, hi in itertools.pairwise(bounds)]


def _window(part: list[Moment], bucket: int) -> Window:
    """The window of one size alone: its maximum by each measure."""
    late = [x for x in part if x.gradients >= bucket]
    peak = [max(part, key=lambda x: (x.activations + x.temporaries, -x.gradients))] if part else []
    kept = [max(part, key=lambda x: x.activations + x.temporaries + x.gradients)] if part else []
    reducing = [max(late, key=lambda x: (x.activations + x.temporaries, -x.gradients))] if late else []
    return Window(tuple(peak), tuple(kept), tuple(reducing))


def _window_pair(p: list[Moment], q: list[Moment], sizes: tuple[int, int], bucket: int) -> tuple[Window, Window]:
    def pick(measure: Callable[[Moment], int], among: list[int]) -> list[int]:
        lines = [(measure(p[t]), measure(q[t]), -q[t].gradients) for t in among]
        return [among[k] for k in _envelope(lines, sizes)]

    every = list(range(len(p)))
    late = [t for t in every if p[t].gradients >= bucket]  # gradients do not depend on the batch
    chosen = (
        pick(lambda x: x.activations + x.temporaries, every),
        pick(lambda x: x.activations + x.temporaries + x.gradients, every),
        pick(lambda x: x.activations + x.temporaries, late),
    )
    return Window(*(tuple(p[t] for t in c) for c in chosen)), Window(*(tuple(q[t] for t in c) for c in chosen))


def _envelope(lines: Sequence[tuple[int, int, int]], sizes: tuple[int, int]) -> list[int]:
    """Indices of the lines that are highest at some micro-batch size m >= 1 (the upper envelope).

    Line ``t`` is ``lines[t][0]`` at ``sizes[0]`` and ``lines[t][1]`` at ``sizes[1]``, linear in m;
    ``lines[t][2]`` breaks ties (higher wins). Walked from m = 1 upwards: the highest line, then
    the line that overtakes it first, and so on (a few lines; ~100-1000 moments per window).
    """
    m0, m1 = sizes
    # One line per (value at m = 1, slope): the best tie-breaker, then the earliest moment.
    best: dict[tuple[Fraction, int], int] = {}
    for t, (a, b, tie) in enumerate(lines):
        key = (a + Fraction((b - a) * (1 - m0), m1 - m0), b - a)
        if key not in best or tie > lines[best[key]][2]:
            best[key] = t
    # Pareto front: a line lower at m = 1 and no steeper than another is never highest.
    front: list[tuple[Fraction, int, int]] = []
    for (start, slope), t in sorted(best.items(), key=lambda kv: (-kv[0][1], -kv[0][0])):
        if not front or start > front[-1][0]:
            front.append((start, slope, t))
    if not front:
        return []
    current = max(front, key=lambda x: (x[0], x[1]))
    chosen = [current[2]]
    while True:
        steeper = [x for x in front if x[1] > current[1]]
        if not steeper:
            return chosen
        # Where each steeper line overtakes the current one (on or after the current m).
        current = min(steeper, key=lambda x: ((current[0] - x[0]) / (x[1] - current[1]), -x[1]))
        chosen.append(current[2])


@functools.cache
def _series_tracker_class() -> type[Any]:
    from autotune.measurement.tracker import tracker_class

    class _SeriesTracker(tracker_class()):  # type: ignore[misc]
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
