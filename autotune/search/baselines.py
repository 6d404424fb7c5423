"""The baselines every study enqueues first, so it shows how far the search beat them.

* ``pytorch-default``: what a plain PyTorch loop does: fp32, no accumulation, no checkpointing,
  the largest micro-batch that fits. Without a memory model we cannot know what fits before
  measuring, so it starts at the whole effective batch and, if that does not fit, the objective
  enqueues it again with the next smaller micro-batch (accumulation then makes up the batch),
  as ``accelerate.find_executable_batch_size`` does. A micro-batch the memory model puts at
  :data:`~autotune.search.budget.FAR_OVER` times the budget or more is passed over even before a
  trial has checked its prediction (:func:`~autotune.search.budget.far_over`): it cannot fit, and
  on a card of the budget's size measuring it is an out-of-memory error.
* ``seed-recipe``: the seed method's hand recipe: accumulation k=4, mixed precision (bf16) on all
  blocks, activation checkpoints every sqrt(L) blocks (Chen et al. 2016, "Training Deep Nets with
  Sublinear Memory Cost"), ZeRO-2 where ranks > 1. The space expresses checkpointing as a count
  over blocks ranked by activation bytes, so "every sqrt(L)-th block" becomes "ceil(L / sqrt(L))
  blocks": the same number of recomputed blocks, the same memory for models of identical blocks.
* ``hf-recipe``: what users of Hugging Face's Trainer do, ``TrainingArguments(bf16=True,
  gradient_checkpointing=True)`` at their batch: the whole model in bf16 autocast (every block and
  the outer parts: embeddings, head, loss), every block recomputed, the whole per-rank batch in one
  micro-batch, or the largest micro-batch that fits as for the PyTorch default (the memory model
  up front, else the objective's retry). Only where the space offers bf16: the recipe is bf16;
  or where the model is held in bf16 already (:attr:`Workload.held_in_16_bits`), whose space
  offers no precision: there ``bf16=True`` has nothing to cast and the recipe is its checkpointing.
* ``hf-bf16``: under the ``throughput`` objective, what a Trainer user after speed runs,
  ``TrainingArguments(bf16=True)`` alone: the whole model in bf16 autocast, nothing recomputed, the
  largest micro-batch that fits as for the PyTorch default. On a GPU it is the fastest of the two HF
  recipes wherever it fits (GPT-2 small on an H200: 1.3x the one with checkpointing at the same split),
  so a study for the most samples/s has to beat it, not only the recomputing one. Under per GiB it
  is not enqueued: the recomputing recipe is the HF user's memory recipe, and one trial fewer.

A third trial, ``policy``, is the pretrained policy's proposal for the model (enqueued by the
study unless its spec turns ``policy_proposal`` off; ``autotune tune --storage`` records its best
step under the same name).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from autotune.knobs import Knobs
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.search.space import SearchSpace
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.measurement.admission import Verdict

__all__ = [
    "Baseline",
    "HF_BF16",
    "HF_RECIPE",
    "NAMES",
    "POLICY_PROPOSAL",
    "PYTORCH_DEFAULT",
    "RETRIED",
    "SEED_RECIPE",
    "baselines",
    "recommended_line",
    "smaller_micro_batch",
]

PYTORCH_DEFAULT = "pytorch-default"
SEED_RECIPE = "seed-recipe"
HF_RECIPE = "hf-recipe"
HF_BF16 = "hf-bf16"
#: The baselines that take the largest micro-batch that fits: retried with a smaller one when
#: theirs did not (the objective's retry, ``accelerate.find_executable_batch_size``'s loop).
RETRIED: tuple[str, ...] = (PYTORCH_DEFAULT, HF_RECIPE, HF_BF16)
POLICY_PROPOSAL = "policy"
#: Every baseline's name, in the order the study enqueues them (the policy's proposal last).
NAMES: tuple[str, ...] = (PYTORCH_DEFAULT, SEED_RECIPE, HF_RECIPE, HF_BF16, POLICY_PROPOSAL)
#: The baselines a recommendation is compared with, in the words its line uses.
COMPARED: tuple[tuple[str, str], ...] = (
    (PYTORCH_DEFAULT, "PyTorch default"),
    (HF_RECIPE, "HF recipe"),
    (HF_BF16, "HF bf16-only recipe"),
)


@dataclass(frozen=True, kw_only=True)
class Baseline:
    name: str
    knobs: Knobs


def baselines(
    space: SearchSpace,
    *,
    batch_size: int,
    admits: Callable[[Knobs], Verdict] | None = None,
    held: bool = False,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
    hopeless: Callable[[Knobs], bool] | None = None,
) -> tuple[Baseline, ...]:
    """The baselines at effective batch ``batch_size``: the PyTorch default, the seed recipe and,
    where the space offers bf16 or the model is ``held`` in 16 bits, the HF recipe; under the
    ``"throughput"`` objective also the HF bf16-only recipe, where the space offers bf16 (a model
    held in 16 bits has nothing for ``bf16=True`` to cast: there it is the PyTorch default).
    ``admits`` (the admission rule on a memory prediction, :func:`autotune.search.budget.admits`)
    picks the largest admitted micro-batch for the PyTorch default and the HF recipes up front,
    when a memory model exists, passing over those ``hopeless`` says cannot fit whatever a
    measured trial would say (:func:`autotune.search.budget.far_over`)."""
    fitting = functools.partial(_largest_fitting, space, admits=admits, hopeless=hopeless)
    out = [_pytorch_default(space, batch_size, fitting), _seed_recipe(space, batch_size)]
    if held or "bf16" in space.low_precisions:
        out.append(_hf_recipe(space, batch_size, fitting, held=held))
    if objective == "throughput" and not held and "bf16" in space.low_precisions:
        out.append(_hf_bf16(space, batch_size, fitting))
    return tuple(out)


def _whole_batch(space: SearchSpace, batch: int) -> Knobs:
    """One rank where the space allows (else its fewest) and its whole batch in one micro-batch,
    nothing in low precision or recomputed: a plain loop's point, which the baselines start from."""
    ranks = 1 if 1 in space.ranks else min(space.ranks)
    return Knobs(
        batch_size=batch,
        ranks=ranks,
        micro_batch_size=max(space.micro_batch_choices(batch, ranks)),
        zero_stage=0 if ranks == 1 or 0 in space.zero_stages else min(space.zero_stages),
        low_precision=space.low_precisions[0] if space.low_precisions else "fp32",
        low_precision_blocks=0,
        checkpoint_blocks=0,
    )


