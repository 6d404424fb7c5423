"""Cost model of one training step from a calibrated WorkloadProfile: time and peak memory.

Per micro-batch of b samples, with L blocks, block i of time share s_i, in reduced precision
(set R), recomputed whole (set C) or selectively (set S), phi the blocks' share of a
micro-batch's time:

    t_micro = t_mf * A(x_f) + b * t_ps * A(x_ps)
    A(x)    = (1 - phi) * x_o(x) + phi * sum_i s_i * x_i(x) * y_i
    y_i     = 1 + rho * [i in C] + sigma * rho * [i in S]
    x_i(x)  = x if i in R else 1
    x_o(x)  = x if the outer parts are reduced (Levels.outer) else 1
    t_step  = t_fixed + k * t_micro

The reduced precision has one factor on the per-sample time (x_ps, ``reduced_slowdown``) and one
on the per-micro-batch fixed time (x_f, ``reduced_fixed_slowdown``): on a GPU the matmuls of a
large micro-batch run several times faster in bf16 while a micro-batch of one, bound by kernel
launches, barely does (GPT-2 small on an H200: bf16's step 0.25x fp32's at 32 x 1024 tokens, 0.78x
at 8 x 256). A profile with one factor (x_f = x_ps) is the model before the split.

    kept_i = b * in_i if i in C
             b * (in_i + sel_i) if i in S                        (its input and its matmul outputs)
             f_i(R) + b * a_i(R) otherwise                      (what block i saves)

A selective block recomputes only what is not matmul-like (norms, activations, dropout, residual
sums: a few operations per element), so its recompute costs a fraction sigma of a whole block's
(``WorkloadProfile.selective_fraction``, default :data:`SELECTIVE_FRACTION`): not calibrated
from timed steps, because those ops' share of a block's time depends on the machine and the model
far less than the time of the matmuls does, and a calibration runs no selective step. Its
memory, ``sel_i`` per sample (``BlockCost.selective_per_sample``), comes from the memory model's
selective runs; a profile written before them has none, and a selective block then counts as
keeping what it would without recompute (its peak never below none's: the simulator never
prefers a level it cannot see).

The outer parts (embeddings, final norm, head, loss: everything outside the blocks, 1 - phi of a
micro-batch's time) in the reduced precision run at the speed the calibration measured for the
blocks in it (x_o is the blocks' ``reduced_slowdown``): no outer step is timed, and the head and
the loss are matmuls and elementwise work like the blocks'. Their memory is the memory model's
prediction with the outer parts reduced (``outer_peak_table``, ``outer_selective_peak_table``).
A calibrated profile without those tables (written before the outer precision was a knob) models
the outer parts in fp32 whatever ``Levels.outer`` says: the simulator neither prefers nor refuses
what it cannot see. A profile with no memory table at all (a synthetic one of domain
randomization) models them in the block-sum model below: their activations and temporaries at the
blocks' own reduced-over-fp32 bytes (r_o = sum_i reduced_i / sum_i fp32_i, per sample), their time
at the blocks' reduced speed.

    start  = b * (a_other + temp) * (r_o if the outer parts are reduced else 1)
             + sum_i kept_i (+ grads with accumulation)
    sweep  = max_j sum_{i<j} kept_i + full_j + grads_{>=j}    (backward, last block first)
    peak   = params + optimizer_state + max(start, sweep, grads)

With R > 1 data-parallel ranks at ZeRO stage s (Rajbhandari et al., SC'20), each rank trains its
micro-batches as above, and per rank, with Psi parameters of g = 4 bytes (fp32 weights; Adam's
state O and DeepSpeed's fp32 master partition at stages >= 1):

    params = g Psi / R at stage 3, else g Psi;   optimizer = O at stage 0, else (4 Psi + O) / R
    grads  = g Psi at stages 0-1, else g Psi / R
    peak   = peak at one rank - (g Psi + O + g Psi) + params + optimizer + grads
    comm   = (R - 1) / R * g Psi / bandwidth x (2 per step at stages 0-1; 1 per micro-batch + 1
             per step at stage 2; 3 per micro-batch at stage 3: ZeRO-3 gathers parameters for
             the forward and the backward and reduce-scatters gradients)

(ring collectives move (R - 1)/R of the buffer per rank), plus the per-collective overheads that
bandwidth does not see (launches, hooks, small messages): ``zero_overhead`` x the local step time
at stage 3, 0.3x that at stage 2 and 0.1x at stage 1 (the shares are an assumption). On 2 CPU
ranks that overhead measured ~2.4 where the bandwidth term alone gives ~0.03
(docs/benchmark-log.md, "The simulator's ZeRO overhead"). This ZeRO part is arithmetic
with two machine parameters, not calibrated per workload: the simulator uses it to let a policy
learn what the ZeRO action does to memory and time, not to predict a DeepSpeed run exactly.

That block-sum memory model serves synthetic profiles (domain randomization); a calibrated
profile of a real workload carries ``peak_table``, the memory model's prediction for every knob
setting (exact fake-tensor profile, ``autotune.predict_memory``), which is used instead. The error
of both against measurement is reported by benchmarks/sim_vs_real.py (README).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass

import numpy as np
from autotune.envs._codec import ACCUM_LEVELS, FRACTION_LEVELS, MICRO_LEVELS, Levels, blocks_at_level
from autotune.envs.calibration import BlockCost, WorkloadProfile, peak_table_index, selective_table_index

from autotune.measurement.objective import per_gib

__all__ = [
    "CPU_ZERO_OVERHEAD",
    "SELECTIVE_FRACTION",
    "SYNTHETIC_SELECTIVE_SHARE",
    "StepCost",
    "ranked_settings",
    "step_cost",
    "step_seconds",
    "randomized_machine",
    "randomized_profile",
    "ranking",
]


@dataclass(frozen=True)
class StepCost:
    seconds: float  # one optimizer step
    peak_bytes: int


def ranking(profile: WorkloadProfile) -> tuple[int, ...]:
    """Blocks, hungriest (fp32 bytes per sample) first; the same order ``profile_blocks`` ranks."""
    return tuple(sorted(range(len(profile.blocks)), key=lambda i: (-profile.blocks[i].fp32_per_sample, i)))


#: A selective block's recompute time over a whole block's (see the module docstring): the
#: elementwise operations' share of a block's forward, a quarter on the GPT-style blocks (their
#: matmuls and attention hold most of the time; Korthikanti et al. 2022 measured recomputing the
#: attention's elementwise part alone at under a tenth of full recompute's overhead).
SELECTIVE_FRACTION = 0.25

#: Stage-3 step overhead on this machine's CPU ranks (see the module docstring).
CPU_ZERO_OVERHEAD = 2.4
_OVERHEAD_SHARE = {0: 0.0, 1: 0.1, 2: 0.3, 3: 1.0}


def step_cost(
    p: WorkloadProfile, knobs: Levels, *, ranks: int = 1, bandwidth: float = 1e9, zero_overhead: float = 0.0
) -> StepCost:
    """Seconds of one optimizer step and peak bytes per rank; ``bandwidth`` in bytes/s per rank,
    ``zero_overhead`` the stage-3 step's extra time relative to the local step."""
    local = _local_cost(p, knobs)
    if ranks == 1:
        return local
    psi_bytes = float(p.parameters_bytes)  # g Psi: the local runner keeps fp32 parameters
    stage, r = knobs.zero_stage, ranks
    params = psi_bytes / r if stage == 3 else psi_bytes
    optimizer = p.optimizer_state_bytes if stage == 0 else (psi_bytes + p.optimizer_state_bytes) / r
    grads = psi_bytes if stage <= 1 else psi_bytes / r
    peak = local.peak_bytes - (psi_bytes + p.optimizer_state_bytes + p.gradients_bytes) + params + optimizer + grads
    k = knobs.accum_steps
    volumes = {0: 2.0, 1: 2.0, 2: k + 1.0, 3: 3.0 * k}[stage]
    comm = volumes * (r - 1) / r * psi_bytes / bandwidth + _OVERHEAD_SHARE[stage] * zero_overhead * local.seconds
    return StepCost(seconds=local.seconds + comm, peak_bytes=int(max(peak, 0.0)))


