"""One forward/backward of a fake copy of the model, and what it observes (:func:`profile_run`).

Under ``FakeTensorMode`` (shapes only, no compute) a ``MemTracker`` records the (activations,
temporaries, gradients) series after every operation; hooks on the blocks note who saves which
storage for backward (:class:`_SavedLedger`), what a selectively recomputed block's cache keeps
(:class:`_SelectiveLedger`) and where each window of the run starts (:class:`_Timeline`).
:func:`autotune.memory.profile.fake_profile` runs it per mode and micro-batch size.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch.utils._pytree import tree_flatten, tree_map_only

from autotune.config import Precision, RecomputeLevel
from autotune.measurement.tracker import collector_paused
from autotune.memory.fake_branches import RealBranches
from autotune.memory.fake_kernels import kernels_for
from autotune.memory.fake_values import RealValues, batch_pairs
from autotune.memory.fake_workspaces import RealWorkspaces
from autotune.memory.profile_record import BlockSaves, Moment
from autotune.train.wrappers import apply_block_knobs, outer_autocast
from autotune.workload import Workload, swap_tensors
from autotune.worst_case import profile_batch

__all__ = ["Run", "cast_floats", "fake_model", "profile_run", "storage_key"]


def fake_model(workload: Workload, fake: Any) -> torch.nn.Module:
    # On the host (the profile's batch, autocast and kernels are the CPU's), whatever device the
    # model is on: a Trainer moves it to the GPU before a callback sees it.
    return workload.model_copy("cpu", fake=fake)


def cast_floats(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters and float buffers to ``dtype``, as a DeepSpeed 16-bit engine casts them."""
    swap_tensors(model, lambda t: t.to(dtype) if t.is_floating_point() else t)


class Run(NamedTuple):
    """What one fake forward/backward observed (:func:`profile_run`)."""

    blocks: BlockSaves
    series: list[Moment]  # after every operation
    cuts: list[int] | None  # where each window but the first starts in ``series`` (see Windows)
    gradients: int
    batch: int


def profile_run(
    workload: Workload,
    fake: Any,
    micro_batch_size: int,
    *,
    weights: torch.dtype | None,
    precisions: Sequence[Precision],
    checkpoints: Sequence[RecomputeLevel] | None = None,
    outer: Precision = "fp32",
    device_type: str = "cpu",
) -> Run:
    """One forward/backward of a fake copy, its weights in ``weights`` (None: fp32), each block
    in its precision and recompute level (default: none), the forward and the loss in the
    ``outer`` precision's region (:func:`autotune.train.wrappers.outer_autocast`), as the trainers run them,
    saving for backward what ``device_type``'s kernels save (:mod:`autotune.memory.fake_kernels`).

    The profile runs every block alike; a mixed config run this way is the exact reference the
    memory model's composition is tested against.
    """
    model, names = fake_model(workload, fake), workload.block_names()
    n = len(names)
    if weights is not None:
        with fake:
            cast_floats(model, weights)
    checkpoints = ["none"] * n if checkpoints is None else checkpoints
    wrappers = apply_block_knobs(model, names, precisions, checkpoints, device_type="cpu", outer=outer)
    # Parameters and buffers (BatchNorm's running statistics) saved for backward are model state.
    params = {storage_key(t) for t in itertools.chain(model.parameters(), model.buffers())}
    tracker = _series_tracker_class()()
    blocks = [model.get_submodule(name) for name in names]
    ledger, kept, timeline, handles = _observers(blocks, tracker, params, selective="selective" in checkpoints)
    tracker.track_external(model)
    real_batch = profile_batch(workload, micro_batch_size)  # the data loader's own ops need real tensors
    # Checkpointing drops what the blocks save (and would show the ledger its recompute): count
    # saved tensors in the plain runs only.
    plain = all(c == "none" for c in checkpoints)
    saving = torch.autograd.graph.saved_tensors_hooks(ledger.pack, _same) if plain else contextlib.nullcontext()
    # Around backward too: a recomputed block runs its forward again there.
    kernels = kernels_for(device_type) or contextlib.nullcontext()
    try:
        # The cycle collector paused as in a tracked real step: the peak of a step it does not run in.
        with collector_paused(), fake:
            batch = _fake_batch(fake, real_batch, weights)
            # RealWorkspaces below the tracker: it must see the real sizes (LSTM workspaces).
            # RealBranches: transformers' mask checks answered from the real batch; RealValues:
            # what the batch alone determines, computed for real where an operation needs values.
            values = RealValues(batch_pairs(batch, real_batch))
            with RealBranches(real_batch), values, RealWorkspaces(), tracker, kernels:
                with saving, outer_autocast(outer, "cpu"):
                    loss = workload.loss_fn(model, batch)
                ledger.forward_ended()
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
    tree_map_only(torch.Tensor, lambda t: own.setdefault(storage_key(t), t.untyped_storage().nbytes()), batch)
    series = tracker.series
    gradients = max((x.gradients for x in series), default=0)
    saves = ledger.result()._replace(selective=tuple(kept.kept), selective_outputs=tuple(kept.outputs))
    return Run(saves, series, timeline.cuts(), gradients, sum(own.values()))


