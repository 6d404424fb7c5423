"""The study spec: what a study searches, read from TOML (``tomllib``) or built from CLI flags.

A spec names the workload, the memory budget, the search space and the sampler. Every field is
validated at construction, so a malformed spec fails before any storage is opened or written.
A TOML spec looks like::

    workload = "gpt-tiny"
    trials = 24
    memory_budget = "256MiB"   # or "75%" of the PyTorch default's predicted peak; a bare number is refused
    sampler = "tpe"
    policy_proposal = true     # enqueue the pretrained policy's proposal next to the two baselines
    retime = true              # re-time the best three side by side before recommending one
    objective = "per-gib"      # or "throughput": the most samples/s within the budget

    [space]
    batch_size = 32
    precisions = ["fp32", "bf16"]

    [space.blocks.0]          # optional per-block override: block 0 always fp32
    precision = "fp32"

    [measure]
    steps = 4
    warmup = 1
    trial_timeout = "5m"
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import tomllib

from autotune.errors import ConfigError, SpecError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective
from autotune.units import MemoryBudget

if TYPE_CHECKING:
    import optuna

__all__ = [
    "BlockOverride",
    "MeasureSpec",
    "SAMPLERS",
    "SamplerName",
    "SpaceSpec",
    "StudySpec",
    "load_spec",
    "objective_of",
    "parse_duration",
    "shipped_spec",
    "spec_from_dict",
    "spec_to_dict",
]

SamplerName = Literal["tpe", "nsga2", "gp", "random"]
SAMPLERS: tuple[str, ...] = get_args(SamplerName)
_PRECISIONS = ("fp32", "bf16", "fp16")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(s|m|h|)\s*$")
_DURATION_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str | float, *, name: str) -> float:
    """``"30m"`` -> 1800.0 seconds; a bare number is seconds."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        match = _DURATION.match(text) if isinstance(text, str) else None
        if match is None:
            raise SpecError(f"{name} must be a duration like 90, 90s, 30m or 2h, but got {text!r}.")
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise SpecError(f"{name} must be a positive duration, but got {text!r}.")
    return seconds


