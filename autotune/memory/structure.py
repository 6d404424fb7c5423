"""How a model's blocks are joined, as far as the memory model's composition cares.

The memory model composes a configuration that treats blocks differently (one block recomputed,
another in bf16) stretch by stretch, from uniform runs (see :mod:`autotune.memory.model`). That
composition assumes a *chain*: each block is its own module with its own parameters, and what a
block makes is used by the block after it (and by the head after the last one), nowhere later.
Users write other shapes, and each breaks the assumption in its own way:

* **one module at two block positions** (ALBERT-style sharing, ``layers[3] = layers[0]``): the
  per-block profile cannot tell the positions apart, and a knob set on one position changes both;
* **a parameter shared by two blocks** (tied weights inside the blocks): its gradient is made by
  both, which a per-block account splits wrongly;
* **a block's output used beyond the next block** (UNet and DenseNet skip connections, a
  position bias computed once and reused): it stays alive across stretches the composition
  treats as independent.

:func:`detect_structure` finds all three before anything is predicted: sharing from module and
parameter identity, skip connections from one fake forward (shapes only, no compute) that notes
which block made each storage and where it is read. A configuration that treats blocks differently
on such a model is then *unverified* (measured, never admitted on its prediction): the per-block
profile's independence does not hold there for mixed configurations, while uniform ones (every
block treated alike) compose exactly.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._pytree import tree_flatten

from autotune.memory.blocks import block_positions, fake_forward

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["SKIP_SHARE", "BlockStructure", "detect_structure"]

#: Storages read beyond the next block count as skip connections only if together they hold at
#: least this share of the bytes the blocks make in a forward: a relative position bias that T5
#: computes in its first layer and every later layer reads is 0.27% of them (a Llama's 0.05%), and
#: the composition error such a storage can cause is its own size, below the budget gate's 2%
#: headroom; a UNet's skip connections are 13%.
SKIP_SHARE = 0.01


@dataclass(frozen=True, kw_only=True)
class BlockStructure:
    """What breaks the chain shape of a model's blocks (positions index ``names``).

    Args:
        names: The blocks, in forward order.
        aliases: Groups of two or more positions that are one module object.
        shared: Pairs of positions (i < j) whose modules share a parameter (not whole aliases).
        skips: Pairs (producer, consumer): a storage made inside block ``producer`` is read by
            block ``consumer`` > producer + 1, or, with ``consumer == len(names)``, by code
            outside the blocks after block producer + 1 started.
    """

    names: tuple[str, ...]
    aliases: tuple[tuple[int, ...], ...] = ()
    shared: tuple[tuple[int, int], ...] = ()
    skips: tuple[tuple[int, int], ...] = ()

    @property
    def chain(self) -> bool:
        """Whether the memory model's per-block composition holds for this model."""
        return not (self.aliases or self.shared or self.skips)

    def describe(self) -> str:
        """One clause per finding, e.g. ``"blocks 0 and 3 are one module"``; empty for a chain."""
        parts = [f"blocks {_positions(group)} are one module" for group in self.aliases]
        parts += [f"blocks {i} and {j} share parameters" for i, j in self.shared]
        n = len(self.names)
        parts += [
            f"block {i}'s output is used by {'code after the blocks' if j == n else f'block {j}'}"
            for i, j in self.skips
        ]
        return "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chain": self.chain,
            "aliases": [list(g) for g in self.aliases],
            "shared": [list(p) for p in self.shared],
            "skips": [list(p) for p in self.skips],
        }


def detect_structure(workload: Workload, *, micro_batch_size: int = 2) -> BlockStructure:
    """Find shared modules, shared parameters and skip connections among ``workload``'s blocks.

    Cost: one forward of a fake copy of the model (no compute, no backward), under a second for
    the corpus models. A model the fake forward cannot go through (data-dependent code) is
    reported by :func:`autotune.memory.profile.fake_profile` already; here its skip connections
    stay unknown and only sharing is reported.
    """
    names = workload.block_names()
    modules = [workload.model.get_submodule(name) for name in names]
    aliases = tuple(tuple(at) for _, at in block_positions(workload.model, names) if len(at) > 1)
    shared = _shared_parameters(modules, aliases)
    skips: tuple[tuple[int, int], ...] = ()
    if not aliases:  # with one module at two positions, the hooks cannot tell the positions apart
        try:  # torch's logs of a failing fake pass are silenced in fake_forward
            skips = _skips(workload, names, micro_batch_size)
        # The profile reports why a model cannot run under fake tensors; here it only means no
        # skip connections are known.
        except Exception:
            skips = ()
    return BlockStructure(names=names, aliases=aliases, shared=shared, skips=skips)


