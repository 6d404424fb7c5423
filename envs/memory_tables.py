"""The memory tables of a simulator profile: the memory model's predicted peak of every knob
setting the environments reach (``peak_table``; with selective blocks, ``selective_peak_table``;
with the outer parts reduced, ``outer_peak_table`` and ``outer_selective_peak_table``), indexed by
the private level codec, and the blocks' bytes kept selectively. Fake tensors only, nothing timed:
:func:`with_memory_tables` is :func:`autotune.envs.calibration.calibrate`'s last phase, and all a
profile measured elsewhere needs to get them (``scripts/regenerate_profiles.py --memory-only``)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable

from autotune.envs._codec import FRACTION_LEVELS, MICRO_LEVELS, Levels, knobs_to_config
from autotune.envs.workload_profile import INFEASIBLE_PEAK, WorkloadProfile

from autotune.config import Precision
from autotune.errors import ConfigError
from autotune.memory.blocks import profile_blocks
from autotune.memory.model import compose_memory, plan_of
from autotune.memory.predict import profile_memory
from autotune.memory.profile import outer_mode
from autotune.memory.profile_record import MemoryProfile
from autotune.train.local import resolve_device
from autotune.tuning import TUNING
from autotune.workload import Workload

__all__ = ["memory_table", "peak_table_index", "selective_table_index", "with_memory_tables"]

Progress = Callable[[str], None]


def with_memory_tables(
    profile: WorkloadProfile,
    workload: Workload,
    *,
    selective: bool = True,
    outer: bool = True,
    progress: Progress | None = None,
    reuse: MemoryProfile | None = None,
) -> WorkloadProfile:
    """``profile`` with its memory tables (``peak_table``, and where asked the selective and
    outer ones and the blocks' selective bytes) predicted by the memory model for ``workload``:
    the last phase of :func:`calibrate`, and all that refreshing a profile's tables takes.

    Fake tensors only, nothing timed: the tables of a profile measured elsewhere can be redone on
    any machine (``scripts/regenerate_profiles.py --memory-only``), its timed terms kept as they
    were measured.

    Args:
        profile: The profile whose tables to (re)write; its other fields are kept.
        workload: The workload it profiles, at its batch size.
        selective: Whether to write the selective recompute level's table and bytes.
        outer: Whether to write the tables with the outer parts in the reduced precision.
        progress: Called with a line as each phase starts (None: silent).
        reuse: A memory profile of ``workload`` made before (a study's, at the memory model's
            default sizes): the fake runs it holds are not made again.

    Returns:
        The profile with its tables.

    Raises:
        ConfigError: ``workload`` is not at the profile's batch size.
    """
    if workload.batch_size != profile.batch_size:
        raise ConfigError(
            f"{workload.name}: the profile is at batch {profile.batch_size}, but the workload is at "
            f"batch {workload.batch_size}: its tables would index other micro-batches."
        )
    say = progress or (lambda _: None)
    reduced, runs = profile.reduced, profile.reduced_failure is None
    say("peak memory of every knob setting (memory model)")
    table, selective_table, selective_bytes = memory_table(
        workload, reduced=reduced, reduced_runs=runs, selective=selective, reuse=reuse
    )
    blocks = profile.blocks
    if selective:
        blocks = tuple(
            dataclasses.replace(b, selective_per_sample=x) for b, x in zip(blocks, selective_bytes, strict=True)
        )
    outer_table: tuple[int, ...] | None = None
    outer_selective: tuple[int, ...] | None = None
    if outer:
        say(f"peak memory of every knob setting with the outer parts in {reduced} (memory model)")
        outer_table, banded, _ = memory_table(
            workload, reduced=reduced, reduced_runs=runs, selective=selective, outer=True, reuse=reuse
        )
        outer_selective = banded if selective else None
    return dataclasses.replace(
        profile,
        blocks=blocks,
        peak_table=table,
        selective_peak_table=selective_table if selective else None,
        outer_peak_table=outer_table,
        outer_selective_peak_table=outer_selective,
    )


def peak_table_index(levels: Levels) -> int:
    """Where ``levels`` sits in ``WorkloadProfile.peak_table``: micro-batch, precision and
    checkpoint levels, and whether gradients accumulate (any accumulation > 1 holds the same:
    the gradients live through every forward; the step count does not change the peak)."""
    return ((levels.micro * FRACTION_LEVELS + levels.precision) * FRACTION_LEVELS + levels.checkpoint) * 2 + (
        levels.accum > 0
    )


def selective_table_index(levels: Levels) -> int:
    """Where ``levels`` (with a selective level) sits in ``WorkloadProfile.selective_peak_table``:
    micro-batch, precision, the checkpoint and selective levels (each pair with ``checkpoint +
    selective <= 4`` and ``selective >= 1``, in order), and whether gradients accumulate."""
    assert levels.selective > 0, "a setting without selective blocks is in peak_table"
    pair = _SELECTIVE_PAIRS.index((levels.checkpoint, levels.selective))
    return ((levels.micro * FRACTION_LEVELS + levels.precision) * len(_SELECTIVE_PAIRS) + pair) * 2 + (levels.accum > 0)


#: The (checkpoint, selective) level pairs with a selective band: ten.
_SELECTIVE_PAIRS = tuple(
    (c, s) for c in range(FRACTION_LEVELS) for s in range(1, FRACTION_LEVELS) if c + s <= FRACTION_LEVELS - 1
)


def memory_table(
    workload: Workload,
    *,
    reduced: Precision = "bf16",
    reduced_runs: bool = True,
    selective: bool = True,
    outer: bool = False,
    reuse: MemoryProfile | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[float, ...]]:
    """Predicted peak bytes of every knob setting the environments reach, in ``peak_table_index``
    order, with blocks ranked as ``TrainingEnv`` ranks them; the same of every setting with
    selective blocks, in ``selective_table_index`` order; and each block's bytes kept selectively
    per sample (besides its input). ``reduced_runs=False`` (the model cannot run in ``reduced``
    here): settings with a reduced block get :data:`INFEASIBLE_PEAK`. The selective runs are two
    more fake runs per mode, and the selective table 800 more predictions from the profile:
    ``selective=False`` leaves them out (the second and third parts then empty).

    ``outer=True``: the same settings with the outer parts in ``reduced`` too (``outer_peak_table``
    and ``outer_selective_peak_table``; the bytes kept selectively are the fp32 blocks' under the
    reduced outer autocast), from the memory model's ``fp32@reduced`` and ``reduced@reduced``
    modes; with ``reduced_runs=False`` every one of them is :data:`INFEASIBLE_PEAK`. ``reuse``: a
    memory profile of ``workload`` made before, whose fake runs are not made again."""
    ranking = profile_blocks(workload, micro_batch_size=TUNING.profile_micro_batch).ranked()
    # No check step: calibrate() measures the default configuration for real anyway.
    if outer:
        modes: tuple[str, ...] = (outer_mode("fp32", reduced), outer_mode(reduced, reduced))
    else:
        modes = ("fp32", reduced) if reduced_runs else ("fp32",)
    if outer and not reduced_runs:
        # Nothing of it can run here: no fake runs, every setting refused.
        size = len(MICRO_LEVELS) * FRACTION_LEVELS * 2
        banded_size = size * len(_SELECTIVE_PAIRS) if selective else 0
        return (INFEASIBLE_PEAK,) * size * FRACTION_LEVELS, (INFEASIBLE_PEAK,) * banded_size, ()
    # The kernels of the device the calibration measures on (the GPU when there is one).
    device = resolve_device(None).type
    profile = profile_memory(workload, modes=modes, selective=selective, verify=False, reuse=reuse, device=device)
    n = len(ranking)
    table = [0] * (len(MICRO_LEVELS) * FRACTION_LEVELS * FRACTION_LEVELS * 2)
    banded = [0] * (len(MICRO_LEVELS) * FRACTION_LEVELS * len(_SELECTIVE_PAIRS) * 2)
    pairs = [(c, 0) for c in range(FRACTION_LEVELS)] + (list(_SELECTIVE_PAIRS) if selective else [])
    for micro, precision, (checkpoint, sel), accum in itertools.product(
        range(len(MICRO_LEVELS)), range(FRACTION_LEVELS), pairs, (0, 1)
    ):
        levels = Levels(micro=micro, precision=precision, checkpoint=checkpoint, accum=accum, selective=sel)
        into, index = (banded, selective_table_index(levels)) if sel else (table, peak_table_index(levels))
        if precision > 0 and not reduced_runs:
            into[index] = INFEASIBLE_PEAK
            continue
        config = knobs_to_config(dataclasses.replace(levels, outer=outer), ranking, reduced=reduced)
        # The peak only: predict_memory's check that covers it (and its walk of the module tree
        # for the blocks, each time) is nothing a table keeps.
        plan = plan_of(config, num_blocks=n, device_type=device)
        into[index] = compose_memory(workload, config, profile, device_type=device, plan=plan).total
    if not selective:
        return tuple(table), (), ()
    small, large = profile.micro_batch_sizes
    saves = profile.modes[modes[0]].blocks
    per_sample = tuple(
        max(b - a, 0) / (large - small) for a, b in zip(saves[0].selective, saves[1].selective, strict=True)
    )
    return tuple(table), tuple(banded), per_sample
