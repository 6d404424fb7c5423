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
    from autotune.adapt.adaptive import Adaptive
    from autotune.adapt.controller import Controller as Controller  # internals: by name, not in __all__
    from autotune.adapt.decider import Decider as Decider
    from autotune.adapt.frontend import FrontEnd as FrontEnd
    from autotune.adapt.policy_source import PolicySource
    from autotune.adapt.records import AdaptStep, Change, OverBudgetStep
    from autotune.adapt.side_by_side import SideBySide as SideBySide
    from autotune.adapt.source_choice import decision_source
    from autotune.adapt.sources import DecisionSource, FixedConfig, Observation, Proposal, RunContext
    from autotune.memory.gate import BudgetGate as BudgetGate
    from autotune.memory.gate import Verdict as Verdict

# The public API (docs/api.md): what a user of Adaptive, a callback or a decision source of their
# own meets. The controller, its decider and the budget gate stay importable from here by name (the
# framework callbacks and the tests use them) but are internals: docs/architecture.md describes them.
__all__ = [
    "AdaptStep",
    "Adaptive",
    "Change",
    "DecisionSource",
    "FixedConfig",
    "Observation",
    "OverBudgetStep",
    "PolicySource",
    "Proposal",
    "RunContext",
    "decision_source",
]

_LAZY = {
    "Adaptive": "autotune.adapt.adaptive",
    "decision_source": "autotune.adapt.source_choice",
    "Controller": "autotune.adapt.controller",
    "FrontEnd": "autotune.adapt.frontend",
    "Decider": "autotune.adapt.decider",
    "SideBySide": "autotune.adapt.side_by_side",
    "BudgetGate": "autotune.memory.gate",
    "Verdict": "autotune.memory.gate",
    "AdaptStep": "autotune.adapt.records",
    "Change": "autotune.adapt.records",
    "OverBudgetStep": "autotune.adapt.records",
    "DecisionSource": "autotune.adapt.sources",
    "FixedConfig": "autotune.adapt.sources",
    "PolicySource": "autotune.adapt.policy_source",
    "Observation": "autotune.adapt.sources",
    "Proposal": "autotune.adapt.sources",
    "RunContext": "autotune.adapt.sources",
}

__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