def _largest_fitting(
    space: SearchSpace,
    knobs: Knobs,
    admits: Callable[[Knobs], Verdict] | None,
    hopeless: Callable[[Knobs], bool] | None = None,
) -> Knobs:
    if admits is None and hopeless is None:
        return knobs

    def fits(k: Knobs) -> bool:
        return (admits is None or admits(k).admitted) and (hopeless is None or not hopeless(k))

    smaller: Knobs | None = knobs
    while smaller is not None and not fits(smaller):
        smaller = smaller_micro_batch(space, smaller)
    return smaller or knobs  # nothing fits: measure it anyway and let it fail


def _pytorch_default(space: SearchSpace, batch: int, fitting: Callable[[Knobs], Knobs]) -> Baseline:
    return Baseline(name=PYTORCH_DEFAULT, knobs=fitting(_whole_batch(space, batch)))


def _hf_recipe(space: SearchSpace, batch: int, fitting: Callable[[Knobs], Knobs], *, held: bool) -> Baseline:
    n = space.num_blocks
    whole = replace(_whole_batch(space, batch), checkpoint_blocks=n)
    if not held:
        whole = replace(whole, low_precision="bf16", low_precision_blocks=n, outer_low_precision=True)
    return Baseline(name=HF_RECIPE, knobs=fitting(whole))


def _hf_bf16(space: SearchSpace, batch: int, fitting: Callable[[Knobs], Knobs]) -> Baseline:
    n = space.num_blocks
    whole = replace(_whole_batch(space, batch), low_precision="bf16", low_precision_blocks=n, outer_low_precision=True)
    return Baseline(name=HF_BF16, knobs=fitting(whole))


