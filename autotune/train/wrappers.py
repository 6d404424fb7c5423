"""Turn a config's per-block knobs into wrappers on a live model, reversibly.

Each block's ``forward`` is shadowed by an instance attribute that runs the original forward
under ``torch.autocast`` (per-block precision) and/or inside ``torch.utils.checkpoint``
(per-block recompute: the whole block, or selectively, keeping its matmul-like outputs:
:mod:`autotune.train.selective`). Removing the wrappers deletes the instance attributes, so the model is
exactly as it was: same parameters, same hooks. The Gymnasium environment relies on this to
reconfigure a model mid-training without touching its weights or optimizer state.

A recomputed block writes no key/value cache: Hugging Face's decoders keep ``use_cache=True`` in
training by default and append each layer's keys and values to the cache in its forward, so a
recompute would append them a second time (selective recompute then finds more operations than it
saved and raises; Gemma 2, Falcon and T5 fail under a full recompute too). The wrapper
applies transformers' own rule for a checkpointed layer (``GradientCheckpointingLayer``).

A module that sits at two block positions (shared weights, ALBERT-style: ``layers[3] is
layers[0]``) is wrapped once, with the knobs :func:`effective_block_knobs` gives it.

The outer precision (``TrainConfig.outer_precision``) is the autocast region around everything
else: :func:`outer_autocast` is that region, which the trainers open around the workload's
``loss_fn`` (the model's forward and the loss) and :func:`apply_outer_precision` installs around
a model's own forward for a loop autotune does not own (an exported ``apply()``, the framework
callbacks). Under a reduced outer precision the blocks are its exceptions: an fp32 block runs
with autocast disabled on inputs in its own dtype, a reduced one under its autocast, and no
block's output is cast back (autocast itself casts each operation's inputs, as under Hugging
Face's ``bf16=True``). Under an fp32 outer precision a reduced block is an island whose outputs go
back to its own dtype.

A block's own dtype is the one most of its parameter elements are held in: fp32 for a model
trained in fp32; bf16 for a model loaded in bf16, and for a LoRA model on a bf16 base (PEFT keeps
the adapters in fp32 and hands the next layer bf16 activations). Casting those back to fp32 made
the next block's bf16 weights refuse its input ("expected m1 and m2 to have the same dtype").
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import checkpoint, noop_context_fn

from autotune.config import RECOMPUTE_LEVELS, Precision, RecomputeLevel, TrainConfig
from autotune.train.recompute import RecomputeKeepsState, has_running_state
from autotune.train.selective import selective_contexts

__all__ = [
    "AUTOCAST_DTYPES",
    "BlockWrappers",
    "apply_block_knobs",
    "apply_config",
    "apply_outer_precision",
    "effective_block_knobs",
    "outer_autocast",
    "own_dtype",
]

AUTOCAST_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}

_SENTINEL = object()

#: The arguments through which a Hugging Face layer writes its key/value cache.
_CACHE_ARGS = ("past_key_values", "layer_past")


def _cache_positions(forward: Callable[..., Any]) -> dict[str, int]:
    """Where ``forward`` takes ``use_cache`` and its cache arguments positionally (GPT-2's model
    passes ``past_key_values`` as its blocks' second argument), by name."""
    try:
        parameters = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):  # a builtin or a C extension: nothing to find
        return {}
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {
        p.name: i for i, p in enumerate(parameters) if p.kind in positional and p.name in ("use_cache", *_CACHE_ARGS)
    }


