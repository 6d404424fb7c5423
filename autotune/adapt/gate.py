"""The budget gate of adaptive runs: :mod:`autotune.memory.gate`'s, re-exported where it was.

The gate moved below ``search/`` and ``envs/`` so that the study and the environments admit
configurations by the same rule; ``autotune.adapt.BudgetGate`` and this module stay for
compatibility. :func:`as_budget` is what adaptive runs make of ``memory_budget=``.
"""

from __future__ import annotations

from autotune.memory.gate import BudgetGate, Verdict, admission, headroom_for, memory_profile, profile_or_reason
from autotune.units import DEFAULT_PEAK, MemoryBudget

__all__ = ["BudgetGate", "Verdict", "admission", "as_budget", "headroom_for", "memory_profile", "profile_or_reason"]


def as_budget(value: MemoryBudget | str | int | None) -> MemoryBudget:
    """What users pass as ``memory_budget`` (:meth:`MemoryBudget.parse`): None is the default's peak."""
    return MemoryBudget.parse(value, default=DEFAULT_PEAK)
