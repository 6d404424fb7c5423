"""What a configuration costs: memory by category, gradient noise, loss trend, the Measurement record.

The function that runs a config and fills these in is :func:`autotune.runner.measure`.
"""

from autotune.measurement.gns import GradientNoiseMonitor, NoiseEstimate
from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.record import GIB, Measurement, MemoryBreakdown, RankResult, Status
from autotune.measurement.trend import ema, loss_slope

__all__ = [
    "GIB",
    "GradientNoiseMonitor",
    "Measurement",
    "MemoryBreakdown",
    "NoiseEstimate",
    "RankResult",
    "Status",
    "ema",
    "is_out_of_memory",
    "loss_slope",
    "statistical_efficiency",
]
