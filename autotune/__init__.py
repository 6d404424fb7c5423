"""autotune: measure and search PyTorch training configurations for throughput per unit of memory.

Importing ``autotune`` is cheap: torch and everything heavy load on first use of a name that
needs them (PEP 562 module ``__getattr__``), so the CLI's help and argument errors are instant.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError, ConfigError, TrainingError, UnsupportedError, WorkloadError

if TYPE_CHECKING:
    from autotune.config import TrainConfig
    from autotune.measurement import Measurement, MemoryBreakdown, NoiseEstimate, RankResult
    from autotune.memory_model import MemoryEstimate, predict_memory
    from autotune.runner import measure
    from autotune.workload import Workload, load_workload

__version__ = "0.1.0"

__all__ = [
    "AutotuneError",
    "ConfigError",
    "Measurement",
    "MemoryBreakdown",
    "MemoryEstimate",
    "NoiseEstimate",
    "RankResult",
    "TrainConfig",
    "TrainingError",
    "UnsupportedError",
    "Workload",
    "WorkloadError",
    "load_workload",
    "measure",
    "predict_memory",
]

_LAZY = {
    "TrainConfig": "autotune.config",
    "Workload": "autotune.workload",
    "load_workload": "autotune.workload",
    "Measurement": "autotune.measurement",
    "MemoryBreakdown": "autotune.measurement",
    "NoiseEstimate": "autotune.measurement",
    "RankResult": "autotune.measurement",
    "measure": "autotune.runner",
    "MemoryEstimate": "autotune.memory_model",
    "predict_memory": "autotune.memory_model",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