def _without_cache(
    block: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], positions: dict[str, int]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A recomputed ``block``'s call without its cache: ``use_cache`` false, and
    ``past_key_values`` / ``layer_past`` None unless the block declares that it only reads the
    cache (``_can_checkpoint_with_cache``), whether passed by name or at ``positions``. The rule
    transformers applies to a layer under its own gradient checkpointing
    (``GradientCheckpointingLayer``); in training the cache is written, never read, so the loss
    and the gradients are the same."""
    dropped = () if getattr(block, "_can_checkpoint_with_cache", False) else _CACHE_ARGS
    new_args = list(args)
    new_kwargs = dict(kwargs)
    # A cache is tested against None, not for truth: an empty one has length 0.
    for name, value in (("use_cache", False), *((n, None) for n in dropped)):
        i = positions.get(name)
        if i is not None and i < len(new_args):
            if new_args[i] is not None and new_args[i] is not False:
                new_args[i] = value
        elif new_kwargs.get(name) is not None and new_kwargs[name] is not False:
            new_kwargs[name] = value
    return tuple(new_args), new_kwargs


@dataclass
class BlockWrappers:
    """Handle to the wrappers installed by :func:`apply_block_knobs`; ``remove()`` undoes them."""

    _blocks: list[tuple[torch.nn.Module, Any]]
    #: The outer precision's wrapper (:func:`apply_outer_precision`): the model, the method it
    #: wraps and what that method was; installed before the blocks', removed after them.
    _outer: tuple[torch.nn.Module, str, Any] | None = None

    @property
    def modules(self) -> tuple[torch.nn.Module, ...]:
        """The wrapped modules, each once, in the order they were wrapped (forward order)."""
        return tuple(block for block, _ in self._blocks)

    def remove(self) -> None:
        # Last installed, first removed: the one order that unwinds any stack of wrappers.
        wrapped = [(block, "forward", previous) for block, previous in self._blocks]
        for module, method, previous in reversed([*([self._outer] if self._outer else []), *wrapped]):
            if previous is _SENTINEL:
                delattr(module, method)
            else:
                setattr(module, method, previous)
        self._blocks.clear()
        self._outer = None


def effective_block_knobs(
    block_modules: Sequence[torch.nn.Module],
    precisions: Sequence[Precision],
    checkpoints: Sequence[RecomputeLevel],
) -> tuple[tuple[Precision, ...], tuple[RecomputeLevel, ...]]:
    """The knobs each block position really runs with, once positions holding the same module
    object (shared weights) are merged: such a module has one forward, so one wrapper.

    Its precision is the first non-fp32 precision among its positions (fp32 if none), and its
    recompute level the highest among its positions (``none`` < ``selective`` < ``full``).
    Returns per-position precisions and recompute levels: :func:`apply_block_knobs` installs
    these, and the memory model must count these.
    """
    assert len(block_modules) == len(precisions) == len(checkpoints)
    precision: dict[int, Precision] = {}
    level: dict[int, RecomputeLevel] = {}
    for module, p, c in zip(block_modules, precisions, checkpoints, strict=True):
        key = id(module)
        if precision.get(key, "fp32") == "fp32":
            precision[key] = p
        level[key] = max(level.get(key, "none"), c, key=RECOMPUTE_LEVELS.index)
    return (
        tuple(precision[id(m)] for m in block_modules),
        tuple(level[id(m)] for m in block_modules),
    )


def outer_autocast(precision: Precision, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The outer precision's region: ``torch.autocast`` in ``precision``, or nothing for fp32.

    Example:
        >>> import torch
        >>> with outer_autocast("bf16", "cpu"):
        ...     torch.ones(2, 2) @ torch.ones(2, 2)
        tensor([[2., 2.],
                [2., 2.]], dtype=torch.bfloat16)
    """
    dtype = AUTOCAST_DTYPES.get(precision)
    return contextlib.nullcontext() if dtype is None else torch.autocast(device_type, dtype=dtype)


def apply_outer_precision(
    model: torch.nn.Module, precision: Precision, *, device_type: str, around: str = "forward"
) -> BlockWrappers:
    """Run ``model``'s own forward under :func:`outer_autocast` (nothing for fp32), for a training
    loop that calls the model but is not autotune's (a loss computed inside the forward, as a
    Hugging Face model's with ``labels``, runs in it too). ``around``: the method of ``model`` the
    loop calls for a step's forward and loss (Lightning calls ``training_step``, which need not
    call ``forward``). ``remove()`` on the handle undoes it."""
    if precision == "fp32":
        return BlockWrappers([])
    previous = model.__dict__.get(around, _SENTINEL)
    inner = getattr(model, around)

    def forward(*args: Any, **kwargs: Any) -> Any:
        with outer_autocast(precision, device_type):
            return inner(*args, **kwargs)

    setattr(model, around, forward)
    return BlockWrappers([], _outer=(model, around, previous))


def apply_config(
    model: torch.nn.Module,
    block_names: Sequence[str],
    config: TrainConfig,
    *,
    device_type: str,
    outer_around: str = "forward",
) -> BlockWrappers:
    """Everything ``config`` does to a model, for a training loop that is not autotune's: its outer
    precision around the model's ``outer_around`` method (:func:`apply_outer_precision`) and its
    per-block knobs (:func:`apply_block_knobs`). ``remove()`` on the one handle undoes both."""
    n = len(block_names)
    outer = apply_outer_precision(model, config.outer_precision, device_type=device_type, around=outer_around)
    blocks = apply_block_knobs(
        model,
        block_names,
        config.block_precisions(n),
        config.checkpoint_levels(n),
        device_type=device_type,
        outer=config.outer_precision,
    )
    return BlockWrappers(blocks._blocks, _outer=outer._outer)  # removed last installed first


