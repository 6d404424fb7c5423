"""Whether a study's space keeps the selective recompute level on this model.

A selectively recomputed block keeps the outputs of the operations on its save list (matmul,
attention and convolution kernels: :data:`autotune.train.selective.SAVED_OPS`) besides its input,
and recomputes the rest. A block whose forward runs none of them (an LSTM block: its recurrent
kernel is not on the list) keeps exactly what a wholly recomputed block keeps and recomputes as
much: every selective configuration of such a model is a full recompute under another name, and
offering the level only spreads the study's few trials over names of the same configurations
(``benchmarks/selective_study.py`` measures a study with the level against one without it). So
before its baselines a study looks, in one fake-tensor forward of a copy of the model (no compute,
no memory), for an operation of the save list inside any block, and leaves the level out where
there is none.

Deterministic and machine-independent: a resumed study and its workers reach the same verdict.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from autotune.measurement.progress import since

if TYPE_CHECKING:
    from autotune.search.prepared import Prepared
    from autotune.workload import Workload

__all__ = ["blocks_with_saved_ops", "screen_selective"]


def blocks_with_saved_ops(workload: Workload) -> tuple[bool, ...] | None:
    """Per block (:meth:`~autotune.Workload.block_names`' order), whether its forward runs an
    operation whose output selective recompute keeps, from one fake-tensor forward of a copy of
    the model at micro-batch 1; None where the fake forward fails (nothing is concluded).

    Args:
        workload: The model and its data.

    Returns:
        One flag per block, or None.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    from autotune.errors import WorkloadError
    from autotune.memory.blocks import block_positions, fake_forward
    from autotune.train.selective import saved_output
    from autotune.worst_case import profile_batch

    names = workload.block_names()
    found = [False] * len(names)
    inside: list[list[int]] = []  # the block positions whose forward is running, innermost last

    class _Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if inside and saved_output(func):
                for i in inside[-1]:
                    found[i] = True
            return func(*args, **(kwargs or {}))

    def entered(positions: list[int]) -> Callable[..., None]:
        return lambda *_: inside.append(positions)

    def left(*_: Any) -> None:  # a forward hook returning a value would replace the output
        inside.pop()

    batch = profile_batch(workload, 1)
    try:
        with fake_forward(workload, batch) as (model, fake_batch):
            # A module at two block positions (a shared layer) is one forward: it is credited to
            # every position it holds, with one hook pair.
            hooks = []
            for block, positions in block_positions(model, names):
                hooks += [block.register_forward_pre_hook(entered(positions)), block.register_forward_hook(left)]
            with torch.no_grad(), _Ops():
                workload.loss_fn(model, fake_batch)
            for h in hooks:
                h.remove()
    except WorkloadError:
        raise
    # The fake pass runs the user's model code: whatever it raises there leaves the level in (the
    # trials measure what it does).
    except Exception:
        return None
    return tuple(found)


def screen_selective(prepared: Prepared, note: Callable[[str], None]) -> Prepared:
    """``prepared`` without the selective level where no block runs an operation it would keep
    (module docstring).

    Args:
        prepared: The study's input; returned as is unless its space offers the level.
        note: Told one line with the verdict and its seconds.

    Returns:
        ``prepared``, or a copy whose space has ``selective=False``.
    """
    if not prepared.space.selective:
        return prepared
    start = time.perf_counter()
    found = blocks_with_saved_ops(prepared.workload)
    if found is None:
        note(f"selective recompute kept: the fake forward that screens it failed ({since(start)})")
        return prepared
    if any(found):
        note(f"selective recompute kept: {sum(found)} of {len(found)} blocks run a kept operation ({since(start)})")
        return prepared
    note(
        "selective recompute left out: no block runs an operation whose output it keeps (matmul, "
        f"attention, convolution), so it would recompute as a whole block does ({since(start)})"
    )
    return dataclasses.replace(prepared, space=dataclasses.replace(prepared.space, selective=False))