def step_seconds(
    p: WorkloadProfile,
    *,
    micro_batch_size: int,
    accum_steps: int,
    reduced: Collection[int],
    recomputed: Collection[int],
    selective: Collection[int] = (),
    outer: bool = False,
) -> float:
    """Seconds of one optimizer step on one rank: ``t_step`` of the module docstring, with the
    blocks (indices in forward order) in reduced precision, recomputed whole and recomputed
    selectively given explicitly, so any configuration (a study's trial, not only the
    environments' quarter levels) can be timed; ``outer``: the outer parts in the reduced
    precision (their share of the micro-batch at the blocks' reduced speed)."""
    b, k = micro_batch_size, accum_steps
    sigma = SELECTIVE_FRACTION if p.selective_fraction is None else p.selective_fraction

    def factor(x: float) -> float:  # A(x): the micro-batch's time under precision factor x
        block_time = sum(
            blk.time_share
            * (x if i in reduced else 1.0)
            * (1.0 + p.recompute_fraction * ((i in recomputed) + sigma * (i in selective)))
            for i, blk in enumerate(p.blocks)
        )
        return (1.0 - p.blocks_fraction) * (x if outer else 1.0) + p.blocks_fraction * block_time

    per_sample = factor(p.reduced_slowdown)
    if p.reduced_fixed_slowdown is None:  # one factor: the arithmetic of profiles before the split
        t_micro = (p.micro_fixed_seconds + b * p.micro_seconds_per_sample) * per_sample
    else:
        t_micro = p.micro_fixed_seconds * factor(p.reduced_fixed_slowdown) + b * p.micro_seconds_per_sample * per_sample
    return p.step_fixed_seconds + k * t_micro


