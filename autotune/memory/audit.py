"""Audit the memory model on a workload: each prediction next to a real step of its configuration.

The promise an audit checks is the one the budget gate and the study rely on: *a prediction is
within* :data:`autotune.memory.check.TOLERANCE` *of a real step, or it is flagged unverified*.
It also checks the promise recompute makes: a recomputed step leaves the model's state (its
buffers: BatchNorm's running statistics, any buffer a forward updates) exactly as a plain step
does. ``tests/memory/test_property.py`` audits a fixed set of random architectures in CI;
``benchmarks/property_sweep.py`` audits hundreds.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from autotune.config import Precision, RecomputeLevel, TrainConfig
from autotune.memory.check import TOLERANCE

if TYPE_CHECKING:
    from collections.abc import Callable

    from autotune.measurement.record import Measurement
    from autotune.memory.profile_record import MemoryProfile
    from autotune.workload import Workload

__all__ = ["AuditRow", "audit_predictions", "draw_configs", "same_state_after_recompute"]


@dataclass(frozen=True, kw_only=True)
class AuditRow:
    """One configuration: predicted and measured peak bytes, and whether the promise held.

    ``holds``: the prediction is unverified, or within the tolerance of ``measured``; a real step
    that failed (``measured`` None) holds only if the prediction was unverified too.
    """

    config: TrainConfig
    predicted: int
    measured: int | None
    verified: bool
    kind: str | None

    @property
    def error(self) -> float | None:
        return None if self.measured is None else (self.predicted - self.measured) / self.measured

    @property
    def holds(self) -> bool:
        if not self.verified:
            return True
        return self.error is not None and abs(self.error) <= TOLERANCE


def draw_configs(
    num_blocks: int, rng: random.Random, count: int, *, precision: Precision = "bf16"
) -> list[TrainConfig]:
    """``count`` configurations of ``num_blocks`` blocks: micro-batch 2-8, accumulation 1-2, each
    block recomputed and in ``precision`` or not, drawn from ``rng`` (uniform and mixed alike)."""
    out = []
    for _ in range(count):
        uniform = rng.random() < 0.3
        ckpt = [rng.random() < 0.5] * num_blocks if uniform else [rng.random() < 0.5 for _ in range(num_blocks)]
        low = [rng.random() < 0.4] * num_blocks if uniform else [rng.random() < 0.4 for _ in range(num_blocks)]
        out.append(
            TrainConfig(
                micro_batch_size=rng.choice((2, 4, 8)),
                grad_accum_steps=rng.choice((1, 2)),
                checkpoint=tuple(ckpt),
                precision=tuple(precision if x else "fp32" for x in low),
            )
        )
    return out


def audit_predictions(
    workload: Workload,
    configs: list[TrainConfig],
    *,
    measure: Callable[..., Measurement],
    profile: MemoryProfile | None = None,
) -> list[AuditRow]:
    """Predict each of ``configs`` and measure one real step of it (after one untimed step).

    ``measure`` is :func:`autotune.measure` (passed in: it sits beside the memory model, in
    ``procs/``, and starts the ranks a ZeRO configuration needs). ``profile`` defaults to a
    verified profile with every mode the configs use. Cost: the profile, its check steps, and two
    real steps per configuration.
    """
    from autotune.memory.model import plan_of
    from autotune.memory.predict import predict_memory, profile_memory

    if profile is None:
        n = len(workload.block_names())
        modes = sorted({m for c in configs for m in plan_of(c, num_blocks=n).modes} | {"fp32"})
        profile = profile_memory(workload, modes=modes)
    rows = []
    for config in configs:
        estimate = predict_memory(workload, config, profile=profile)
        m = measure(workload, config, steps=1, warmup=1)
        measured = m.memory.total if m.status == "ok" and m.memory is not None else None
        kind = None if estimate.verification is None else estimate.verification.kind
        rows.append(
            AuditRow(config=config, predicted=estimate.total, measured=measured, verified=estimate.verified, kind=kind)
        )
    return rows


def same_state_after_recompute(workload: Workload, config: TrainConfig, *, seed: int = 0) -> bool:
    """Whether one forward/backward of a micro-batch under ``config``'s per-block knobs (its
    recompute, full or selective, in fp32) leaves every buffer of the model exactly as a plain one does."""
    from autotune.train.wrappers import apply_block_knobs
    from autotune.worst_case import profile_batch

    names = workload.block_names()
    levels = config.checkpoint_levels(len(names))
    batch = profile_batch(workload, config.micro_batch_size)
    states = []
    plain_levels: list[RecomputeLevel] = ["none"] * len(names)
    for ckpt in (plain_levels, list(levels)):
        model = workload.model_copy()
        wrappers = apply_block_knobs(model, names, ["fp32"] * len(names), ckpt, device_type="cpu")
        torch.manual_seed(seed)  # dropout draws the same masks in both runs
        try:
            workload.loss_fn(model, batch).backward()
        finally:
            wrappers.remove()
        states.append({k: v.detach().clone() for k, v in model.named_buffers()})
    plain, recomputed = states
    return plain.keys() == recomputed.keys() and all(torch.equal(plain[k], recomputed[k]) for k in plain)