def _check_int(name: str, value: object, *, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{name} must be an int, but got {value!r}.")
    if value < low:
        raise SpecError(f"{name} must be >= {low}, but got {value!r}.")


def _check_int_tuple(name: str, value: object, *, low: int) -> None:
    if not isinstance(value, tuple) or not value:
        raise SpecError(f"{name} must be a non-empty list of ints, but got {value!r}.")
    for v in value:
        _check_int(f"{name} entries", v, low=low)
    if len(set(value)) != len(value):
        raise SpecError(f"{name} must not repeat a value, but got {list(value)!r}.")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise SpecError(f"{name} must be a positive number, but got {value!r}.")


def _tupled(obj: object, *names: str) -> None:
    """Lists from TOML become tuples, so specs stay hashable and immutable."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, list):
            object.__setattr__(obj, name, tuple(value))


@dataclass(frozen=True, kw_only=True)
class BlockOverride:
    """Pins one block's precision and/or checkpointing, whatever the sampled levels say."""

    precision: str | None = None
    checkpoint: bool | None = None

    def __post_init__(self) -> None:
        if self.precision is not None and self.precision not in _PRECISIONS:
            raise SpecError(f"precision must be one of {_PRECISIONS}, but got {self.precision!r}.")
        if self.checkpoint is not None and not isinstance(self.checkpoint, bool):
            raise SpecError(f"checkpoint must be a bool, but got {self.checkpoint!r}.")


@dataclass(frozen=True, kw_only=True)
class SpaceSpec:
    """The search space.

    Args:
        batch_size: The effective batch (micro-batch x accumulation x ranks); None: the workload's.
        batch_sizes: If given, the effective batch becomes a knob over these values, and throughput
            is compared as goodput (Pollux, OSDI'21).
        precisions: Precisions the low-precision level may use (``fp32`` is always allowed).
        ranks: Data-parallel rank counts to try. Any value > 1 adds the ZeRO stage to the space;
            it needs DeepSpeed (``pip install torch-autotune[zero]``): without it those trials fail cleanly.
        zero_stages: ZeRO stages to try when ranks > 1.
        blocks: Per-block overrides by block index (forward order).
        min_micro_batch: The smallest micro-batch the study may split a rank's batch into; None:
            the workload's (:attr:`autotune.Workload.micro_batch_floor`: 1, or no accumulation for
            a model with BatchNorm, whose statistics are the micro-batch's).
        expandable_segments: Measure on CUDA with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``:
            the caching allocator grows segments in place instead of caching blocks of fixed
            sizes, which cut torchtune's reserved memory from 16.4 to 10.8 GiB
            (pytorch/torchtune#1185). A setting of the whole study, not sampled per trial (the
            allocator is configured once per process); ``autotune best`` says the exported
            configuration assumes it. On the CPU there is no caching allocator: it has no effect
            and the search space is the same either way.
        selective: Whether the study may recompute blocks selectively (``selective_blocks``, the
            level between none and full: ``TrainConfig.checkpoint`` ``"selective"``). Off unless
            asked for: with it, the 12-trial study's pick was worse per GiB on every model measured
            (the median of three seeds 0.69-0.93x the pick without it; docs/benchmarks.md,
            "selective-study"), the level spreading the trials. Off also spares the memory
            model's profile two fake runs per mode. ``"refine"``: the level only where a trial is
            enqueued with it (the refinement's selective neighbours, the policy's proposal), never
            sampled: the sampler's trials are those of the study without the level, so the level
            cannot spread them.
    """

    batch_size: int | None = None
    batch_sizes: tuple[int, ...] | None = None
    precisions: tuple[str, ...] = ("fp32", "bf16")
    ranks: tuple[int, ...] = (1,)
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    blocks: Mapping[int, BlockOverride] = field(default_factory=dict)
    expandable_segments: bool = False
    min_micro_batch: int | None = None
    selective: bool | Literal["refine"] = False

    def __post_init__(self) -> None:
        _tupled(self, "batch_sizes", "precisions", "ranks", "zero_stages")
        if self.min_micro_batch is not None:
            _check_int("space.min_micro_batch", self.min_micro_batch, low=1)
        if not isinstance(self.expandable_segments, bool):
            raise SpecError(f"space.expandable_segments must be true or false, but got {self.expandable_segments!r}.")
        if not isinstance(self.selective, bool) and self.selective != "refine":
            raise SpecError(f'space.selective must be true, false or "refine", but got {self.selective!r}.')
        if self.batch_size is not None:
            _check_int("space.batch_size", self.batch_size, low=1)
        if self.batch_sizes is not None:
            _check_int_tuple("space.batch_sizes", self.batch_sizes, low=1)
        if not isinstance(self.precisions, tuple) or not self.precisions:
            raise SpecError(f"space.precisions must be a non-empty list, but got {self.precisions!r}.")
        for p in self.precisions:
            if p not in _PRECISIONS:
                raise SpecError(f"space.precisions entries must be one of {_PRECISIONS}, but got {p!r}.")
        _check_int_tuple("space.ranks", self.ranks, low=1)
        _check_int_tuple("space.zero_stages", self.zero_stages, low=0)
        if max(self.zero_stages) > 3:
            raise SpecError(f"space.zero_stages entries must be in [0, 3], but got {max(self.zero_stages)}.")
        for index, override in self.blocks.items():
            _check_int("space.blocks index", index, low=0)
            if not isinstance(override, BlockOverride):
                raise SpecError(f"space.blocks.{index} must be a table, but got {override!r}.")

    @property
    def effective_batch_sizes(self) -> tuple[int, ...] | None:
        """The candidate effective batches, or None for "the workload's own"."""
        if self.batch_sizes is not None:
            return tuple(sorted(self.batch_sizes))
        return None if self.batch_size is None else (self.batch_size,)


@dataclass(frozen=True, kw_only=True)
class MeasureSpec:
    """How each trial is measured: few steps (a study compares configs, it does not train), and a
    hard time limit per trial so that no configuration can hang the study."""

    steps: int = 4
    warmup: int = 1
    trial_timeout: float = 300.0
    threads: int | None = None

    def __post_init__(self) -> None:
        _check_int("measure.steps", self.steps, low=1)
        _check_int("measure.warmup", self.warmup, low=1)
        _check_positive("measure.trial_timeout", self.trial_timeout)
        if self.threads is not None:
            _check_int("measure.threads", self.threads, low=1)


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """A whole study. ``name`` None derives one from the workload (see :meth:`study_name`).

    ``policy_proposal``: enqueue the pretrained policy's proposal for this model
    (:func:`autotune.policies.transfer.propose`: a quick profile, seconds to tens of seconds,
    then one simulated episode) as a third baseline trial, named ``policy``.
    ``retime``: at the end, re-time the best few configurations side by side and recommend the
    winner (:mod:`autotune.search.finalists`; seconds to a minute); before the refinement, time
    the best few so far the same way, and start the refinement from the winner; during it, time
    each refinement trial beside the incumbent it was refined from (:mod:`autotune.search.refine`).
    ``objective``: which feasible trial is recommended, and what the refinement and the finalists'
    re-timing look for (:data:`autotune.measurement.objective.OBJECTIVES`): the most samples/s
    per GiB of peak (``"per-gib"``), or the most samples/s within the budget (``"throughput"``).
    The trials' values are the same either way (samples/s or goodput, and the peak).
    """

    workload: str
    name: str | None = None
    trials: int = 20
    memory_budget: MemoryBudget | None = None
    sampler: SamplerName = "tpe"
    seed: int = 0
    timeout: float | None = None
    policy_proposal: bool = True
    retime: bool = True
    objective: ObjectiveName = DEFAULT_OBJECTIVE
    space: SpaceSpec = field(default_factory=SpaceSpec)
    measure: MeasureSpec = field(default_factory=MeasureSpec)

    def __post_init__(self) -> None:
        if not isinstance(self.workload, str) or not self.workload:
            raise SpecError(f"workload must be a non-empty string, but got {self.workload!r}.")
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise SpecError(f"name must be a non-empty string, but got {self.name!r}.")
        _check_int("trials", self.trials, low=1)
        if self.memory_budget is not None and not isinstance(self.memory_budget, MemoryBudget):
            raise SpecError(f"memory_budget must be a MemoryBudget, but got {self.memory_budget!r}.")
        if self.sampler not in SAMPLERS:
            raise SpecError(f"sampler must be one of {SAMPLERS}, but got {self.sampler!r}.")
        _check_int("seed", self.seed, low=0)
        if self.timeout is not None:
            _check_positive("timeout", self.timeout)
        if not isinstance(self.policy_proposal, bool):
            raise SpecError(f"policy_proposal must be true or false, but got {self.policy_proposal!r}.")
        if not isinstance(self.retime, bool):
            raise SpecError(f"retime must be true or false, but got {self.retime!r}.")
        check_objective(self.objective, error=SpecError)
        if not isinstance(self.space, SpaceSpec):
            raise SpecError(f"space must be a table, but got {self.space!r}.")
        if not isinstance(self.measure, MeasureSpec):
            raise SpecError(f"measure must be a table, but got {self.measure!r}.")

    def study_name(self, workload_name: str) -> str:
        return self.name if self.name is not None else workload_name


def spec_to_dict(spec: StudySpec) -> dict[str, Any]:
    """Plain JSON-able data that :func:`spec_from_dict` reads back (stored on the study)."""
    data = asdict(spec)
    data["memory_budget"] = None if spec.memory_budget is None else str(spec.memory_budget)
    data["space"]["blocks"] = {
        str(i): {k: v for k, v in asdict(o).items() if v is not None} for i, o in spec.space.blocks.items()
    }
    if not spec.space.expandable_segments:
        # Off is the default: a study stored before the option existed has the same identity.
        del data["space"]["expandable_segments"]
    if spec.space.min_micro_batch is None:
        del data["space"]["min_micro_batch"]  # the same: the workload's rule, as before the option
    if not spec.space.selective:
        # Off is the default: a study stored before the level existed has the same identity.
        del data["space"]["selective"]
    if spec.objective == DEFAULT_OBJECTIVE:
        del data["objective"]  # the same: a study stored before the option was per GiB
    return {k: v for k, v in data.items() if v is not None}


def objective_of(study: optuna.Study) -> ObjectiveName:
    """The objective a study recommends by: its stored spec's (a study stored without one, or
    without a spec: the default, per GiB, all there was before the option)."""
    spec = study.user_attrs.get("spec")
    stored = spec.get("objective", DEFAULT_OBJECTIVE) if isinstance(spec, Mapping) else DEFAULT_OBJECTIVE
    return check_objective(stored, error=SpecError)


# ---- TOML ------------------------------------------------------------------------------------------

_TOP = {f.name for f in fields(StudySpec)} - {"space", "measure"}
_SPACE = {f.name for f in fields(SpaceSpec)}
_MEASURE = {f.name for f in fields(MeasureSpec)}
_BLOCK = {f.name for f in fields(BlockOverride)}


def shipped_spec(path: str | Path) -> Path | None:
    """The spec the package ships under ``path``'s file name, when ``path`` is one of the
    repository's ``studies/NAME.toml`` (or a bare ``NAME.toml``) and the package has it, else None.

    The package installs the repository's ``studies/*.toml`` as ``autotune.studies``, so a command
    written against the repository (``autotune study studies/gpt-tiny.toml``) also runs from any
    directory once the wheel is installed.
    """
    path = Path(path)
    if path.parent not in (Path(), Path("studies")):
        return None
    from importlib.resources import files

    shipped = files("autotune.studies").joinpath(path.name)
    return Path(str(shipped)) if shipped.is_file() else None


def load_spec(path: str | Path) -> StudySpec:
    """Read a TOML study spec; every error names the file and the key.

    A ``studies/NAME.toml`` that is not in the working directory is read from the specs the package
    ships (:func:`shipped_spec`), so the README's commands run from anywhere.
    """
    path = Path(path)
    if not path.exists():
        path = shipped_spec(path) or path
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read the study spec: {e.strerror}.") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}.") from None
    try:
        return spec_from_dict(data)
    except SpecError as e:
        raise SpecError(f"{path}: {e}") from None


