"""The start of an adaptive run on DeepSpeed ranks (:meth:`autotune.adapt.Adaptive.on_ranks`).

What differs from a run in this process before the shared setup: the rank count and a session
checked, the workload rebuilt from its reference, the batch split evenly over the ranks, the
device type the ranks run on, and the loop, a :class:`~autotune.adapt.ranks.RankLoop` in the given
session or in ranks launched at the start configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from autotune.config import TrainConfig
from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.adapt.loop import AdaptLoop
    from autotune.procs.session import RankSession
    from autotune.workload import Workload

__all__ = ["RankStart", "rank_start"]


class RankStart(NamedTuple):
    """What :meth:`~autotune.adapt.Adaptive.on_ranks` hands the setup it shares with a local run."""

    workload: Workload
    default: TrainConfig  # fp32, one micro-batch per rank, ZeRO stage 0
    device_type: str
    loop: Callable[[TrainConfig, bool], AdaptLoop]  # (start, noise) -> the ranks' loop, started


def rank_start(
    workload: str | Workload,
    *,
    ranks: int,
    device: str | None,
    grad_clip: float | None,
    lr_scaling: str,
    seed: int,
    timeout: float,
    session: RankSession | None,
) -> RankStart:
    """Check the rank arguments and build the default configuration and the loop of a run on ranks.

    Args:
        workload: A workload reference, or a :class:`~autotune.Workload` loaded from one.
        ranks: DeepSpeed data-parallel ranks, >= 2.
        device: ``cpu``, ``cuda`` or None (CUDA when available); a ``session``'s device wins.
        grad_clip: The default configuration's gradient clipping.
        lr_scaling: The default configuration's learning-rate scaling.
        seed: The default configuration's seed.
        timeout: Seconds one command to launched ranks may take.
        session: A running rank session to train in, or None to launch ranks.

    Returns:
        The workload, the default configuration, the device type and the loop factory.

    Raises:
        ConfigError: ``ranks`` below 2, a ``session`` closed or of another rank count, or a batch
            that does not divide by ``ranks``.
        WorkloadError: the workload reference cannot be resolved.
        UnsupportedError: a device the DeepSpeed runner does not run on.
    """
    from autotune.adapt.ranks import RankLoop
    from autotune.procs.session import check_configs, device_type_of
    from autotune.resolve import load_workload

    if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 2:
        raise ConfigError(f"ranks must be an int >= 2 (one process: Adaptive(model, ...)), but got {ranks!r}.")
    if session is not None and (session.closed or session.ranks != ranks):
        state = "closed" if session.closed else f"of {session.ranks} ranks"
        raise ConfigError(f"session must be an open RankSession of ranks={ranks}, but got one {state}.")
    wl = load_workload(workload) if isinstance(workload, str) else workload
    if wl.batch_size % ranks:
        raise ConfigError(f"the batch of workload {wl.name!r} ({wl.batch_size}) must divide evenly by ranks={ranks}.")
    default = TrainConfig(
        micro_batch_size=wl.batch_size // ranks,
        ranks=ranks,
        grad_clip=grad_clip,
        lr_scaling=lr_scaling,  # type: ignore[arg-type]
        seed=seed,
    )
    device_type = device_type_of(device) if session is None else session.device_type
    check_configs(wl, [default], device_type)  # a reference and a micro-batch the ranks can take

    def loop(start: TrainConfig, noise: bool) -> AdaptLoop:
        if session is not None:
            return RankLoop(session, wl, start, owned=False)
        return RankLoop.launch(wl, start, device_type=device_type, timeout=timeout)

    return RankStart(wl, default, device_type, loop)
