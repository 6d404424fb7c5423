"""Predicting memory before running: the per-block activation profile (``blocks``), the
fake-tensor profile (``profile``), the prediction model (``model``), its check against one real
step (``check``) and the entry points that combine them (``predict``).
"""

from autotune.memory.model import MemoryEstimate
from autotune.memory.predict import budget_bytes, predict_memory

__all__ = ["MemoryEstimate", "budget_bytes", "predict_memory"]
