"""Predicting memory before running: the per-block activation profile (``blocks``), the
fake-tensor profile (``profile``), the prediction model (``model``) and its check against one real
step (``check``).
"""

from autotune.memory.model import MemoryEstimate, budget_bytes, predict_memory

__all__ = ["MemoryEstimate", "budget_bytes", "predict_memory"]
