"""What a loop tells the adaptive controller about itself: the hooks where the loops differ.

:class:`autotune.Adaptive`'s own loop and the framework callbacks (:mod:`autotune.integrations`)
each give :class:`~autotune.adapt.controller.Controller` one :class:`FrontEnd`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from autotune.adapt.records import Change
    from autotune.config import TrainConfig
    from autotune.measurement.cuda_memory import AllocatorStats

__all__ = ["FrontEnd"]


class FrontEnd(Protocol):
    """What a loop tells the controller about itself: the hooks where the loops differ.

    Attributes:
        paired: The loop can switch configuration every step cheaply (the local loop): a
            proposal is then measured side by side with the configuration it replaced.
        splits_now: The loop can take another micro-batch x accumulation before its first step
            (the start search may use smaller micro-batches).
    """

    paired: bool
    splits_now: bool

    def takes(self, current: TrainConfig, proposed: TrainConfig) -> TrainConfig:
        """What of ``proposed`` the loop can run from ``current`` (``current`` if nothing)."""
        ...

    def apply(self, change: Change) -> Change | None:
        """Make ``change`` now and return it (its reason may say what it cost), or None: it waits
        for the loop (a split at the next epoch boundary), which reports it later with
        :meth:`Controller.made`. Before the loop's first step it only sets where it starts."""
        ...

    def b_noise(self) -> float | None:
        """The gradient noise scale at a decision, where the loop estimates it."""
        ...

    def run_stats(self) -> AllocatorStats | None:
        """The caching allocator's statistics of the run so far, read at each decision (None:
        none, or the peaks are measured step by step)."""
        ...
