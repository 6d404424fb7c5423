"""Calibrating the simulator: a real, measured profile of one workload, saved as plain JSON.

``calibrate(workload)`` measures on the real training loop of this machine:
- exact model-state bytes and the activation/temporary peaks of the default configuration
  (MemTracker, via ``measure``);
- per-block bytes saved for backward, fp32 and reduced precision, at two micro-batch sizes (so
  the part that grows with the batch is separated from the fixed part: autocast weight copies),
  and each block's input bytes (what a checkpointed block keeps);
- per-block forward time (forward hooks; exact on CPU, where kernels run synchronously) and whole
  step times under six configurations, interleaved, from which the fixed and per-sample costs,
  the reduced-precision speed and the recompute cost are solved (``calibrate``);
- loss and gradient-noise-scale curves of a real run of the default configuration;
- whether the model runs in reduced precision here at all (``reduced_failure``: oneDNN has no
  bf16 LSTM primitive on an AVX2 CPU, and the step raises): a model that cannot gets an fp32-only
  profile, and the simulator refuses its reduced-precision settings as the real environment does;
- the peak memory of every knob setting the environment can reach (``peak_table``), predicted by
  the memory model (:func:`autotune.predict_memory`, exact fake-tensor profile plus the runner's
  rules): a few hundred predictions from one profile, about a second. Profiles of synthetic
  models (domain randomization) have no table and fall back on the block-sum model of
  ``costmodel.py``;
- the selective recompute level (``TrainConfig.checkpoint`` ``"selective"``) from the memory
  model's selective runs: each block's bytes kept selectively per sample
  (``BlockCost.selective_per_sample``) and the peak of every setting with selective blocks
  (``selective_peak_table``); its time is modelled, not timed (``costmodel.py``). Profiles
  written before the level have neither and read the same;
- the outer precision (``TrainConfig.outer_precision``: embeddings, final norm, head and loss in
  ``reduced`` too) from the memory model's ``fp32@bf16`` and ``bf16@bf16`` modes (the blocks
  in fp32 or ``reduced`` under a ``reduced`` outer autocast): the peak of every setting with the
  outer parts reduced (``outer_peak_table``, ``outer_selective_peak_table``); its time is
  modelled from the blocks' measured reduced speed (``costmodel.py``). A profile without them
  (written before the knob) keeps the outer parts fp32; a synthetic one (no table at all) models
  them from its blocks' bytes (``costmodel.py``'s block-sum model).

``autotune profile WORKLOAD`` runs it and writes the JSON the simulator loads (no pickle).
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from autotune.envs._codec import FRACTION_LEVELS, MICRO_LEVELS, Levels, knobs_to_config

from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError, NonFiniteLossError, TrainingError, one_line
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.record import Measurement
from autotune.memory.blocks import profile_blocks
from autotune.memory.predict import predict_memory, profile_memory
from autotune.memory.profile import outer_mode
from autotune.procs.measure import measure
from autotune.train import Trainer
from autotune.tuning import TUNING
from autotune.workload import Workload
from autotune.worst_case import profile_batch

__all__ = [
    "INFEASIBLE_PEAK",
    "BlockCost",
    "WorkloadProfile",
    "calibrate",
    "load_profile",
    "interleaved_step_seconds",
    "memory_table",
    "peak_table_index",
    "relative_nnls",
    "selective_table_index",
    "save_profile",
]

PROFILE_VERSION = 2
#: A setting the model cannot run here (``WorkloadProfile.reduced_failure``): over any budget.
INFEASIBLE_PEAK = 2**62


@dataclass(frozen=True, kw_only=True)
class BlockCost:
    """One block: activation bytes (fixed + per sample) per precision, input bytes, compute share.

    Attributes:
        name: The block's module name in the model.
        fp32_fixed: Activation bytes it saves for backward in fp32, independent of the micro-batch.
        fp32_per_sample: Activation bytes it saves for backward in fp32, per sample.
        reduced_fixed: As ``fp32_fixed``, in the profile's reduced precision.
        reduced_per_sample: As ``fp32_per_sample``, in the profile's reduced precision.
        input_per_sample: Bytes of its input per sample: what it keeps when recomputed whole.
        time_share: Its share of all blocks' forward time (fp32).
        selective_per_sample: What it keeps recomputed selectively besides its input, per sample
            (fp32; the memory model's selective runs); None in profiles written before the level.

    Example:
        >>> from autotune.envs import shipped_profiles
        >>> block = shipped_profiles()[0].blocks[0]
        >>> block.fp32_per_sample > 0, 0 < block.time_share <= 1
        (True, True)
    """

    name: str
    fp32_fixed: float
    fp32_per_sample: float
    reduced_fixed: float
    reduced_per_sample: float
    input_per_sample: float
    time_share: float
    selective_per_sample: float | None = None


@dataclass(frozen=True, kw_only=True)
class WorkloadProfile:
    """Everything the simulator knows of one workload on one machine.

    A step's time is ``step_fixed_seconds + accum * (micro_fixed_seconds + micro *
    micro_seconds_per_sample)``, its blocks' part scaled by precision and recompute
    (``envs/costmodel.py``).

    Attributes:
        version: The profile format's version (:data:`PROFILE_VERSION` when read).
        workload: The workload's name (a corpus name or a reference).
        machine: The machine it was measured on, in words.
        reduced: The reduced precision measured (``bf16`` or ``fp16``).
        num_parameters: The model's parameter count.
        batch_size: The workload's reference batch (episodes start there).
        parameters_bytes: Bytes of the parameters (fp32).
        gradients_bytes: Bytes of the gradients.
        optimizer_state_bytes: Bytes of the optimizer state (Adam's moments and step counters).
        other_activation_per_sample: Activation bytes outside the blocks (embeddings, head, loss)
            per sample.
        temporaries_per_sample: Bytes of the step's temporaries per sample, beyond what is saved.
        blocks: Each block's costs, in the model's order.
        step_fixed_seconds: Per optimizer step: the optimizer, clipping, bookkeeping.
        micro_fixed_seconds: Per micro-batch, independent of its size.
        micro_seconds_per_sample: Per sample of a micro-batch (fp32, nothing recomputed).
        blocks_fraction: The share of a micro-batch's time spent in the blocks (fp32).
        reduced_slowdown: Reduced-precision block time over fp32 block time (above 1: slower).
        recompute_fraction: The extra block time when recomputed, over the block time.
        curve_samples: The loss curve's samples seen, one per point.
        curve_loss: The loss curve's loss at each point.
        curve_b_noise: The gradient noise scale (samples) at each point.
        peak_table: Predicted peak bytes of every :class:`Levels` setting: index with
            :func:`peak_table_index`; None in profiles written before it.
        default_peak_bytes: Measured (tracked) peak bytes of the default configuration, which
            checks the table's prediction of it; None in profiles written before it was recorded.
        reduced_failure: Why the model cannot run in ``reduced`` precision on this machine (None:
            it can). Then the reduced figures are fp32's and every setting with a reduced block is
            infeasible.
        selective_peak_table: Predicted peak bytes of every setting with selective blocks: index
            with :func:`selective_table_index`; None in profiles written before the level.
        selective_fraction: A selective block's recompute time over a whole block's (None:
            ``costmodel.SELECTIVE_FRACTION``).
        outer_peak_table: Predicted peak bytes of every ``peak_table`` setting with the outer parts
            in ``reduced`` (:attr:`Levels.outer`), indexed as ``peak_table``; None in profiles
            written before the outer precision was a knob, which then model the outer parts in fp32
            (memory and time).
        outer_selective_peak_table: The same of every ``selective_peak_table`` setting (None: where
            ``outer_peak_table`` is given, a selective setting with the outer parts reduced is read
            from it without its band).

    Example:
        >>> from autotune.envs import shipped_profiles
        >>> profile = shipped_profiles()[0]
        >>> profile.workload, profile.model_state_bytes > profile.parameters_bytes
        ('gpt-tiny', True)
    """

    version: int
    workload: str
    machine: str
    reduced: Precision
    num_parameters: int
    batch_size: int
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    other_activation_per_sample: float
    temporaries_per_sample: float
    blocks: tuple[BlockCost, ...]
    step_fixed_seconds: float
    micro_fixed_seconds: float
    micro_seconds_per_sample: float
    blocks_fraction: float
    reduced_slowdown: float
    recompute_fraction: float
    curve_samples: tuple[float, ...]
    curve_loss: tuple[float, ...]
    curve_b_noise: tuple[float, ...]
    peak_table: tuple[int, ...] | None = None
    default_peak_bytes: int | None = None
    reduced_failure: str | None = None
    selective_peak_table: tuple[int, ...] | None = None
    selective_fraction: float | None = None
    outer_peak_table: tuple[int, ...] | None = None
    outer_selective_peak_table: tuple[int, ...] | None = None

    @property
    def model_state_bytes(self) -> int:
        """Parameters, gradients and optimizer state: the bytes ZeRO partitions."""
        return self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes

    def to_json(self) -> str:
        """The profile as JSON text (:func:`save_profile` writes it)."""
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadProfile:
        """The profile of :meth:`to_json`'s parsed text."""
        d = dict(data)
        d["blocks"] = tuple(BlockCost(**b) for b in d["blocks"])
        for key in ("curve_samples", "curve_loss", "curve_b_noise"):
            d[key] = tuple(d[key])
        for key in ("peak_table", "selective_peak_table", "outer_peak_table", "outer_selective_peak_table"):
            if d.get(key) is not None:
                d[key] = tuple(int(x) for x in d[key])
        if d.get("version", 1) > PROFILE_VERSION:
            raise ConfigError(f"profile version must be <= {PROFILE_VERSION}, but got {d['version']}.")
        d["version"] = PROFILE_VERSION  # version 1 only lacks the (optional) peak table
        return cls(**d)


def save_profile(profile: WorkloadProfile, path: Path) -> None:
    """Write ``profile`` to ``path`` as JSON (its folders created).

    Args:
        profile: The profile to write.
        path: The JSON file to write.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from autotune.envs import load_profile, save_profile, shipped_profiles
        >>> profile = shipped_profiles()[0]
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     save_profile(profile, Path(tmp) / "profiles" / "mine.json")
        ...     load_profile(Path(tmp) / "profiles" / "mine.json") == profile
        True
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.to_json())


def load_profile(path: Path) -> WorkloadProfile:
    """The profile :func:`save_profile` (or ``autotune profile``) wrote to ``path``.

    Args:
        path: The profile's JSON file.

    Returns:
        The profile, in the current format.

    Raises:
        ConfigError: the file is of a newer profile version than this build reads.

    Example:
        >>> from autotune.envs import PROFILE_DIR, load_profile
        >>> load_profile(sorted(PROFILE_DIR.glob("*.json"))[0]).version >= 1
        True
    """
    return WorkloadProfile.from_dict(json.loads(path.read_text()))


Progress = Callable[[str], None]


def calibrate(
    workload: Workload,
    *,
    reduced: Precision = "bf16",
    curve_steps: int = 60,
    timing_rounds: int = 8,
    progress: Progress | None = None,
    selective: bool = True,
    outer: bool = True,
) -> WorkloadProfile:
    """Measure ``workload`` on this machine (tens of seconds for the built-in workloads).

    Args:
        workload: The workload to measure.
        reduced: The reduced precision to measure beside fp32.
        curve_steps: Optimizer steps of the loss and gradient-noise curve.
        timing_rounds: Interleaved steps per timed configuration (their median is used); fewer is
            faster and noisier (gpt-tiny, 1 thread: 8 rounds took 21 s of a 45 s calibration).
        progress: Called with a line as each phase starts (None: silent).
        selective: Whether the memory table holds the selective recompute level; ``False`` leaves
            it out (two fake runs per mode and 800 predictions fewer): for a profile only the
            shipped policy acts on, which never moves the level.
        outer: Whether the memory table holds the reduced outer precision; ``False`` leaves it out
            (the reduced outer modes' fake runs and their predictions), and the profile then keeps
            the outer parts fp32.

    Returns:
        The workload's profile on this machine.

    Example:
        >>> from autotune import load_workload
        >>> from autotune.envs import SimulatedEnv, calibrate
        >>> profile = calibrate(load_workload("mlp-digits"))  # tens of seconds: the model timed on this machine
        >>> SimulatedEnv(profiles=[profile]).profiles[0].workload
        'mlp-digits'
    """
    say = progress or (lambda _: None)
    b0 = workload.batch_size
    b_small = max(1, b0 // 4)
    say("memory of the default configuration")
    default = _default_measured(workload, b0)
    assert default.memory is not None and default.category_peaks is not None
    say("per-block activation bytes")
    blocks, failure = _block_bytes(workload, reduced, b_small, b0)
    if failure is not None:
        say(f"{reduced} cannot run here ({failure}): an fp32-only profile")
    block_acts = sum(b.fp32_fixed + b0 * b.fp32_per_sample for b in blocks)
    say("per-block forward time")
    shares, block_fraction = _block_forward_shares(workload, b0)
    say("step times under six configurations")
    tiny_accum = min(4, b_small)  # several micro-batches of one sample: their cost dominates the step
    times = _step_times(workload, reduced, b0, b_small, tiny_accum, failure=failure, rounds=timing_rounds)
    step_fixed, micro_fixed, per_sample = _linear_time_terms(times, b0, b_small, tiny_accum)
    micro_default = max(micro_fixed + b0 * per_sample, 1e-9)
    slowdown, recompute = _block_time_ratios(times, block_fraction * micro_default, failure=failure)
    say("loss and gradient-noise curves")
    samples, losses, noise = _curves(workload, b0, curve_steps)
    _check_finite(workload, "loss", {f"step {i} of the loss curve": v for i, v in enumerate(losses)})
    timed = WorkloadProfile(
        version=PROFILE_VERSION,
        workload=workload.source or workload.name,
        machine=_machine_name(),
        reduced=reduced,
        num_parameters=workload.num_parameters,
        batch_size=b0,
        parameters_bytes=default.memory.parameters,
        gradients_bytes=default.category_peaks.gradients,
        optimizer_state_bytes=default.category_peaks.optimizer_state,
        other_activation_per_sample=max(default.category_peaks.activations - block_acts, 0.0) / b0,
        temporaries_per_sample=default.category_peaks.temporaries / b0,
        blocks=tuple(dataclasses.replace(b, time_share=s) for b, s in zip(blocks, shares, strict=True)),
        step_fixed_seconds=step_fixed,
        micro_fixed_seconds=micro_fixed,
        micro_seconds_per_sample=per_sample,
        blocks_fraction=block_fraction,
        reduced_slowdown=max(slowdown, 0.05),
        recompute_fraction=max(recompute, 0.0),
        curve_samples=samples,
        curve_loss=losses,
        curve_b_noise=noise,
        default_peak_bytes=default.memory.total,
        reduced_failure=failure,
    )
    return with_memory_tables(timed, workload, selective=selective, outer=outer, progress=progress)


def _default_measured(workload: Workload, b0: int) -> Measurement:
    """The default configuration measured once (its memory is the profile's).

    Raises:
        NonFiniteLossError: its loss is NaN or infinite.
        TrainingError: it failed (out of memory: no budget was given, so nothing else).
    """
    default = measure(workload, TrainConfig(micro_batch_size=b0), steps=1, warmup=1)
    if default.status == "diverged":
        raise NonFiniteLossError(f"{workload.name}: the default configuration's {default.reason}: nothing to calibrate")
    if not default.ok:  # out of memory: no budget was given, so nothing else
        raise TrainingError(f"{workload.name}: the default configuration failed: {default.reason}")
    return default


def _step_times(
    workload: Workload,
    reduced: Precision,
    b0: int,
    b_small: int,
    tiny_accum: int,
    *,
    failure: str | None,
    rounds: int,
) -> dict[str, float]:
    """:func:`calibrate`'s step times under six configurations (five where ``reduced`` cannot run),
    interleaved, each checked finite."""
    configs = {
        "small": TrainConfig(micro_batch_size=b_small),
        "default": TrainConfig(micro_batch_size=b0),
        "reduced": TrainConfig(micro_batch_size=b0, precision=reduced),
        "checkpoint": TrainConfig(micro_batch_size=b0, checkpoint=True),
        "accum": TrainConfig(micro_batch_size=b_small, grad_accum_steps=2),
        "tiny": TrainConfig(micro_batch_size=1, grad_accum_steps=tiny_accum),
    }
    if failure is not None:
        del configs["reduced"]
    times = interleaved_step_seconds(workload, configs, rounds=rounds)
    _check_finite(workload, "step time", {f"the {key!r} configuration": v for key, v in times.items()})
    return times


def _linear_time_terms(times: dict[str, float], b0: int, b_small: int, tiny_accum: int) -> tuple[float, float, float]:
    """The step's fixed seconds, each micro-batch's fixed seconds and its seconds per sample, from
    :func:`_step_times`'s fp32 configurations."""
    # Solve the linear time terms t = t_fixed + k * (t_mf + b * t_ps) from the four fp32 step
    # times (one more micro-batch of b_small, ``accum``, separates the per-step fixed cost) by
    # non-negative least squares on relative errors. The micro-batch-of-one point is measured, not
    # extrapolated: from b_small and b0 alone, noise set the per-micro-batch cost to 0 on a 4-block
    # GPT-2 (2 timing rounds), the simulator then read micro-batch 1 as free and the policy's plan
    # went to 1 x 32, measured far slower.
    fp32 = [(b_small, 1, "small"), (b0, 1, "default"), (b_small, 2, "accum"), (1, tiny_accum, "tiny")]
    rows = np.array([[1.0, k, k * b] for b, k, _ in fp32])
    step_fixed, micro_fixed, per_sample = (
        float(v) for v in relative_nnls(rows, np.array([times[key] for _, _, key in fp32]))
    )
    return step_fixed, micro_fixed, per_sample


def _block_time_ratios(times: dict[str, float], blocks_seconds: float, *, failure: str | None) -> tuple[float, float]:
    """The reduced precision's slowdown and the recompute's cost, each relative to the blocks' time
    (``blocks_seconds``: their share of the default's micro-batch time)."""
    # Precision and recompute change only block time, a fraction of the micro-batch time.
    block_time = max(blocks_seconds, 1e-9)
    # Unused where reduced precision cannot run: every such setting is infeasible.
    slowdown = 1.0 + (times["reduced"] - times["default"]) / block_time if failure is None else 1.0
    recompute = (times["checkpoint"] - times["default"]) / block_time
    return slowdown, recompute


def with_memory_tables(
    profile: WorkloadProfile,
    workload: Workload,
    *,
    selective: bool = True,
    outer: bool = True,
    progress: Progress | None = None,
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
        workload, reduced=reduced, reduced_runs=runs, selective=selective
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
            workload, reduced=reduced, reduced_runs=runs, selective=selective, outer=True
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
    modes; with ``reduced_runs=False`` every one of them is :data:`INFEASIBLE_PEAK`."""
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
    profile = profile_memory(workload, modes=modes, selective=selective, verify=False)
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
        into[index] = predict_memory(workload, config, profile=profile).total
    if not selective:
        return tuple(table), (), ()
    small, large = profile.micro_batch_sizes
    saves = profile.modes[modes[0]].blocks
    per_sample = tuple(
        max(b - a, 0) / (large - small) for a, b in zip(saves[0].selective, saves[1].selective, strict=True)
    )
    return tuple(table), tuple(banded), per_sample


def _block_bytes(workload: Workload, reduced: Precision, b1: int, b2: int) -> tuple[list[BlockCost], str | None]:
    """Each block's bytes, and why the model cannot run in ``reduced`` here (None: it can; then
    the reduced bytes are fp32's). A reduced forward that raises (not out of memory: that is the
    machine's size, not a missing kernel) is such a failure; the fp32 forward raising is the user's."""
    fp32 = _linear_fit(workload, "fp32", b1, b2)
    failure = None
    try:
        low = _linear_fit(workload, reduced, b1, b2)
    except Exception as e:
        if is_out_of_memory(e):
            raise
        failure, low = one_line(e), fp32
    inputs = _block_input_bytes(workload, b2)
    blocks = [
        BlockCost(
            name=name,
            fp32_fixed=fp32[i][0],
            fp32_per_sample=fp32[i][1],
            reduced_fixed=low[i][0],
            reduced_per_sample=low[i][1],
            input_per_sample=inputs[i] / b2,
            time_share=0.0,
        )
        for i, name in enumerate(workload.block_names())
    ]
    return blocks, failure


def _linear_fit(workload: Workload, precision: Precision, b1: int, b2: int) -> list[tuple[float, float]]:
    """Per block (fixed bytes, bytes per sample) from saved bytes at micro-batches b1 < b2."""
    y1 = profile_blocks(workload, micro_batch_size=b1, precision=precision).saved_bytes
    y2 = profile_blocks(workload, micro_batch_size=b2, precision=precision).saved_bytes
    if b2 <= b1:
        return [(0.0, y / b2) for y in y2]
    slopes = [(b - a) / (b2 - b1) for a, b in zip(y1, y2, strict=True)]
    return [(max(a - s * b1, 0.0), s) for a, s in zip(y1, slopes, strict=True)]


def _block_input_bytes(workload: Workload, micro: int) -> list[int]:
    model = copy.deepcopy(workload.model)
    names = workload.block_names()
    sizes = [0] * len(names)

    def hook(i: int) -> Any:
        def pre(module: torch.nn.Module, args: Any) -> None:
            sizes[i] = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))

        return pre

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(i)) for i, n in enumerate(names)]
    with torch.no_grad():
        workload.loss_fn(model, profile_batch(workload, micro))
    for h in handles:
        h.remove()
    return sizes


def _block_forward_shares(workload: Workload, micro: int, repeats: int = 3) -> tuple[list[float], float]:
    """Each block's share of all blocks' forward time, and all blocks' share of the whole forward."""
    model = copy.deepcopy(workload.model)
    names = workload.block_names()
    spent = [0.0] * len(names)
    starts = [0.0] * len(names)

    def hooks(i: int) -> tuple[Any, Any]:
        def pre(module: torch.nn.Module, args: Any) -> None:
            starts[i] = time.perf_counter()

        def post(module: torch.nn.Module, args: Any, out: Any) -> None:
            spent[i] += time.perf_counter() - starts[i]

        return pre, post

    handles = []
    for i, n in enumerate(names):
        pre, post = hooks(i)
        handles += [
            model.get_submodule(n).register_forward_pre_hook(pre),
            model.get_submodule(n).register_forward_hook(post),
        ]
    batch = profile_batch(workload, micro)
    total = 0.0
    with torch.no_grad():
        workload.loss_fn(model, batch)  # warm-up
        spent[:] = [0.0] * len(names)
        for _ in range(repeats):
            t0 = time.perf_counter()
            workload.loss_fn(model, batch)
            total += time.perf_counter() - t0
    for h in handles:
        h.remove()
    blocks_total = sum(spent) or 1.0
    return [s / blocks_total for s in spent], min(sum(spent) / max(total, 1e-12), 1.0)


def relative_nnls(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative ``theta`` minimizing sum(((rows @ theta) / seconds - 1) ** 2): the time terms
    that fit measured step times (``rows @ theta``: each row's predicted seconds) in relative
    error, so a short step weighs as much as a long one. Every active set of the (few) columns
    is tried: 2**n - 1 least-squares solves."""
    x = rows / seconds[:, None]
    y = np.ones(len(seconds))
    n = rows.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for active in itertools.chain.from_iterable(itertools.combinations(range(n), r) for r in range(1, n + 1)):
        cols = list(active)
        solution, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if np.any(solution < 0):
            continue
        theta = np.zeros(n)
        theta[cols] = solution
        residual = float(np.sum((x @ theta - y) ** 2))
        if best is None or residual < best[0]:
            best = (residual, theta)
    assert best is not None, "a single column with positive entries always has a non-negative solution"
    return best[1]


def interleaved_step_seconds(workload: Workload, configs: dict[str, TrainConfig], rounds: int = 8) -> dict[str, float]:
    """Median step time of each config, steps interleaved round-robin so that drift in a shared
    machine's speed hits every config alike (the differences between them are what we solve for)."""
    trainers = {key: Trainer(workload, cfg, track_noise=False) for key, cfg in configs.items()}
    try:
        for t in trainers.values():
            t.step()  # warm-up: kernel selection, optimizer state
        times: dict[str, list[float]] = {key: [] for key in trainers}
        for _ in range(rounds):
            for key, t in trainers.items():
                times[key].append(t.step().seconds)
        return {key: statistics.median(v) for key, v in times.items()}
    finally:
        for t in trainers.values():
            t.close()


def _curves(
    workload: Workload, micro: int, steps: int
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    trainer = Trainer(workload, TrainConfig(micro_batch_size=micro), gns_decay=0.9)
    samples, losses, noise = [], [], []
    seen = 0
    try:
        for _ in range(steps):
            r = trainer.step(split=trainer.noise_split)
            seen += r.samples
            b = trainer.gns.estimate().b_simple
            samples.append(float(seen))
            losses.append(r.loss)
            noise.append(float(b) if b is not None and b > 0 else float("nan"))
    finally:
        trainer.close()
    valid = [x for x in noise if x == x]
    fill = valid[0] if valid else float(micro)
    noise = [x if x == x else fill for x in noise]
    return tuple(samples), tuple(losses), tuple(noise)


def _check_finite(workload: Workload, what: str, values: dict[str, float]) -> None:
    """A simulator calibrated on a NaN or infinite loss or time would hand a policy NaN observations."""
    bad = next(((key, v) for key, v in values.items() if not np.isfinite(v)), None)
    if bad is None:
        return
    message = f"{workload.name}: the {what} is {bad[1]} at {bad[0]}: nothing to calibrate"
    if what == "loss":
        raise NonFiniteLossError(message)
    raise TrainingError(message)


def _machine_name() -> str:
    import platform

    threads = torch.get_num_threads()
    return f"{platform.machine()} {platform.processor() or 'cpu'} x{threads} threads, torch {torch.__version__}"
