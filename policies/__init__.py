"""PPO agents and the shipped pretrained policy (``autotune.policies``): see README.md here.

The public API is :func:`load_policy` and :class:`Policy` (a policy directory, the shipped one by
default: :data:`PRETRAINED_DIR`), and ``autotune.policies.tune``'s :func:`~autotune.policies.tune.tune`
(what ``autotune tune`` runs) and :class:`~autotune.policies.tune.Tuned` (what it returns): a
function named as its module cannot be re-exported here (importing the module rebinds the name).
Lazy (PEP 562), as the top-level package: these load torch and stable-baselines3.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._lazy import lazy_module_attributes

if TYPE_CHECKING:
    from autotune.policies.ppo import PRETRAINED_DIR, Policy, load_policy

__all__ = ["PRETRAINED_DIR", "Policy", "load_policy"]

_LAZY = {
    "PRETRAINED_DIR": "autotune.policies.ppo",
    "Policy": "autotune.policies.ppo",
    "load_policy": "autotune.policies.ppo",
}

__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