def _local_cost(p: WorkloadProfile, knobs: Levels) -> StepCost:
    order = ranking(p)
    low = blocks_at_level(knobs.precision, order)
    ckpt = blocks_at_level(knobs.checkpoint, order)
    sel = blocks_at_level(knobs.checkpoint + knobs.selective, order) - ckpt
    b, k = knobs.micro_batch_size, knobs.accum_steps
    # Without its figures fp32 (module docstring): a calibrated profile's tables have none, a
    # synthetic profile (no table at all) is modelled by the block sums below.
    outer = knobs.outer and (p.outer_peak_table is not None or p.peak_table is None)
    seconds = step_seconds(
        p, micro_batch_size=b, accum_steps=k, reduced=low, recomputed=ckpt, selective=sel, outer=outer
    )

    def full(i: int) -> float:
        blk = p.blocks[i]
        return blk.reduced_fixed + b * blk.reduced_per_sample if i in low else blk.fp32_fixed + b * blk.fp32_per_sample

    def kept_by(i: int) -> float:
        blk = p.blocks[i]
        if i in ckpt:
            return b * blk.input_per_sample
        if i in sel and blk.selective_per_sample is not None:
            return min(b * (blk.input_per_sample + blk.selective_per_sample), full(i))
        return full(i)

    kept = [kept_by(i) for i in range(len(p.blocks))]
    grads, n = float(p.gradients_bytes), len(p.blocks)
    # End of forward / start of backward: everything saved, plus the head's gradient temporaries.
    outer_ratio = _reduced_ratio(p) if outer else 1.0
    peak_act = b * (p.other_activation_per_sample + p.temporaries_per_sample) * outer_ratio + sum(kept)
    peak_act += grads if k > 1 else 0.0  # with accumulation, gradients live through every forward
    # Backward sweep, last block first: blocks before j still hold what they saved, block j
    # holds its full activations (rebuilt if it was checkpointed), gradients of blocks >= j exist
    # (all of them with accumulation). The head's activations are gone by then.
    below = sum(kept)
    for j in reversed(range(n)):
        below -= kept[j]
        g = grads if k > 1 else grads * (n - j) / n
        peak_act = max(peak_act, below + full(j) + g)
    peak = p.parameters_bytes + p.optimizer_state_bytes + max(peak_act, grads)
    table, banded = (
        (p.outer_peak_table, p.outer_selective_peak_table) if outer else (p.peak_table, p.selective_peak_table)
    )
    if table is not None and not sel:
        peak = table[peak_table_index(knobs)]
    elif table is not None and banded is not None:
        peak = banded[selective_table_index(knobs)]
    elif table is not None:
        # No selective figures: the selective blocks' peak as if they were not recomputed (a bound).
        peak = table[peak_table_index(dataclasses.replace(knobs, selective=0))]
    return StepCost(seconds=seconds, peak_bytes=int(peak))


