"""Adaptive tuning inside the user's own training run.

:class:`Adaptive` trains the user's model and optimizer in place and keeps them at the best
configuration the decision source finds, within a memory budget every candidate is checked
against first. The Hugging Face and Lightning callbacks (:mod:`autotune.integrations`) apply
the same decisions inside those frameworks' loops.
"""

from autotune.adapt.adaptive import Adaptive, decision_source
from autotune.adapt.gate import BudgetGate, Verdict
from autotune.adapt.records import AdaptStep, Change
from autotune.adapt.sources import DecisionSource, FixedConfig, Observation, Proposal, RunContext

__all__ = [
    "AdaptStep",
    "Adaptive",
    "BudgetGate",
    "Change",
    "DecisionSource",
    "FixedConfig",
    "Observation",
    "Proposal",
    "RunContext",
    "Verdict",
    "decision_source",
]
