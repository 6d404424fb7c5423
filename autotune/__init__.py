"""autotune: measure and search PyTorch training configurations for throughput per unit of memory.

Importing ``autotune`` is cheap: torch and everything heavy load on first use of a name that
needs them (PEP 562 module ``__getattr__``), so the CLI's help and argument errors are instant.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._lazy import lazy_module_attributes
from autotune.errors import AutotuneError, ConfigError, TrainingError, UnsupportedError, WorkloadError

if TYPE_CHECKING:
    from autotune.adapt import Adaptive
    from autotune.config import TrainConfig
    from autotune.knobs import Knobs
    from autotune.measurement import Measurement, MemoryBreakdown, NoiseEstimate, RankResult
    from autotune.memory.model import MemoryEstimate
    from autotune.memory.predict import predict_memory
    from autotune.procs.measure import measure
    from autotune.resolve import load_workload
    from autotune.units import MemoryBudget
    from autotune.workload import Workload

__version__ = "0.1.0"

__all__ = [
    "Adaptive",
    "AutotuneError",
    "ConfigError",
    "Knobs",
    "Measurement",
    "MemoryBreakdown",
    "MemoryBudget",
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
    "Adaptive": "autotune.adapt",
    "TrainConfig": "autotune.config",
    "Knobs": "autotune.knobs",
    "Workload": "autotune.workload",
    "load_workload": "autotune.resolve",
    "Measurement": "autotune.measurement",
    "MemoryBreakdown": "autotune.measurement",
    "NoiseEstimate": "autotune.measurement",
    "RankResult": "autotune.measurement",
    "measure": "autotune.procs.measure",
    "MemoryEstimate": "autotune.memory.model",
    "predict_memory": "autotune.memory.predict",
    "MemoryBudget": "autotune.units",
}


__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
