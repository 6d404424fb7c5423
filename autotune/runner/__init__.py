"""Training loops that run a workload under a config, and ``measure`` on top of them.

Local process here; DeepSpeed ranks come with issue #3.
"""

from autotune.runner.local import StepResult, Trainer, resolve_device
from autotune.runner.measuring import ProgressFn, measure

__all__ = ["ProgressFn", "StepResult", "Trainer", "measure", "resolve_device"]
