"""The simulator's profile of one workload (:class:`WorkloadProfile`, its blocks' :class:`BlockCost`)
as plain JSON: what ``calibrate`` (:mod:`autotune.envs.calibration`) measured and the memory
model's tables (:mod:`autotune.envs.memory_tables`), saved and loaded without pickle."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import Precision
from autotune.errors import ConfigError

__all__ = ["INFEASIBLE_PEAK", "PROFILE_VERSION", "BlockCost", "WorkloadProfile", "load_profile", "save_profile"]

PROFILE_VERSION = 3
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
    micro_seconds_per_sample)``, its blocks' part scaled by precision (each term by its own
    factor) and recompute (``envs/costmodel.py``).

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
        reduced_slowdown: Reduced-precision block time over fp32 block time, per sample (above 1:
            slower).
        reduced_fixed_slowdown: The same of the blocks' per-micro-batch fixed time (kernel
            launches, Python, autocast's casts: on a GPU about 1 where the per-sample factor is
            0.25); None: ``reduced_slowdown`` (one factor for both, as profiles calibrated before
            version 3, synthetic ones and those whose fixed part is too small to time).
        recompute_fraction: The extra block time when recomputed, over the block time.
        curve_samples: The loss curve's samples seen, one per point.
        curve_loss: The loss curve's loss at each point.
        curve_b_noise: The gradient noise scale (samples) at each point.
        peak_table: Predicted peak bytes of every :class:`Levels` setting: index with
            :func:`peak_table_index`; None in profiles written before it.
        default_peak_bytes: Measured (tracked) peak bytes of the default configuration, which
            checks the table's prediction of it; None in profiles written before it was recorded.
        default_micro_batch: The micro-batch the default was measured at, where the whole batch
            in one micro-batch did not fit on the device (``calibrate(micro_batch=...)``); None:
            the whole batch.
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
    default_micro_batch: int | None = None
    reduced_failure: str | None = None
    selective_peak_table: tuple[int, ...] | None = None
    selective_fraction: float | None = None
    outer_peak_table: tuple[int, ...] | None = None
    outer_selective_peak_table: tuple[int, ...] | None = None
    reduced_fixed_slowdown: float | None = None

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
        # Version 1 lacks the (optional) peak table, version 2 the fixed time's own reduced factor.
        d["version"] = PROFILE_VERSION
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
