"""Adaptive tuning inside the user's own training run.

:class:`Adaptive` trains the user's model and optimizer in place and keeps them at the best
configuration the decision source finds, within a memory budget every candidate is checked
against first. The Hugging Face and Lightning callbacks (:mod:`autotune.integrations`) apply
the same decisions inside those frameworks' loops.

Lazy (PEP 562), as the top-level package: ``autotune train --help`` must not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._lazy import lazy_module_attributes

if TYPE_CHECKING:
    from autotune.adapt.adaptive import Adaptive, decision_source
    from autotune.adapt.controller import Controller, FrontEnd
    from autotune.adapt.decider import Decider, SideBySide
    from autotune.adapt.records import AdaptStep, Change, OverBudgetStep
    from autotune.adapt.sources import DecisionSource, FixedConfig, Observation, Proposal, RunContext
    from autotune.memory.gate import BudgetGate, Verdict

__all__ = [
    "AdaptStep",
    "Adaptive",
    "BudgetGate",
    "Change",
    "Controller",
    "DecisionSource",
    "Decider",
    "FixedConfig",
    "FrontEnd",
    "Observation",
    "OverBudgetStep",
    "Proposal",
    "RunContext",
    "SideBySide",
    "Verdict",
    "decision_source",
]

_LAZY = {
    "Adaptive": "autotune.adapt.adaptive",
    "decision_source": "autotune.adapt.adaptive",
    "Controller": "autotune.adapt.controller",
    "FrontEnd": "autotune.adapt.controller",
    "Decider": "autotune.adapt.decider",
    "SideBySide": "autotune.adapt.decider",
    "BudgetGate": "autotune.memory.gate",
    "Verdict": "autotune.memory.gate",
    "AdaptStep": "autotune.adapt.records",
    "Change": "autotune.adapt.records",
    "OverBudgetStep": "autotune.adapt.records",
    "DecisionSource": "autotune.adapt.sources",
    "FixedConfig": "autotune.adapt.sources",
    "Observation": "autotune.adapt.sources",
    "Proposal": "autotune.adapt.sources",
    "RunContext": "autotune.adapt.sources",
}

__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
