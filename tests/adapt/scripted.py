"""A decision source for tests: the given configs in turn, one per decision."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune import TrainConfig
from autotune.adapt import DecisionSource, Observation, Proposal


class Scripted(DecisionSource):
    """Proposes the given configs in turn, one per decision; its state is how many it proposed."""

    name = "scripted"

    def __init__(self, configs: list[TrainConfig]) -> None:
        self.configs = list(configs)
        self.proposed = 0

    def propose(self, observation: Observation) -> Proposal | None:
        if not self.configs:
            return None
        self.proposed += 1
        return Proposal(config=self.configs.pop(0), reason="scripted")

    def state_dict(self) -> dict[str, Any]:
        return {"proposed": self.proposed}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.proposed = state["proposed"]
        del self.configs[: self.proposed]