def spec_from_dict(data: Mapping[str, Any]) -> StudySpec:
    """Build a spec from parsed TOML: unknown keys are refused, durations and sizes parsed."""
    _refuse_unknown(data, _TOP | {"space", "measure"}, prefix="")
    top = dict(data)
    if "memory_budget" in top:
        top["memory_budget"] = _memory_budget(top["memory_budget"])
    if "timeout" in top:
        top["timeout"] = parse_duration(top["timeout"], name="timeout")
    top["space"] = _space(_table(top.get("space", {}), "space"))
    top["measure"] = _measure(_table(top.get("measure", {}), "measure"))
    return StudySpec(**top)


def _memory_budget(value: object) -> MemoryBudget:
    # A TOML number is refused like a bare --memory-budget: 96 could mean bytes, MiB or a fraction.
    if not isinstance(value, str):
        raise SpecError(
            f'memory_budget must be a string with a unit such as "96MiB" or a percentage such as "75%", '
            f"but got {value!r}."
        )
    try:
        return MemoryBudget.parse(value, name="memory_budget")
    except ConfigError as e:
        raise SpecError(str(e)) from None


def _table(value: object, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(f"{name} must be a table, but got {value!r}.")
    return value


def _refuse_unknown(data: Mapping[str, Any], known: set[str], *, prefix: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise SpecError(f"unknown key {prefix + unknown[0]!r} (known keys: {', '.join(sorted(known))}).")


def _space(data: Mapping[str, Any]) -> SpaceSpec:
    _refuse_unknown(data, _SPACE, prefix="space.")
    space = dict(data)
    blocks: dict[int, BlockOverride] = {}
    for key, value in _table(space.get("blocks", {}), "space.blocks").items():
        if not key.isdecimal():
            raise SpecError(f"space.blocks keys must be block indices, but got {key!r}.")
        table = _table(value, f"space.blocks.{key}")
        _refuse_unknown(table, _BLOCK, prefix=f"space.blocks.{key}.")
        try:
            blocks[int(key)] = BlockOverride(**table)
        except SpecError as e:
            raise SpecError(f"space.blocks.{key}.{e}") from None
    space["blocks"] = blocks
    return SpaceSpec(**space)


def _measure(data: Mapping[str, Any]) -> MeasureSpec:
    _refuse_unknown(data, _MEASURE, prefix="measure.")
    measure = dict(data)
    if "trial_timeout" in measure:
        measure["trial_timeout"] = parse_duration(measure["trial_timeout"], name="measure.trial_timeout")
    return MeasureSpec(**measure)
