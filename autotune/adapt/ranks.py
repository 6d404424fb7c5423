"""The rank session as the loop an adaptive run drives: ZeRO stages become a live knob.

:class:`RankLoop` implements :class:`~autotune.adapt.loop.AdaptLoop` over a
:class:`~autotune.procs.session.RankSession`: N DeepSpeed ranks (torchrun; gloo on CPU, NCCL on
CUDA) that each train a copy of the workload's model, rebuilt from its reference. A ZeRO stage
(or engine precision) change builds new engines and carries the fp32 parameters, Adam's state,
the LR schedule and the data position over (:mod:`autotune.train.zero_state`); the other knobs
change on the live engines. The adaptive run's decisions, gate and history are the local run's
(:class:`~autotune.adapt.Adaptive`); only the loop differs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from autotune.config import TrainConfig
from autotune.errors import RankFailed, UnsupportedError
from autotune.measurement.cuda_memory import AllocatorStats
from autotune.procs.session import RankSession, SessionStep
from autotune.train.base import StepResult
from autotune.workload import Workload

__all__ = ["RankLoop"]

_T = TypeVar("_T")


class RankLoop:
    """``config.ranks`` DeepSpeed ranks training ``workload`` under a config that changes between steps.

    No gradient-noise hooks (``noise`` is None): ZeRO reduces and partitions the gradients inside
    the engine, where the micro-batch gradients are not seen. A rank's failure ends the session
    (every process reaped) and comes back as a :class:`~autotune.errors.TrainingError` naming the
    rank and its exception; a user mistake found in a rank keeps its type.
    """

    noise = None
    noise_split = 1
    # Each rank's measurement reads its own allocator; the session's tracked step does not send it.
    allocator_stats: AllocatorStats | None = None

    def __init__(self, session: RankSession, workload: Workload, config: TrainConfig, *, owned: bool) -> None:
        """Start ``workload`` under ``config`` in ``session``'s ranks (whatever they trained before
        ends); ``owned``: :meth:`close` closes the session too."""
        self.session, self.workload, self.owned = session, workload, owned
        self.step_count = 0
        self._call(lambda: session.start(workload, config), config)

    @classmethod
    def launch(cls, workload: Workload, config: TrainConfig, *, device_type: str, timeout: float) -> RankLoop:
        """Start ``config.ranks`` ranks (~10 s on 2 CPU cores) and ``workload`` on them; on any
        failure, Ctrl-C included, no process is left running."""
        session = RankSession(ranks=config.ranks, device=device_type, timeout=timeout)
        try:
            return cls(session, workload, config, owned=True)
        except BaseException:
            session.close()
            raise

    @property
    def config(self) -> TrainConfig:
        assert self.session.config is not None, "started in __init__"
        return self.session.config

    @property
    def rank_pids(self) -> tuple[int, ...]:
        return self.session.rank_pids

    def feed(self, batch: Any) -> None:
        raise UnsupportedError(
            "Adaptive.on_ranks trains each rank's shard of the workload's dataset in the rank processes: "
            "step(batch) needs Adaptive(model, ...) in this process; call step() with no batch."
        )

    def step(self, *, split: int = 1) -> StepResult:
        assert split == 1, "no split step without noise hooks"
        return self._counted(self._call(self.session.step, self.config))

    def measured_step(self) -> tuple[StepResult, int]:
        tracked = self._call(self.session.tracked_step, self.config)
        return self._counted(tracked.step), tracked.peak_bytes

    def reconfigure(self, config: TrainConfig) -> str | None:
        return self._call(lambda: self.session.reconfigure(config), config).rebuilt

    def close(self) -> None:
        """Close every rank's engine and reap every process (idempotent); a session this loop
        was given stays open for its owner."""
        if self.owned:
            self.session.close()

    def _counted(self, step: SessionStep) -> StepResult:
        self.step_count += 1
        return StepResult(
            loss=step.loss, samples=step.samples, seconds=step.seconds, lr=step.lr, overflow=step.overflow
        )

    def _call(self, command: Callable[[], _T], config: TrainConfig) -> _T:
        try:
            return command()
        except RankFailed as e:  # the session has ended its ranks already
            raise e.training_error(self.workload, config) from e
