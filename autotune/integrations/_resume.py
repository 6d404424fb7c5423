"""A framework loop's state across a resumed fit: saved as plain values, restored at its start."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.adapt.saved import check_saved_batch, check_saved_model
from autotune.config import TrainConfig
from autotune.errors import ConfigError
from autotune.integrations._knobs import LoopKnobs

__all__ = ["Resume"]

# Of FrameworkLoop.state_dict(): a change to its keys bumps it (2: evaluation_peak; 3: the model's
# fingerprint, so a state is never applied to another model).
_STATE_VERSION = 3


class Resume(LoopKnobs):
    """:class:`~autotune.integrations._framework.FrameworkLoop`'s ``state_dict`` /
    ``load_state_dict`` (a mixin over :class:`~autotune.integrations._loop_state.LoopState`)."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs, as plain values: the configuration on the model, every decision
        and measurement, the source's state and the recent losses (a split change still waiting
        for its epoch boundary is decided again). Before :meth:`begin`: the state it will restore."""
        if self.controller is None:
            return dict(self._resume or {})
        return {
            "version": _STATE_VERSION,
            "config": self.controller.config.to_dict(),
            "evaluation_peak": self.evaluation_peak,
            "model": dict(self._model_id),
            **self.controller.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` at :meth:`begin` (the framework restores callbacks before the
        model and its loop are known to them)."""
        if state.get("version") not in (1, 2, _STATE_VERSION):  # 1: no evaluation peak; 2: no model's
            raise ConfigError(
                f"AutotuneCallback state must be version 1, 2 or {_STATE_VERSION}, but got {state.get('version')!r}."
            )
        self._resume = dict(state)
        self.evaluation_peak = state.get("evaluation_peak")

    def _restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state``: its per-block knobs on the model (the split is the loop's, as it
        restarted), if this run's budget gate admits them; nothing measured is explored again."""
        assert self.controller is not None
        check_saved_model(
            state.get("model"),
            self._model_id,
            state="AutotuneCallback",
            run="fit",
            fix="resume it with the model it was saved from",
        )
        here = self.controller.config
        saved = TrainConfig.from_dict(state["config"])
        check_saved_batch(
            saved,
            here,
            adapt_batch=False,
            state="AutotuneCallback",
            run="fit",
            fix="resume it with the batch size and gradient accumulation it was saved at",
        )
        self.controller.load_state_dict(state)
        # Its per-block knobs as this loop takes them (the flags' pins too); the split is the loop's.
        knobs = self.takes(here, saved)
        target = dataclasses.replace(
            knobs, micro_batch_size=here.micro_batch_size, grad_accum_steps=here.grad_accum_steps
        )
        self.controller.restore(target, step=0, run="fit")
