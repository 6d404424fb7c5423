"""Which decision source an adaptive run's ``policy=`` argument stands for, and what it may propose.

:class:`~autotune.Adaptive` and the framework callbacks (:mod:`autotune.integrations`) take the
same ``policy=`` argument (:data:`PolicyArg`): :func:`decision_source` turns it into the run's
source, and :func:`selective_in_play` says whether that source may propose a selectively
recomputed block (the budget gate's profile then holds the selective runs).
"""

from __future__ import annotations

from pathlib import Path

from autotune.adapt.sources import DecisionSource, FixedConfig
from autotune.config import TrainConfig
from autotune.errors import ConfigError

__all__ = ["PolicyArg", "decision_source", "selective_in_play"]

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


def selective_in_play(source: DecisionSource | None, default: TrainConfig, num_blocks: int) -> bool:
    """Whether a run may train a selectively recomputed block, so that its budget gate's memory
    profile must hold the selective runs (two more fake runs per mode; without them a selective
    configuration has no prediction and is measured before it counts).

    Args:
        source: The run's decision source (None: it stays on ``default``).
        default: The run's own configuration.
        num_blocks: The model's blocks.

    Returns:
        True where ``default`` has a selective block, where ``source`` is a fixed configuration
        with one, for the policy (its actions, its neighbours and its start plan move the
        level), and for a source of the user's own (it may propose anything); False without a
        source or for a fixed configuration without one.

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.adapt import decision_source
        >>> plain = TrainConfig(micro_batch_size=4)
        >>> selective_in_play(decision_source(plain), plain, 2)
        False
        >>> selective_in_play(decision_source(TrainConfig(micro_batch_size=4, checkpoint="selective")), plain, 2)
        True
    """
    if "selective" in default.checkpoint_levels(num_blocks):
        return True
    if source is None:
        return False
    if isinstance(source, FixedConfig):
        return "selective" in source.config.checkpoint_levels(num_blocks)
    # The policy's action space has the selective level (its sixth entry) and its neighbours and
    # plan move it: without the selective runs the gate would refuse each such proposal unpredicted.
    return True
