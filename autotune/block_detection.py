"""Block detection: which modules of a model are its *blocks*.

The blocks are the repeated units that per-block precision and activation checkpointing act on,
run one after another. :func:`find_blocks` finds them in a model that does not declare them
(``Workload.blocks``); :func:`detect_blocks` says which rule found them (:class:`BlockChoice`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.errors import WorkloadError

if TYPE_CHECKING:
    import torch

__all__ = ["BlockChoice", "detect_blocks", "find_blocks"]


def find_blocks(model: torch.nn.Module, *, workload: str = "?") -> tuple[str, ...]:
    """Auto-detect the blocks, in ``named_modules`` (forward-definition) order.

    1. **Declared blocks.** Hugging Face models name their block classes in
       ``_no_split_modules`` (what accelerate and FSDP wrap on); the union over every submodule
       is read, so a user's wrapper around a Hugging Face backbone counts too. Of the declared
       classes present, those with two or more instances are kept if there are any (BERT and
       ViT also declare their single embedding module), with a class of one instance in their
       own container (a hybrid's one attention layer among its Mamba layers), then the
       *innermost* ones: a class
       whose instances contain instances of another kept class is dropped (ConvNeXt declares
       both its stages and the layers inside them; the layers are the blocks). The blocks are
       the instances of the remaining classes.
    2. **Repeated modules in containers.** Otherwise the candidates are the children of every
       ``nn.ModuleList``/``nn.Sequential``/``nn.ModuleDict`` (except ModuleLists and ModuleDicts,
       which have no forward, and embeddings, which take indices: two never chain), grouped by
       class; the blocks are the group of two or more that holds the most parameters (ties: the
       coarser group, with fewer members). Pooling across
       containers gives a ResNet whose bottlenecks sit in four ``nn.Sequential`` stages all its
       bottlenecks, not one stage. Where a coarser group of *repeats* (members with one module
       tree and the same parameter shapes) holds members of that group, the repeats are the
       blocks: in ``nn.Sequential(*(nn.Sequential(Linear, GELU, Linear) for _ in range(4)),
       Linear)`` the nine Linear layers hold the most parameters only by the head, and the four
       units hold every parameter of the eight inside them.

    Either way, blocks must run one after another, each taking what the one before it made:
    per-block checkpointing recomputes stretches of them, and the memory model composes a config
    from them block by block. Units found in *parallel branches* of a repeated module are not
    such a chain: Hugging Face's ResNet declares its conv layers and, beside them in each
    bottleneck, the shortcut, with the residual add in neither. When the found units inside some
    instance of a repeated (two or more instances), non-container module class sit in more than
    one container, the instances of the innermost such class become the blocks instead (the
    bottlenecks; the stem's conv layer, outside them, is not a block), since the conv layers as
    blocks mispredict that ResNet's peak by up to 8% (docs/benchmark-log.md). Then an instance nested
    inside another selected instance is dropped (outermost only).

    Raises:
        WorkloadError: if neither rule finds blocks (pass ``blocks=`` explicitly then).
    """
    return detect_blocks(model, workload=workload).names


class BlockChoice(NamedTuple):
    """The blocks of a model and why they are the blocks (:meth:`Workload.block_choice`)."""

    names: tuple[str, ...]
    reason: str  # e.g. "4 repeated Sequential(Linear, GELU, Linear)"

    def describe(self) -> str:
        """One line: ``blocks: 0..3 (4 repeated Sequential(Linear, GELU, Linear))``."""
        return f"blocks: {_span(self.names)} ({self.reason})"


def detect_blocks(model: torch.nn.Module, *, workload: str = "?") -> BlockChoice:
    """:func:`find_blocks`'s blocks, with the rule that found them in words.

    Args:
        model: The model.
        workload: Its workload's name, for the error message.

    Returns:
        The block names and why they are the blocks, e.g. ``"4 repeated Sequential(Linear,
        GELU, Linear)"`` or ``"12 repeated GPT2Block(...), declared in _no_split_modules"``.

    Raises:
        WorkloadError: if no rule finds blocks (pass ``blocks=`` explicitly then).
    """
    modules = list(model.named_modules())
    declared = _declared_blocks(model, modules)
    chosen = declared or _repeated_in_containers(modules)
    unchained = _without_parallel_branches(chosen, modules)
    if not unchained:
        raise WorkloadError(
            f"Workload {workload!r}: cannot auto-detect blocks (no class of model._no_split_modules is "
            "present, and no two or more same-class modules with parameters sit in an nn.ModuleList, "
            "nn.Sequential or nn.ModuleDict); pass blocks=[...] to Workload."
        )
    names = _outermost(unchained)
    found = [model.get_submodule(name) for name in names]
    what = _kind(found)
    if unchained != chosen:
        reason = f"{what}, holding units in parallel branches"
    elif declared:
        reason = f"{what}, declared in _no_split_modules"
    else:
        reason = what
    return BlockChoice(names, reason)


def _declared_blocks(model: torch.nn.Module, modules: list[tuple[str, torch.nn.Module]]) -> list[str]:
    """Rule 1 of :func:`find_blocks`: instances of the innermost repeated declared classes."""
    declared: set[str] = set()
    for module in model.modules():
        declared.update(getattr(module, "_no_split_modules", None) or ())
    by_class: dict[str, list[str]] = {}
    for name, module in modules:
        if name and type(module).__name__ in declared:
            by_class.setdefault(type(module).__name__, []).append(name)
    repeated = {cls: names for cls, names in by_class.items() if len(names) >= 2}
    if repeated:
        # A declared class with one instance in the repeated blocks' own container is a block too:
        # a hybrid's one attention layer among its Mamba layers (Jamba at a small depth). One
        # elsewhere (BERT's and ViT's embeddings module) is not.
        parents = {name.rpartition(".")[0] for names in repeated.values() for name in names}
        repeated |= {
            c: names for c, names in by_class.items() if len(names) == 1 and names[0].rpartition(".")[0] in parents
        }
    innermost = set(_innermost(repeated or by_class))
    return [name for name, module in modules if name and type(module).__name__ in innermost]


def _repeated_in_containers(modules: list[tuple[str, torch.nn.Module]]) -> list[str]:
    """Rule 2 of :func:`find_blocks`: the same-class container children holding the most parameters."""
    import torch

    containers = _containers()
    # ModuleList/ModuleDict have no forward: never a block (a Sequential is a common one). An
    # embedding takes indices and makes vectors: no embedding takes what another one made, so
    # embeddings never chain (nanoGPT keeps its token and position embeddings in the ModuleDict
    # beside its blocks; 4 blocks 128 wide over GPT-2's vocabulary hold a ninth of their parameters).
    never_blocks = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Embedding, torch.nn.EmbeddingBag)
    order = {name: i for i, (name, _) in enumerate(modules)}
    groups: dict[type[torch.nn.Module], dict[str, torch.nn.Module]] = {}
    for name, module in modules:
        if not isinstance(module, containers):
            continue
        for child_name, child in module.named_children():
            if not isinstance(child, never_blocks):
                groups.setdefault(type(child), {})[f"{name}.{child_name}" if name else child_name] = child

    def key(members: dict[str, torch.nn.Module]) -> tuple[int, int, int]:
        # Ties (blocks whose only parameters are their sub-layers') go to the coarser group: fewer
        # members, then the one met first (an outer module comes before its submodules).
        return (_parameters(members.values()), -len(members), -min(order[n] for n in members))

    candidates = [m for m in groups.values() if len(m) >= 2 and _parameters(m.values()) > 0]
    if not candidates:
        return []
    chosen = max(candidates, key=key)
    # A coarser group of repeats holds every parameter of the chosen units inside it (the tie
    # above, where the chosen group's lead is only units outside them): the repeats are the
    # blocks. nn.Sequential(*(nn.Sequential(Linear, GELU, Linear) for _ in range(4)), Linear):
    # the nine Linear layers hold the most parameters only because the head is one of them, and
    # as blocks they leave each GELU between two blocks and make the head a block.
    seen = {id(chosen)}
    while True:
        coarser = [
            g
            for g in candidates
            if id(g) not in seen and _alike(g.values()) and any(_contains(c, f) for c in g for f in chosen)
        ]
        if not coarser:
            return sorted(chosen, key=order.__getitem__)
        chosen = max(coarser, key=key)
        seen.add(id(chosen))


def _parameters(modules: Iterable[torch.nn.Module]) -> int:
    """Elements of the modules' parameters, each counted once (tied weights are shared between members)."""
    return sum({id(p): p.numel() for m in modules for p in m.parameters()}.values())


def _structure(module: torch.nn.Module) -> tuple[Any, ...]:
    """What makes two modules repeats of one unit: their module tree and parameter shapes."""
    tree = tuple((name, type(m).__name__) for name, m in module.named_modules())
    return tree + tuple((name, tuple(p.shape)) for name, p in module.named_parameters())


def _alike(modules: Iterable[torch.nn.Module]) -> bool:
    return len({_structure(m) for m in modules}) == 1


def _kind(modules: Sequence[torch.nn.Module]) -> str:
    """``4 repeated Sequential(Linear, GELU, Linear)``, or ``16 Bottleneck`` where they differ, or
    ``3 of 2 classes (JambaMambaDecoderLayer x2, JambaAttentionDecoderLayer x1)``."""
    first = modules[0]
    classes = Counter(type(m).__name__ for m in modules)
    if len(classes) > 1:
        each = ", ".join(f"{name} x{count}" for name, count in classes.items())
        return f"{len(modules)} of {len(classes)} classes ({each})"
    if not _alike(modules):
        return f"{len(modules)} {type(first).__name__}"
    children = [type(c).__name__ for c in first.children()]
    inside = f"({', '.join(children[:6])}{', ...' if len(children) > 6 else ''})" if children else ""
    return f"{len(modules)} repeated {type(first).__name__}{inside}"


def _span(names: Sequence[str]) -> str:
    """``0..3`` or ``layers.0..layers.11`` for a numbered run, else the names (the first three,
    ``...`` and the last where there are more than four)."""
    heads = {name.rpartition(".")[0] for name in names}
    tails = [name.rpartition(".")[2] for name in names]
    if len(names) > 1 and len(heads) == 1 and all(t.isdigit() for t in tails):
        numbers = [int(t) for t in tails]
        if numbers == list(range(numbers[0], numbers[0] + len(numbers))):
            return f"{names[0]}..{names[-1]}"
    if len(names) > 4:
        return f"{', '.join(names[:3])}, ..., {names[-1]}"
    return ", ".join(names)


def _without_parallel_branches(chosen: list[str], modules: list[tuple[str, torch.nn.Module]]) -> list[str]:
    """The rule's chain condition (see :func:`find_blocks`): climb out of parallel branches."""
    containers = _containers()
    by_class: dict[type[torch.nn.Module], list[str]] = {}
    for name, module in modules:
        if name and not isinstance(module, containers):
            by_class.setdefault(type(module), []).append(name)

    def splits(outer: str) -> bool:  # found units in two or more containers inside ``outer``
        return outer not in chosen and len({c.rpartition(".")[0] for c in chosen if _contains(outer, c)}) >= 2

    splitting = {cls: names for cls, names in by_class.items() if len(names) >= 2 and any(map(splits, names))}
    if not splitting:
        return chosen
    return splitting[_innermost(splitting)[0]]


def _innermost(groups: Mapping[Any, list[str]]) -> list[Any]:
    """The keys of ``groups`` (module names by class) none of whose instances contains an
    instance of another group, in ``groups`` order."""
    return [
        key
        for key, names in groups.items()
        if not any(
            other != key and any(_contains(n, i) for n in names for i in inner) for other, inner in groups.items()
        )
    ]


def _containers() -> tuple[type[torch.nn.Module], ...]:
    """The container classes: rule 2 groups their children, and the chain condition never climbs
    to one of them (a container is not a repeated unit of the model's own)."""
    import torch

    return (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def _contains(outer: str, inner: str) -> bool:
    return inner.startswith(f"{outer}.")


def _outermost(names: list[str]) -> tuple[str, ...]:
    """Drop every name nested inside another name of the list (``names`` is in ``named_modules`` order)."""
    kept: list[str] = []
    for name in names:
        if not any(_contains(k, name) for k in kept):
            kept.append(name)
    return tuple(kept)
