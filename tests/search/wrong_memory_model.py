"""A stand-in for ``autotune.memory.predict``: the real profile and plan, every prediction twice the
real model's (a memory model deliberately off by +100%, for the study's checks by its trials)."""

from __future__ import annotations

from dataclasses import dataclass

from autotune.config import TrainConfig
from autotune.memory import predict
from autotune.memory.check import Verification
from autotune.memory.predict import plan_of
from autotune.memory.profile import MemoryProfile
from autotune.workload import Workload

__all__ = ["plan_of", "predict_memory"]


@dataclass(frozen=True)
class Doubled:
    total: int
    verified: bool
    verification: Verification | None


def predict_memory(
    workload: Workload, config: TrainConfig, *, profile: MemoryProfile, device_type: str = "cpu"
) -> Doubled:
    real = predict.predict_memory(workload, config, profile=profile, device_type=device_type)
    return Doubled(total=2 * real.total, verified=real.verified, verification=real.verification)