def _seed_recipe(space: SearchSpace, batch: int) -> Baseline:
    ranks = max(space.ranks)
    per_rank = batch // ranks
    choices = space.micro_batch_choices(batch, ranks)
    # Accumulation k=4: the micro-batch whose accumulation is closest to 4 (ties: larger micro).
    micro = min(choices, key=lambda m: (abs(per_rank // m - 4), -m))
    low = "bf16" if "bf16" in space.low_precisions else (space.low_precisions or ("fp32",))[0]
    n = space.num_blocks
    every = max(1, round(math.sqrt(n)))
    zero = 2 if 2 in space.zero_stages else max(space.zero_stages)
    knobs = Knobs(
        batch_size=batch,
        ranks=ranks,
        micro_batch_size=micro,
        zero_stage=zero if ranks > 1 else 0,
        low_precision=low,
        low_precision_blocks=n if space.low_precisions else 0,
        checkpoint_blocks=len(range(0, n, every)),
    )
    return Baseline(name=SEED_RECIPE, knobs=knobs)


def smaller_micro_batch(space: SearchSpace, knobs: Knobs) -> Knobs | None:
    """The same point with the next smaller micro-batch, or None at the smallest."""
    smaller = [m for m in space.micro_batch_choices(knobs.batch_size, knobs.ranks) if m < knobs.micro_batch_size]
    return replace(knobs, micro_batch_size=max(smaller)) if smaller else None


def recommended_line(
    where: str,
    summary: str,
    *,
    throughput: float | None,
    peak_bytes: int | None,
    per_gib: float | None,
    objective: str,
    ratios: Mapping[str, float | None],
    side_by_side: bool | AbstractSet[str] = False,
) -> str:
    """THE recommendation line of ``study`` and ``tune``, and how it compares with the baselines.

    Args:
        where: Which measurement is recommended (``"trial 7"``, ``"step 3"``).
        summary: Its configuration in one line (:meth:`autotune.TrainConfig.describe`).
        throughput: Its samples/s.
        peak_bytes: Its peak.
        per_gib: Its samples/s per GiB of peak.
        objective: ``"per-gib"`` or ``"throughput"``: which ratio the comparison gives.
        ratios: Per baseline measured (or meant to be), the recommendation's value over the
            baseline's under ``objective``; None where the baseline was infeasible.
        side_by_side: The ratios come from one run timing the recommendation and the baselines
            side by side (``tune``'s re-timing), or those of the baselines named (the study's
            finalists); the line says so.

    Returns:
        ``recommended: trial 7: ...: 65.9 samples/s, peak 31.46 MiB, 2145.1 samples/s per GiB
        (2.04x the PyTorch default and 1.10x the HF recipe per GiB)``.
    """
    per = objective == "per-gib"
    head = "recommended" if per else "recommended for the most samples/s within the budget"
    line = (
        f"{head}: {where}: {summary}: {_num(throughput)} samples/s, "
        f"peak {format_bytes(peak_bytes)}, {_num(per_gib)} samples/s per GiB"
    )
    versus = [
        f"{r:.2f}x the {what}" if per else f"{r:.2f}x the {what}'s"
        for name, what in COMPARED
        if (r := ratios.get(name)) is not None
    ]
    if versus:
        shown = [(name, what) for name, what in COMPARED if ratios.get(name) is not None]
        together = [what for name, what in shown if side_by_side is True or (side_by_side and name in side_by_side)]
        timed = ""
        if len(together) == len(shown):
            timed = ", timed side by side"
        elif together:
            timed = f", the {' and the '.join(together)} timed side by side"
        listed = versus[0] if len(versus) == 1 else f"{', '.join(versus[:-1])} and {versus[-1]}"
        line += f" ({listed} {'per GiB' if per else 'samples/s'}{timed})"
    if HF_RECIPE in ratios and ratios[HF_RECIPE] is None:
        line += "; the HF recipe (bf16 + checkpointing) was infeasible"
    return line


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"
