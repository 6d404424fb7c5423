"""A decision source for tests: the given configs in turn, one per decision."""

from __future__ import annotations

from autotune import TrainConfig
from autotune.adapt import DecisionSource, Observation, Proposal


class Scripted(DecisionSource):
    """Proposes the given configs in turn, one per decision."""

    name = "scripted"

    def __init__(self, configs: list[TrainConfig]) -> None:
        self.configs = list(configs)

    def propose(self, observation: Observation) -> Proposal | None:
        if not self.configs:
            return None
        return Proposal(config=self.configs.pop(0), reason="scripted")