def _reduced_ratio(p: WorkloadProfile) -> float:
    """The blocks' activation bytes per sample in the reduced precision over fp32's: ``r_o`` of the
    module docstring, the block-sum model's reduced outer parts."""
    fp32 = sum(b.fp32_per_sample for b in p.blocks)
    return sum(b.reduced_per_sample for b in p.blocks) / fp32 if fp32 > 0 else 1.0


#: A synthetic block's selective bytes (what it keeps beyond its input, recomputed selectively)
#: as a share of what it saves beyond its input without recompute, where its profile has no
#: selective figures: drawn uniformly in this range per synthetic model. On a 5M-parameter GPT the
#: memory model measured 0.67 (72.1 MiB of activations selective, 102.2 none, 12.0 every block
#: recomputed: /work/shared/NOTES.md); attention without a fused kernel keeps more, an MLP less.
SYNTHETIC_SELECTIVE_SHARE = (0.4, 0.9)


def randomized_profile(p: WorkloadProfile, rng: np.random.Generator) -> WorkloadProfile:
    """Domain randomization (Tobin et al. 2017): a synthetic model and machine around ``p``.

    Depth is resampled (blocks drawn with replacement, 2-32 of them), bytes and times scaled by
    log-uniform factors in [1/4, 4], and the reduced-precision slowdown drawn log-uniformly in
    [0.3, 30]: from a GPU's tensor cores (bf16 ~3x faster) to this AVX2 CPU (~20x slower).

    The synthetic model has no memory tables (another model: the block-sum model of the module
    docstring), so both knobs the tables carry for a calibrated profile come from block figures
    there: a block's selective bytes are its profile's, scaled with the rest, or where the profile
    has none a share of what it saves beyond its input drawn in :data:`SYNTHETIC_SELECTIVE_SHARE`;
    a selective block's recompute time over a whole block's (``selective_fraction``) is drawn
    log-uniformly in [1/2, 2] x its profile's (or :data:`SELECTIVE_FRACTION`), capped at 1; and the
    outer parts in the reduced precision keep the blocks' reduced share of their bytes (``r_o``).
    """
    depth = int(rng.integers(2, 33))
    picks = rng.integers(0, len(p.blocks), size=depth)
    mem, tim = (float(math.exp(rng.uniform(math.log(0.25), math.log(4.0)))) for _ in range(2))
    blocks = [p.blocks[int(i)] for i in picks]
    reduced_slowdown = float(math.exp(rng.uniform(math.log(0.3), math.log(30.0))))
    # Drawn after the draws above, so a seed's depth, blocks, scales and slowdown are what they
    # were before the selective recompute was the policy's.
    share = float(rng.uniform(*SYNTHETIC_SELECTIVE_SHARE))
    sigma = (SELECTIVE_FRACTION if p.selective_fraction is None else p.selective_fraction) * float(
        math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
    )

    def selective(b: BlockCost) -> float:
        if b.selective_per_sample is not None:
            return b.selective_per_sample * mem
        return share * max(b.fp32_per_sample - b.input_per_sample, 0.0) * mem

    total_share = sum(b.time_share for b in blocks) or 1.0
    scale_params = depth / len(p.blocks)
    # deeper: the blocks' share of the time grows with their number
    phi = p.blocks_fraction * scale_params / (p.blocks_fraction * scale_params + 1.0 - p.blocks_fraction)
    new_blocks = tuple(
        dataclasses.replace(
            b,
            fp32_fixed=b.fp32_fixed * mem,
            fp32_per_sample=b.fp32_per_sample * mem,
            reduced_fixed=b.reduced_fixed * mem,
            reduced_per_sample=b.reduced_per_sample * mem,
            input_per_sample=b.input_per_sample * mem,
            time_share=b.time_share / total_share,
            selective_per_sample=selective(b),
        )
        for b in blocks
    )
    return dataclasses.replace(
        p,
        workload=f"{p.workload}~random",
        num_parameters=int(p.num_parameters * scale_params * mem),
        parameters_bytes=int(p.parameters_bytes * scale_params * mem),
        gradients_bytes=int(p.gradients_bytes * scale_params * mem),
        optimizer_state_bytes=int(p.optimizer_state_bytes * scale_params * mem),
        other_activation_per_sample=p.other_activation_per_sample * mem,
        temporaries_per_sample=p.temporaries_per_sample * mem,
        blocks=new_blocks,
        step_fixed_seconds=p.step_fixed_seconds * tim * scale_params,
        micro_fixed_seconds=p.micro_fixed_seconds * tim,
        micro_seconds_per_sample=p.micro_seconds_per_sample
        * tim
        * (1.0 - p.blocks_fraction + p.blocks_fraction * scale_params),
        blocks_fraction=phi,
        reduced_slowdown=reduced_slowdown,
        reduced_fixed_slowdown=None,  # one drawn factor: the machines the policy was trained on
        selective_fraction=min(sigma, 1.0),
        peak_table=None,  # another model: the block-sum model above, the outer parts' r_o included
        selective_peak_table=None,
        outer_peak_table=None,
        outer_selective_peak_table=None,
    )