def apply_block_knobs(
    model: torch.nn.Module,
    block_names: Sequence[str],
    precisions: Sequence[Precision],
    checkpoints: Sequence[RecomputeLevel],
    *,
    device_type: str,
    outer: Precision = "fp32",
) -> BlockWrappers:
    """Wrap each named block of ``model`` with its precision and recompute level
    (``TrainConfig.checkpoint_levels``).

    Blocks that name the same module object are wrapped once, with their
    :func:`effective_block_knobs`. ``outer``: the precision the code around the blocks runs in
    (:func:`outer_autocast`, opened by the caller): under a reduced one an fp32 block is wrapped
    too (autocast disabled), and no block's output is cast back to fp32.
    """
    assert len(block_names) == len(precisions) == len(checkpoints)
    assert all(c in RECOMPUTE_LEVELS for c in checkpoints), checkpoints  # levels, not TrainConfig's bools
    blocks = [model.get_submodule(name) for name in block_names]
    precisions, checkpoints = effective_block_knobs(blocks, precisions, checkpoints)
    installed: list[tuple[torch.nn.Module, Any]] = []
    wrapped: set[int] = set()
    for block, precision, ckpt in zip(blocks, precisions, checkpoints, strict=True):
        if (precision == outer and ckpt == "none") or id(block) in wrapped:
            continue
        wrapped.add(id(block))
        previous = block.__dict__.get("forward", _SENTINEL)
        block.forward = _wrapped_forward(block, precision, ckpt, device_type, outer)
        installed.append((block, previous))
    return BlockWrappers(installed)


def _wrapped_forward(
    block: torch.nn.Module, precision: Precision, ckpt: RecomputeLevel, device_type: str, outer: Precision
) -> Callable[..., Any]:
    inner = block.forward
    dtype = AUTOCAST_DTYPES.get(precision)
    own = own_dtype(block)
    cache_at = _cache_positions(inner)

    def run(*args: Any, **kwargs: Any) -> Any:
        if precision == outer and dtype is None:  # fp32 throughout, wrapped for checkpointing only
            return inner(*args, **kwargs)
        if precision == outer:
            # Recomputed in the outer precision's region, without its cast cache: the region's
            # cache would keep this block's 16-bit weight copies to the end of the forward, which
            # a recomputed block, meant to keep only its input, must not hold.
            with torch.autocast(device_type, dtype=dtype, cache_enabled=False):
                return inner(*args, **kwargs)
        if dtype is None:
            # An fp32 exception under a reduced outer precision: autocast off, and its inputs in
            # its own dtype (a reduced block before it may hand it 16-bit activations).
            args, kwargs = tree_map_only(torch.Tensor, lambda t: _floating_to(t, own), (args, kwargs))
            with torch.autocast(device_type, enabled=False):
                return inner(*args, **kwargs)
        with torch.autocast(device_type, dtype=dtype):
            out = inner(*args, **kwargs)
        # Under an fp32 outer precision a block is a precision island: its outputs go back to
        # its own dtype so the next block (maybe fp32, outside autocast) and the head accept them.
        # Activations saved *inside* the block stay in low precision, which is where the memory
        # saving comes from.
        return tree_map_only(torch.Tensor, lambda t: _floating_to(t, own), out)

    def contexts() -> tuple[Any, Any]:
        # One pair per checkpoint invocation: selective recompute's cache of matmul-like outputs
        # (autocast inside ``run`` is below it, so they are kept in the block's precision), and
        # the running-state guard around it (autotune/train/recompute.py): a recompute would
        # update running state (BatchNorm's) a second time, and a selective one re-runs the norms.
        pair = selective_contexts() if ckpt == "selective" else noop_context_fn()
        return RecomputeKeepsState(block).contexts(*pair) if has_running_state(block) else pair

    def forward(*args: Any, **kwargs: Any) -> Any:
        if ckpt != "none" and torch.is_grad_enabled():
            args, kwargs = _without_cache(block, args, kwargs, cache_at)
            # Non-reentrant checkpointing (the recommended mode): works with kwargs, autocast
            # inside the region is replayed on recompute, RNG state is restored.
            if ckpt != "selective" and not has_running_state(block):
                # No context needed: none is passed, since under torch.compile a context_fn must
                # make TorchDispatchModes (Dynamo refuses a full recompute given no-op contexts).
                return checkpoint(run, *args, use_reentrant=False, **kwargs)
            return checkpoint(run, *args, use_reentrant=False, context_fn=contexts, **kwargs)
        return run(*args, **kwargs)

    return forward


def own_dtype(module: torch.nn.Module) -> torch.dtype:
    """The floating dtype most of ``module``'s parameter elements are held in (fp32 without any):
    what its outputs are without autocast, and what its neighbours expect.

    Example:
        >>> import torch
        >>> lora = torch.nn.ModuleDict({"base": torch.nn.Linear(64, 64).bfloat16(), "adapter": torch.nn.Linear(64, 2)})
        >>> own_dtype(lora), own_dtype(torch.nn.ReLU())
        (torch.bfloat16, torch.float32)
    """
    elements: dict[torch.dtype, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            elements[p.dtype] = elements.get(p.dtype, 0) + p.numel()
    return max(elements, key=elements.__getitem__) if elements else torch.float32


def _floating_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``t`` in ``dtype`` if it is 16-bit and ``dtype`` is not its dtype: what autocast made
    reduced goes back; what the block keeps in fp32 of its own accord (a router's logits) stays."""
    if t.dtype != dtype and t.dtype in (torch.bfloat16, torch.float16):
        return t.to(dtype)
    return t
