"""What a configuration costs, measured on the real training loop: :func:`measure` (the schedule),
exact memory by category, loss trend, goodput and the :class:`Measurement` record.
"""

from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import GIB, Measurement, MemoryBreakdown, RankResult, Status
from autotune.measurement.schedule import measure
from autotune.measurement.trend import ema, loss_slope
from autotune.train.gns import NoiseEstimate

__all__ = [
    "GIB",
    "Measurement",
    "MemoryBreakdown",
    "NoiseEstimate",
    "ProgressFn",
    "RankResult",
    "Status",
    "ema",
    "is_out_of_memory",
    "loss_slope",
    "measure",
    "statistical_efficiency",
]