def randomized_machine(p: WorkloadProfile, rng: np.random.Generator) -> WorkloadProfile:
    """The same model (its exact memory table kept) on another machine: the reduced-precision
    slowdown drawn log-uniformly in [0.3, 30] (bf16 tensor cores to an AVX2 CPU without bf16
    units; on this project's AVX-512 CPUs it measured 0.5-1.7) and the recompute cost scaled by
    a log-uniform factor in [1/2, 2]."""
    return dataclasses.replace(
        p,
        workload=f"{p.workload}~machine",
        reduced_slowdown=float(math.exp(rng.uniform(math.log(0.3), math.log(30.0)))),
        reduced_fixed_slowdown=None,  # one drawn factor: the machines the policy was trained on
        recompute_fraction=p.recompute_fraction * float(math.exp(rng.uniform(math.log(0.5), math.log(2.0)))),
    )


def ranked_settings(
    p: WorkloadProfile, batch_size: int, *, reduced: bool = True, selective: bool = False, outer: bool = False
) -> list[tuple[float, Levels]]:
    """Every one-rank knob setting of effective batch ``batch_size`` that the level tables express
    (micro-batch x accumulation splits, precision and checkpoint quarters; fp32 only unless
    ``reduced``), with its simulated samples/s per GiB of peak, best first (ties: less memory,
    then the order below).

    ``selective`` adds the selective recompute levels after each checkpoint level (every band of
    :attr:`Levels.selective` the tables allow), and ``outer`` the outer parts in the reduced
    precision (only with ``reduced``: the same rule as the blocks'). Each such setting follows the
    one without it, so on a tie the setting without it ranks first: a calibrated profile without
    their tables (written before they were knobs) sees neither save memory, and models the outer
    parts in fp32 (``_local_cost``), so neither is ever preferred there.
    """
    out: list[tuple[float, int, Levels]] = []
    for levels in _settings(batch_size, reduced=reduced, selective=selective, outer=outer):
        cost = step_cost(p, levels)
        value = per_gib(batch_size / cost.seconds, cost.peak_bytes)  # the one objective
        out.append((value, cost.peak_bytes, levels))
    out.sort(key=lambda t: (-t[0], t[1]))  # stable: a tie keeps the order of _settings
    return [(value, levels) for value, _, levels in out]


def _settings(batch_size: int, *, reduced: bool, selective: bool, outer: bool) -> Iterator[Levels]:
    """:func:`ranked_settings`' candidates, each setting with a selective band or the outer parts
    reduced right after the same setting without."""
    outers = (False, True) if outer and reduced else (False,)
    for micro, m in enumerate(MICRO_LEVELS):
        if batch_size % m or batch_size // m not in ACCUM_LEVELS:
            continue
        accum = ACCUM_LEVELS.index(batch_size // m)
        for precision, checkpoint in itertools.product(
            range(FRACTION_LEVELS if reduced else 1), range(FRACTION_LEVELS)
        ):
            bands = range(FRACTION_LEVELS - checkpoint if selective else 1)
            for band, reduced_outer in itertools.product(bands, outers):
                yield Levels(
                    accum=accum,
                    micro=micro,
                    precision=precision,
                    checkpoint=checkpoint,
                    selective=band,
                    outer=reduced_outer,
                )
