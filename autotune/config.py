"""TrainConfig: the knobs autotune searches over, frozen and validated at construction.

One config describes *how* a workload is trained, not what it computes: micro-batch size and
accumulation (the effective batch), per-block precision and activation checkpointing, the ZeRO
stage and rank count, and the training hygiene that keeps runs at different effective batch
sizes comparable (linear LR scaling, warmup + cosine schedule, gradient clipping).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from autotune.errors import ConfigError

__all__ = [
    "COMPILE_MODES",
    "MEASURED_KEY",
    "PRECISIONS",
    "RECOMPUTE_LEVELS",
    "REDUCED_PRECISIONS",
    "Checkpoint",
    "CompileMode",
    "Precision",
    "RecomputeLevel",
    "TrainConfig",
    "recompute_level",
]

#: The key of ``autotune best --format json`` holding what the study measured for the
#: configuration (its trial's figures, re-timed side by side too); :meth:`TrainConfig.from_json`
#: reads past it, so the file stays a ``--config``.
MEASURED_KEY = "measured"

Precision = Literal["fp32", "bf16", "fp16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: The autocast precisions (every precision but fp32).
REDUCED_PRECISIONS: tuple[Precision, ...] = ("bf16", "fp16")
#: What a block keeps for backward: everything it saves (``none``), only the outputs of its
#: matmul-like operations and its input (``selective``, the rest recomputed), or only its input
#: (``full``, the whole block recomputed).
RecomputeLevel = Literal["none", "selective", "full"]
RECOMPUTE_LEVELS: tuple[RecomputeLevel, ...] = get_args(RecomputeLevel)
#: One block's entry of ``TrainConfig.checkpoint``: ``False`` (none), ``True`` (full) or ``"selective"``.
Checkpoint = bool | Literal["selective"]
_LEVEL_OF: dict[object, RecomputeLevel] = {False: "none", True: "full", "selective": "selective"}
LrScaling = Literal["linear", "sqrt", "none"]
LrSchedule = Literal["constant", "cosine"]
#: ``torch.compile`` of the model: off, its default mode, or ``max-autotune`` (longer compile,
#: kernels chosen by timing them).
CompileMode = Literal["none", "default", "max-autotune"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """A training configuration.

    Args:
        micro_batch_size: Samples per forward/backward pass on one rank.
        grad_accum_steps: Micro-batches accumulated per optimizer step.
        ranks: Data-parallel ranks. Effective batch = micro_batch_size x grad_accum_steps x ranks.
        precision: Autocast dtype of each block: one value for every block, or a tuple with one
            entry per block (in the workload's block order). Under an fp32 ``outer_precision`` each
            reduced block is an island (its outputs cast back to fp32); under a reduced one the
            blocks are its exceptions. Any fp16 block turns on dynamic loss scaling.
        outer_precision: Autocast dtype of everything outside the blocks: the model's forward
            and the loss run under ``torch.autocast`` in it (as Hugging Face's ``bf16=True``
            does for the whole model); ``fp32`` (the default) runs them without autocast. Under a
            reduced outer precision an fp32 block runs with autocast disabled, and every block
            must be fp32 or this same precision: one autocast dtype per step (fp16 and bf16 hold
            the same bytes, and a DeepSpeed engine has one precision). fp16 turns on dynamic loss
            scaling.
        checkpoint: Activation recompute of each block, one value for every block or a tuple with
            one entry per block: ``False`` keeps what the block saves, ``True`` checkpoints the
            whole block (only its input is kept, everything recomputed in backward) and
            ``"selective"`` keeps its input and the outputs of its matmul-like operations (matmuls,
            attention, convolutions) and recomputes the rest (norms, activations, elementwise:
            cheap to recompute, as torchtitan's per-operation default). The field stays a bool
            where it was one, so every configuration and JSON written before the third level
            still reads the same; :meth:`checkpoint_levels` names the three levels.
        zero_stage: DeepSpeed ZeRO stage 0-3 (0 = plain data parallel / single process).
        lr_scaling: How the workload's base learning rate scales with the effective batch B:
            ``linear`` eta = eta_base * B / B_base (Goyal et al. 2017), ``sqrt`` eta_base *
            sqrt(B / B_base) (Krizhevsky 2014, for adaptive optimizers), ``none``.
        lr_warmup_steps: Optimizer steps of linear warmup from 0 (Goyal et al. 2017: large
            effective batches need it).
        lr_schedule: ``constant`` after warmup, or ``cosine`` decay to ``lr_min_ratio`` of the peak
            over ``lr_decay_steps`` optimizer steps.
        lr_decay_steps: Length of the cosine decay (required for ``cosine``).
        lr_min_ratio: Final LR as a fraction of the peak LR for ``cosine``.
        grad_clip: Max global gradient norm (None: no clipping).
        seed: Seed of data order and any randomness in the loop.
        compile: ``torch.compile`` the model once per configuration (``default`` or
            ``max-autotune`` mode), or not (``none``). One process only: DeepSpeed compiles its
            engine itself (``engine.compile()``), which autotune does not drive. A change of the
            per-block knobs under compile changes the forward Dynamo traced, so the next step
            recompiles.

    Raises:
        ConfigError: a knob out of its range, or knobs that contradict each other, with the rule
            and the value received.

    Example:
        >>> from autotune import TrainConfig
        >>> config = TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision=("bf16", "fp32", "bf16", "fp32"),
        ...                      checkpoint=True)
        >>> config.effective_batch_size
        32
        >>> config.describe()
        'micro x acc x ranks 8x4x1 | bf16 2/4 | ckpt all | ZeRO 0'
        >>> TrainConfig.from_json(config.to_json()) == config
        True
    """

    micro_batch_size: int = 8
    grad_accum_steps: int = 1
    ranks: int = 1
    precision: Precision | tuple[Precision, ...] = "fp32"
    outer_precision: Precision = "fp32"
    checkpoint: Checkpoint | tuple[Checkpoint, ...] = False
    zero_stage: int = 0
    lr_scaling: LrScaling = "linear"
    lr_warmup_steps: int = 0
    lr_schedule: LrSchedule = "constant"
    lr_decay_steps: int | None = None
    lr_min_ratio: float = 0.1
    grad_clip: float | None = 1.0
    seed: int = 0
    compile: CompileMode = "none"

    def __post_init__(self) -> None:
        _check_int("micro_batch_size", self.micro_batch_size, low=1)
        _check_int("grad_accum_steps", self.grad_accum_steps, low=1)
        _check_int("ranks", self.ranks, low=1)
        _check_int("zero_stage", self.zero_stage, low=0, high=3)
        _check_int("lr_warmup_steps", self.lr_warmup_steps, low=0)
        _check_int("seed", self.seed, low=0)
        if isinstance(self.precision, (list, tuple)):
            object.__setattr__(self, "precision", tuple(self.precision))
            if len(self.precision) == 0:
                raise ConfigError("TrainConfig.precision must have at least one entry, but got ().")
        for p in _as_tuple(self.precision):
            if p not in PRECISIONS:
                raise ConfigError(f"TrainConfig.precision must be one of {PRECISIONS}, but got {p!r}.")
        if self.outer_precision not in PRECISIONS:
            raise ConfigError(
                f"TrainConfig.outer_precision must be one of {PRECISIONS}, but got {self.outer_precision!r}."
            )
        if self.outer_precision != "fp32":
            other = next((p for p in _as_tuple(self.precision) if p not in ("fp32", self.outer_precision)), None)
            if other is not None:
                raise ConfigError(
                    f"TrainConfig.precision must be fp32 or the outer precision {self.outer_precision!r} on every "
                    f"block when outer_precision is reduced, but got {other!r}."
                )
        if isinstance(self.checkpoint, (list, tuple)):
            object.__setattr__(self, "checkpoint", tuple(self.checkpoint))
            if len(self.checkpoint) == 0:
                raise ConfigError("TrainConfig.checkpoint must have at least one entry, but got ().")
        for c in _as_tuple(self.checkpoint):
            if not isinstance(c, bool) and c != "selective":
                raise ConfigError(f"TrainConfig.checkpoint entries must be True, False or 'selective', but got {c!r}.")
        if self.lr_scaling not in get_args(LrScaling):
            raise ConfigError(
                f"TrainConfig.lr_scaling must be one of {get_args(LrScaling)}, but got {self.lr_scaling!r}."
            )
        if self.lr_schedule not in get_args(LrSchedule):
            raise ConfigError(
                f"TrainConfig.lr_schedule must be one of {get_args(LrSchedule)}, but got {self.lr_schedule!r}."
            )
        if self.lr_schedule == "cosine" and self.lr_decay_steps is None:
            raise ConfigError("TrainConfig.lr_decay_steps is required when lr_schedule='cosine', but got None.")
        if self.lr_decay_steps is not None:
            _check_int("lr_decay_steps", self.lr_decay_steps, low=1)
        if not isinstance(self.lr_min_ratio, (int, float)) or not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ConfigError(f"TrainConfig.lr_min_ratio must be in [0, 1], but got {self.lr_min_ratio!r}.")
        if self.grad_clip is not None and (
            not isinstance(self.grad_clip, (int, float)) or not math.isfinite(self.grad_clip) or self.grad_clip <= 0
        ):
            raise ConfigError(f"TrainConfig.grad_clip must be a finite number > 0 or None, but got {self.grad_clip!r}.")
        if self.compile not in COMPILE_MODES:
            raise ConfigError(f"TrainConfig.compile must be one of {COMPILE_MODES}, but got {self.compile!r}.")
        if self.compile != "none" and self.on_deepspeed:
            raise ConfigError(
                f"TrainConfig.compile must be 'none' on DeepSpeed ranks (zero_stage > 0 or ranks > 1), but got "
                f"{self.compile!r} with zero_stage={self.zero_stage}, ranks={self.ranks}."
            )

    # ---- derived values -------------------------------------------------------------------------

    @property
    def effective_batch_size(self) -> int:
        """Samples per optimizer step: ``micro_batch_size x grad_accum_steps x ranks``."""
        return self.micro_batch_size * self.grad_accum_steps * self.ranks

    def block_precisions(self, num_blocks: int) -> tuple[Precision, ...]:
        """Per-block precision for a model with ``num_blocks`` blocks."""
        return _broadcast("precision", self.precision, num_blocks)

    def block_checkpoints(self, num_blocks: int) -> tuple[bool, ...]:
        """Per block of a model with ``num_blocks`` blocks, whether it is recomputed whole
        (``checkpoint`` True): a selective block is not (see :meth:`checkpoint_levels`)."""
        return tuple(level == "full" for level in self.checkpoint_levels(num_blocks))

    def checkpoint_levels(self, num_blocks: int) -> tuple[RecomputeLevel, ...]:
        """Per-block recompute level (``none``, ``selective``, ``full``) for ``num_blocks`` blocks.

        Example:
            >>> from autotune import TrainConfig
            >>> TrainConfig(checkpoint=(True, "selective", False)).checkpoint_levels(3)
            ('full', 'selective', 'none')
        """
        return tuple(recompute_level(c) for c in _broadcast("checkpoint", self.checkpoint, num_blocks))

    @property
    def on_deepspeed(self) -> bool:
        """Whether it trains on DeepSpeed ranks (ZeRO at any stage, or data parallel), not in one process."""
        return self.zero_stage > 0 or self.ranks > 1

    @property
    def uses_fp16(self) -> bool:
        """Whether any block, or the outer part, runs in fp16 (the loop then scales the loss dynamically)."""
        return "fp16" in _as_tuple(self.precision) or self.outer_precision == "fp16"

    def lr_multiplier(self, base_batch_size: int) -> float:
        """Factor on the base learning rate from the effective batch (see ``lr_scaling``)."""
        ratio = self.effective_batch_size / base_batch_size
        if self.lr_scaling == "linear":
            return ratio
        if self.lr_scaling == "sqrt":
            return math.sqrt(ratio)
        return 1.0

    def lr_factor(self, step: int) -> float:
        """Schedule factor (0..1] at optimizer step ``step`` (0-based): warmup, then constant or cosine."""
        if step < self.lr_warmup_steps:
            return (step + 1) / self.lr_warmup_steps
        if self.lr_schedule == "constant":
            return 1.0
        assert self.lr_decay_steps is not None  # validated in __post_init__
        t = min(1.0, (step - self.lr_warmup_steps) / self.lr_decay_steps)
        return self.lr_min_ratio + (1.0 - self.lr_min_ratio) * 0.5 * (1.0 + math.cos(math.pi * t))

    # ---- serialization ----------------------------------------------------------------------------

    def knob_cells(self) -> tuple[str, str, str, str]:
        """(micro x accum x ranks, precision, checkpointed blocks, ZeRO stage), short, for tables; the
        precision cell names a reduced outer precision (``bf16, outer bf16``)."""
        precisions = self.precision if isinstance(self.precision, tuple) else None
        checkpoints = self.checkpoint if isinstance(self.checkpoint, tuple) else None
        if precisions is None:
            prec = str(self.precision)
        else:
            low = [p for p in precisions if p != "fp32"]
            prec = f"{low[0] if low else 'fp32'} {len(low)}/{len(precisions)}"
        if self.outer_precision != "fp32":
            prec += f", outer {self.outer_precision}"
        if checkpoints is None:
            ckpt = {False: "none", True: "all", "selective": "sel all"}[self.checkpoint]
        else:
            n, full = len(checkpoints), sum(c is True for c in checkpoints)
            selective = sum(c == "selective" for c in checkpoints)
            ckpt = f"{full}/{n}" + (f" + sel {selective}/{n}" if selective else "")
        return f"{self.micro_batch_size}x{self.grad_accum_steps}x{self.ranks}", prec, ckpt, str(self.zero_stage)

    def describe(self) -> str:
        """One line: ``micro x acc x ranks 8x4x1 | bf16 6/6 | ckpt 3/6 | ZeRO 0`` (selective blocks
        after the fully recomputed ones: ``ckpt 2/4 + sel 1/4``, every block ``ckpt sel all``), and
        ``| compile default`` when the model is compiled."""
        batch, prec, ckpt, zero = self.knob_cells()
        line = f"micro x acc x ranks {batch} | {prec} | ckpt {ckpt} | ZeRO {zero}"
        return line if self.compile == "none" else f"{line} | compile {self.compile}"

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain JSON values (per-block tuples as lists); ``outer_precision`` only when
        reduced and ``compile`` only when on, so a configuration without them writes the JSON it
        wrote before those knobs existed."""
        d = asdict(self)
        if d["outer_precision"] == "fp32":
            del d["outer_precision"]
        if d["compile"] == "none":
            del d["compile"]
        for key in ("precision", "checkpoint"):
            if isinstance(d[key], tuple):
                d[key] = list(d[key])
        return d

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON: what ``--config`` files hold."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        """The configuration :meth:`to_dict` wrote.

        Args:
            data: Field names to values; a missing field takes its default.

        Returns:
            The configuration, validated.

        Raises:
            ConfigError: an unknown field, or a value that breaks a rule.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"TrainConfig has no field {unknown[0]!r} (known fields: {', '.join(sorted(known))}).")
        return cls(**dict(data))

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """The configuration :meth:`to_json` wrote, or ``autotune best --format json`` (its
        ``measured`` figures are skipped).

        Args:
            text: The JSON text of one object.

        Returns:
            The configuration, validated.

        Raises:
            ConfigError: text that is not a JSON object, an unknown field, or a value that breaks a rule.
        """
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"TrainConfig JSON is not valid JSON: {e}.") from None
        if not isinstance(data, dict):
            raise ConfigError(f"TrainConfig JSON must be an object, but got {type(data).__name__}.")
        data.pop(MEASURED_KEY, None)  # ``autotune best --format json``'s figures: not configuration
        return cls.from_dict(data)


def recompute_level(checkpoint: Checkpoint) -> RecomputeLevel:
    """The level of one block's ``TrainConfig.checkpoint`` entry: False ``none``, True ``full``,
    ``"selective"`` itself."""
    return _LEVEL_OF[checkpoint]


def _check_int(name: str, value: object, *, low: int, high: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"TrainConfig.{name} must be an int, but got {value!r}.")
    if value < low or (high is not None and value > high):
        rule = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"TrainConfig.{name} must be {rule}, but got {value!r}.")


def _as_tuple(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def _broadcast(name: str, value: Any, n: int) -> tuple[Any, ...]:
    if not isinstance(value, tuple):
        return (value,) * n
    if len(value) != n:
        raise ConfigError(
            f"TrainConfig.{name} must have one entry per block ({n} blocks), but got {len(value)} entries."
        )
    return value