def _observers(
    blocks: list[torch.nn.Module], tracker: Any, params: set[int], *, selective: bool
) -> tuple[_SavedLedger, _SelectiveLedger, _Timeline, list[Any]]:
    """The ledgers and the timeline of one run, hooked on its blocks; the hooks' removable handles."""
    n = len(blocks)
    ledger, kept, timeline = _SavedLedger(n, params), _SelectiveLedger(n, params), _Timeline(tracker, n, params)
    handles = _hook(blocks, ledger.enter_hook, ledger.exit_hook) + _hook(
        blocks, timeline.enter_hook, timeline.exit_hook
    )
    if selective:  # what torch's cache keeps of each selective block
        handles += _hook(blocks, kept.enter_hook, kept.exit_hook)
    return ledger, kept, timeline, handles


def _fake_batch(fake: Any, real_batch: Any, weights: torch.dtype | None) -> Any:
    """``real_batch`` as fake tensors, its floats in ``weights`` (a 16-bit engine's batch) if given."""
    batch = tree_map_only(torch.Tensor, fake.from_tensor, real_batch)
    if weights is not None:
        batch = tree_map_only(torch.Tensor, lambda t: t.to(weights) if t.is_floating_point() else t, batch)
    return batch


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
    Storages are told apart by their StorageImpl (``_cdata``): fake tensors have no data pointer.
    A saved storage lives until backward, unless the forward discards the graph that saved it
    (PEFT's DoRA computes its adapters' weight product with gradients and uses it only detached,
    for its weight norm): one freed before the forward ends was not saved for backward, and its
    key may be another storage's next, so it is forgotten (else the next storage at its address
    read as saved already, by chance)."""

    def __init__(self, n: int, params: set[int]) -> None:
        self.params = params  # parameters and buffers: model state, not activations
        self.running = -1
        self.savers: dict[int, set[int]] = {}
        self.inputs: list[dict[int, int]] = [{} for _ in range(n)]  # per block: storage -> bytes
        self.saved, self.outputs, self.external = [0] * n, [0] * n, [0] * n
        self._charged: dict[int, list[tuple[int, int]]] = {}  # storage -> (block, bytes) counted in saved
        self._watched: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self._forward_ended = False

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in self.params:
            savers = self.savers.setdefault(key, set())
            if self.running >= 0 and self.running not in savers:
                nbytes = t.untyped_storage().nbytes()
                self.saved[self.running] += nbytes
                self._charged.setdefault(key, []).append((self.running, nbytes))
            savers.add(self.running)
            if key not in self._watched:
                self._watched[key] = weakref.ref(t.untyped_storage(), functools.partial(self._freed, key))
        # Detached: a saved output (tanh's) packed as itself would hold its own grad_fn, a
        # reference cycle keeping a graph the forward discards alive to the end of the step (the
        # real step's autograd saves an output without one). The same storage either way.
        return t.detach()

    def forward_ended(self) -> None:
        """From here on a saved storage is freed by backward, as it should be."""
        self._forward_ended = True

    def _freed(self, key: int, _: object = None) -> None:
        self._watched.pop(key, None)
        if self._forward_ended:
            return
        for block, nbytes in self._charged.pop(key, []):
            self.saved[block] -= nbytes
        self.savers.pop(key, None)

    def enter_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            inputs = {storage_key(t): t.untyped_storage().nbytes() for t in tensors}
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
        # The modes entered, innermost last: one module that is two blocks (weights shared) enters
        # two at each call, and dispatch modes leave in the reverse order.
        self._modes: list[Any] = []

    def saved(self, index: int, out: Any) -> None:
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                key = storage_key(t)
                if key not in self.params and key not in self.owner:
                    self.owner[key] = index
                    self.kept[index] += t.untyped_storage().nbytes()

    def enter_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            inputs = {storage_key(t): t.untyped_storage().nbytes() for t in tensors}
            for key, nbytes in inputs.items():
                if index > 0 and self.owner.get(key) == index - 1:
                    self.outputs[index - 1] += nbytes
            mode = _saved_outputs_class()(lambda out: self.saved(index, out))
            mode.__enter__()
            self._modes.append(mode)

        return hook

    def exit_hook(self, index: int) -> Callable[[torch.nn.Module, Any, Any, Any], None]:
        def hook(module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            self._modes.pop().__exit__(None, None, None)
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


def storage_key(t: torch.Tensor) -> int:
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
            inputs = [t for t in tensors if storage_key(t) not in self.params]
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
