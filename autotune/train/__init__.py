"""The training loop: one process (:class:`Trainer`) or one DeepSpeed rank (``zero.ZeroTrainer``).

Everything a step needs lives here: the per-block wrappers (precision islands, checkpointing),
the gradient noise hooks, the DeepSpeed config generator and the ZeRO state hand-over. Nothing here
measures or searches: :mod:`autotune.measurement` runs these loops under a schedule. DeepSpeed is
imported only by ``zero`` (in the ranks).
"""

from autotune.train.base import StepResult, check_loss
from autotune.train.local import Trainer, resolve_device

__all__ = ["StepResult", "Trainer", "check_loss", "resolve_device"]
