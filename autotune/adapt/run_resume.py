"""An :class:`~autotune.adapt.adaptive.Adaptive` run's state across a restart: ``state_dict`` /
``load_state_dict`` (the local loop only: on ranks the training state lives in the rank processes)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from autotune.adapt.records import AdaptStep
from autotune.adapt.run_views import RunViews
from autotune.adapt.saved import check_saved_batch, check_saved_model, model_record
from autotune.config import TrainConfig
from autotune.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["RunResume"]

_NO_LOCAL_STATE = (
    "Adaptive.on_ranks keeps its training state in the rank processes: state_dict() and load_state_dict() need "
    "Adaptive(model, ...) in one process."
)
_STATE_VERSION = 3  # of state_dict(): a change to its keys bumps it (3: model, 2: shape_guard; 1, 2 still read)


class RunResume(RunViews):
    """:class:`~autotune.adapt.adaptive.Adaptive`'s ``state_dict`` and ``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs, as plain values (``torch.load(weights_only=True)`` reads them).

        The configuration, the step count, every step and decision, the measured peaks and
        throughputs, a side-by-side trial under way, the decision source's state, the data
        stream's position and the largest batch shape seen (with that batch, as tensors:
        :meth:`autotune.adapt.shape_guard.ShapeGuard.state_dict`). Not the model and optimizer
        (yours: save their ``state_dict()`` beside it) nor the gradient noise estimate (it starts again).

        Returns:
            A dict of plain values, for :meth:`load_state_dict`.

        Raises:
            UnsupportedError: on ranks (the training state lives in the rank processes).

        Example:
            Saved beside the model and optimizer::

                torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(),
                            "tuner": tuner.state_dict()}, path)
        """
        t = self._in_place(_NO_LOCAL_STATE)
        return {
            "version": _STATE_VERSION,
            "config": t.config.to_dict(),
            "step_count": t.step_count,
            "steps": [s.to_dict() for s in self.steps],
            **self.controller.state_dict(),  # measured, decider, source, over_budget, losses
            "stream": t.stream.state_dict() if t.stream is not None else None,
            # Which configurations have run: a resumed run decides as the uninterrupted one would
            # (its first step after the restart pays the new process's one-time costs, one
            # outlier in a median of at least ``TUNING.trusted_steps`` timed steps).
            "ran": sorted((c.to_dict() for c in self._ran), key=lambda d: json.dumps(d, sort_keys=True)),
            # The largest batch shape seen: a resumed run does not profile it again at every step's check.
            "shape_guard": self.guard.state_dict(),
            # Which model the state is of: another model's configuration and measurements are not this one's.
            "model": model_record(self.workload),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue the run :meth:`state_dict` saved.

        Call it on an Adaptive built as that one was (the
        model and optimizer loaded with their own state): the next step runs at the saved
        configuration, with the saved step count (the LR schedule's) and data position, and
        nothing measured or refused before is explored again. The restored configuration passes
        this run's budget gate first: a smaller budget it does not fit puts the run where this
        run's own start put it (a ``budget`` change in :attr:`history`).

        Args:
            state: What :meth:`state_dict` returned.

        Raises:
            ConfigError: a state of another version, another effective batch or another model (its
                parameters' names, shapes and ``requires_grad`` differ: another width, depth or
                architecture; a state saved before version 3 is not checked).
            UnsupportedError: on ranks.
        """
        t = self._in_place(_NO_LOCAL_STATE)
        if state.get("version") not in (1, 2, _STATE_VERSION):  # 1: no shape guard's state; 2: no model's
            raise ConfigError(
                f"Adaptive state must be version 1, 2 or {_STATE_VERSION}, but got {state.get('version')!r}."
            )
        check_saved_model(
            state.get("model"),
            model_record(self.workload),
            state="Adaptive",
            run="run",
            fix="load it into an Adaptive over the model it was saved from",
        )
        restored, start = TrainConfig.from_dict(state["config"]), t.config
        check_saved_batch(
            restored,
            start,
            adapt_batch=self.adapt_batch,
            state="Adaptive",
            run="run",
            fix="resume it with the batch_size it was saved at, or with adapt_batch=True",
        )
        # Before the measurements: a profile at the saved largest shape forgets those of smaller ones.
        self.guard.load_state_dict(state.get("shape_guard", {}))
        self.controller.load_state_dict(state)
        self.steps = [AdaptStep.from_dict(s) for s in state["steps"]]
        self.controller.resume_losses([s.loss for s in self.steps])
        self._ran = {TrainConfig.from_dict(c) for c in state["ran"]}
        t.step_count = state["step_count"]
        if t.stream is not None and state["stream"] is not None:
            t.stream.load_state_dict(state["stream"])
        self.controller.restore(restored, step=t.step_count, run="run")
