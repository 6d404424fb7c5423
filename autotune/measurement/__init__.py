"""What a configuration costs, measured on the real training loop: :func:`measure_local` (the
schedule in one process; :func:`autotune.measure` also runs it on DeepSpeed ranks),
exact memory by category, loss trend, goodput, the :class:`Measurement` record and the objective
(:func:`score`) every searcher maximizes.
"""

from autotune.measurement.goodput import statistical_efficiency
from autotune.measurement.objective import OBJECTIVES, ObjectiveName, Score, objective_value, per_gib, score
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.progress import ProgressFn
from autotune.measurement.record import GIB, Measurement, MemoryBreakdown, RankResult, Status
from autotune.measurement.schedule import measure_local
from autotune.measurement.trend import ema, loss_slope
from autotune.train.gns import NoiseEstimate

__all__ = [
    "GIB",
    "Measurement",
    "OBJECTIVES",
    "ObjectiveName",
    "MemoryBreakdown",
    "NoiseEstimate",
    "ProgressFn",
    "RankResult",
    "Score",
    "Status",
    "ema",
    "is_out_of_memory",
    "loss_slope",
    "measure_local",
    "objective_value",
    "per_gib",
    "score",
    "statistical_efficiency",
]
