"""Training loops that run a workload under a config, and ``measure`` on top of them.

``Trainer``: one local process. ``zero_stage > 0`` or ``ranks > 1``: DeepSpeed ranks launched with
torchrun (``multirank`` in the parent, ``ds_worker`` + ``zero`` in each rank); DeepSpeed itself is
imported only there. ``session.RankSession``: DeepSpeed ranks started once and driven by commands
(``session_worker`` in each rank), for training that changes its config as it goes.
"""

from autotune.runner.local import StepResult, Trainer, resolve_device
from autotune.runner.measuring import ProgressFn, measure

__all__ = ["ProgressFn", "StepResult", "Trainer", "measure", "measure_ranks", "resolve_device"]


def __getattr__(name: str) -> object:
    if name == "measure_ranks":  # imports the launcher and job schema, not DeepSpeed
        from autotune.runner.multirank import measure_ranks

        return measure_ranks
    raise AttributeError(f"module 'autotune.runner' has no attribute {name!r}")
