"""Which decision source an adaptive run's ``policy=`` argument stands for, and what it may propose.

:class:`~autotune.Adaptive` and the framework callbacks (:mod:`autotune.integrations`) take the
same ``policy=`` argument (:data:`PolicyArg`): :func:`decision_source` turns it into the run's
source. :func:`selective_in_play` (whether that source may propose a selectively recomputed
block) and :func:`outer_in_play` (which outer precisions) live beside the sources
(:mod:`autotune.adapt.sources`) and stay importable from here.
"""

from __future__ import annotations

from pathlib import Path

from autotune.adapt.sources import DecisionSource, FixedConfig, outer_in_play, selective_in_play
from autotune.config import TrainConfig
from autotune.errors import ConfigError

__all__ = ["PolicyArg", "decision_source", "outer_in_play", "selective_in_play"]

PolicyArg = str | Path | TrainConfig | DecisionSource | None


def decision_source(policy: PolicyArg) -> DecisionSource | None:
    """The decision source an adaptive run's ``policy=`` argument stands for.

    Args:
        policy: ``"pretrained"`` (the shipped policy), a policy directory (``str`` or ``Path``), a
            :class:`~autotune.TrainConfig` (a :class:`FixedConfig` of it), a
            :class:`DecisionSource` (itself), or None.

    Returns:
        The source, or None: no decisions, the run stays where it starts.

    Raises:
        ConfigError: ``policy`` is none of these types.

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import decision_source
        >>> decision_source(TrainConfig(micro_batch_size=4)).name
        'fixed'
        >>> decision_source(None) is None
        True
    """
    if policy is None or isinstance(policy, DecisionSource):
        return policy
    if isinstance(policy, TrainConfig):
        return FixedConfig(policy)
    if isinstance(policy, (str, Path)):
        from autotune.adapt.policy_source import PolicySource

        return PolicySource(None if policy == "pretrained" else Path(policy))
    raise ConfigError(
        "policy must be 'pretrained', a policy directory, a TrainConfig, a DecisionSource or None, "
        f"but got {type(policy).__name__}."
    )
