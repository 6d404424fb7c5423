"""Where a run starts when its default configuration is over the memory budget: THE search.

An adaptive run (:meth:`autotune.adapt.controller.Controller.start`) and the training
environment's reset (``TuningEnv`` with ``start_within_budget``) start at the first configuration
of :func:`start_candidates` that the admission rule (:mod:`autotune.memory.gate`) admits.

The order: the default's split first, then ever smaller micro-batches (halved, down to the
workload's floor, :func:`autotune.knobs.smallest_micro_batch`), with nothing recomputed; then the
same with every block recomputed; at each split, the ZeRO stages lowest first. A smaller
micro-batch costs a little throughput (more, smaller kernels), recompute costs a third of a step
or so (a forward pass again), and a higher ZeRO stage costs communication: so the cheapest way
under the budget is tried first, and the effective batch, the user's training maths, never moves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence

from autotune.config import TrainConfig
from autotune.knobs import smallest_micro_batch
from autotune.memory.gate import Verdict

__all__ = ["first_within", "start_candidates"]


def start_candidates(
    default: TrainConfig,
    *,
    min_micro_batch: int | None,
    stages: Sequence[int] = (0,),
    max_accum: int | None = None,
) -> Iterator[TrainConfig]:
    """The configurations a run over the budget at ``default`` may start at, in the order tried
    (module docstring); the first is ``default``'s own split without recompute.

    Args:
        default: The run's own configuration.
        min_micro_batch: The smallest micro-batch that keeps the user's training
            (:func:`autotune.knobs.smallest_micro_batch`'s floor; None: no accumulation).
        stages: The ZeRO stages to try at each split, lowest first.
        max_accum: The most micro-batches a step may accumulate (None: no limit).

    Yields:
        Each candidate: ``default`` with another micro-batch (each dividing the default's),
        recompute on no block or on every block, and a ZeRO stage.
    """
    batch = default.micro_batch_size
    per_rank = batch * default.grad_accum_steps
    floor = min(batch, smallest_micro_batch(per_rank, min_micro_batch))
    for checkpoint in (False, True):
        micro = batch
        while micro >= floor and (max_accum is None or per_rank // micro <= max_accum):
            if batch % micro == 0:
                for stage in stages:
                    yield dataclasses.replace(
                        default,
                        micro_batch_size=micro,
                        grad_accum_steps=per_rank // micro,
                        checkpoint=checkpoint,
                        zero_stage=stage,
                    )
            micro //= 2


def first_within(
    candidates: Iterator[TrainConfig] | Sequence[TrainConfig],
    check: Callable[[TrainConfig], Verdict],
) -> tuple[tuple[TrainConfig, Verdict] | None, list[Verdict]]:
    """The first of ``candidates`` that ``check`` admits, and the verdicts of those it refused.

    Args:
        candidates: :func:`start_candidates`, less those the caller's loop cannot take.
        check: The admission rule's verdict on a configuration.

    Returns:
        ``((config, its verdict), refused)``, or ``(None, refused)`` when none is admitted.
    """
    refused: list[Verdict] = []
    for config in candidates:
        verdict = check(config)
        if verdict.admitted:
            return (config, verdict), refused
        refused.append(verdict)
    return None, refused