def _positions(group: tuple[int, ...]) -> str:
    return ", ".join(str(i) for i in group[:-1]) + f" and {group[-1]}"


def _shared_parameters(
    modules: list[torch.nn.Module], aliases: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, int], ...]:
    same = {(g[a], g[b]) for g in aliases for a in range(len(g)) for b in range(a + 1, len(g))}
    params = [{id(p) for p in m.parameters()} for m in modules]
    return tuple(
        (i, j)
        for i in range(len(modules))
        for j in range(i + 1, len(modules))
        if (i, j) not in same and params[i] & params[j]
    )


def _skips(workload: Workload, names: tuple[str, ...], micro_batch_size: int) -> tuple[tuple[int, int], ...]:
    from autotune.worst_case import profile_batch

    with fake_forward(workload, profile_batch(workload, micro_batch_size)) as (model, batch):
        flow = _Flow(len(names), {_key(t) for t in (*model.parameters(), *model.buffers())})
        handles = []
        for i, name in enumerate(names):
            block = model.get_submodule(name)
            handles.append(block.register_forward_pre_hook(flow.enter(i)))
            handles.append(block.register_forward_hook(flow.exit(i)))
        try:
            with flow:
                workload.loss_fn(model, batch)
        finally:
            for h in handles:
                h.remove()
    if sum(flow.read_late.values()) < SKIP_SHARE * flow.made_bytes:
        return ()
    return tuple(sorted(flow.skips))


def _key(t: torch.Tensor) -> int:
    key: int = t.untyped_storage()._cdata
    return key


class _Flow(torch.utils._python_dispatch.TorchDispatchMode):
    """Notes the block that made each storage and flags a read beyond the next block."""

    def __init__(self, n: int, state: set[int]) -> None:
        super().__init__()
        self.n, self.state = n, state
        self.current: int | None = None  # the block whose forward runs
        self.started = -1  # the last block whose forward started
        self.made: dict[int, int] = {}
        # A freed storage's key is reused by the next allocation: forget it when it dies.
        self._refs: dict[int, weakref.ref[torch.UntypedStorage]] = {}
        self.skips: set[tuple[int, int]] = set()
        self.read_late: dict[int, int] = {}  # storages read beyond the next block: their bytes
        self.made_bytes = 0

    def enter(self, i: int) -> Any:
        def hook(module: torch.nn.Module, args: Any) -> None:
            self.current, self.started = i, max(self.started, i)

        return hook

    def exit(self, i: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            self.current = None

        return hook

    def _note(self, storage: torch.UntypedStorage, maker: int) -> None:
        key: int = storage._cdata
        self.made[key] = maker
        self._refs[key] = weakref.ref(storage, lambda _: (self.made.pop(key, None), self._refs.pop(key, None)))

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        reader = self.current
        for t in tree_flatten((args, kwargs))[0]:
            if not isinstance(t, torch.Tensor) or _key(t) in self.state:
                continue
            maker = self.made.get(_key(t))
            if maker is None or reader == maker:
                continue
            # Inside the next block, or between the maker and the next block (its glue), or the
            # last block's output read by the head: a chain.
            if reader == maker + 1 or (reader is None and (self.started == maker or maker == self.n - 1)):
                continue
            consumer = reader if reader is not None else min(self.started + 1, self.n)
            self.skips.add((maker, consumer))
            self.read_late[_key(t)] = t.untyped_storage().nbytes()
        out = func(*args, **kwargs)
        if self.current is not None:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and _key(t) not in self.made:
                    self._note(t.untyped_storage(), self.current)
                    self.made_bytes += t.untyped_storage().nbytes()
        return out
