"""torch's own log records during a fake-tensor pass, kept off the user's terminal.

A fake pass runs the user's model on tensors without values (shapes only). Where an operation
cannot run that way, or a meta kernel rejects its arguments, ``FakeTensorMode`` logs the error
with its whole traceback at ERROR level (``failed while attempting to run meta for
aten.mm.default``, torch 2.13 ``torch/_subclasses/fake_tensor.py``) and then raises it. autotune
catches that error: the memory model says in one line why it cannot predict
(:class:`autotune.errors.PredictionError`), and the per-block profile runs the pass for real
instead. torch's traceback on stderr would only bury that line. :func:`quiet_fake_logs` silences
the loggers of the machinery a fake pass goes through, for the pass only.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

__all__ = ["FAKE_PASS_LOGGERS", "quiet_fake_logs"]

#: The loggers (and their children) of what a fake pass runs: fake tensors and meta kernels,
#: MemTracker and its module tracker, activation checkpointing.
FAKE_PASS_LOGGERS: tuple[str, ...] = ("torch._subclasses", "torch.distributed._tools", "torch.utils.checkpoint")


@contextlib.contextmanager
def quiet_fake_logs() -> Iterator[None]:
    """Inside: nothing from :data:`FAKE_PASS_LOGGERS` is emitted; each logger's level is restored on exit.

    The levels are process-wide: another thread logging through these loggers meanwhile is silenced too.
    """
    children = tuple(f"{name}." for name in FAKE_PASS_LOGGERS)
    loggers = [logging.getLogger(name) for name in FAKE_PASS_LOGGERS]
    # A child logger with a level of its own does not read its parent's: set each one.
    loggers += [
        logger
        for name, logger in list(logging.root.manager.loggerDict.items())
        if isinstance(logger, logging.Logger) and name.startswith(children)
    ]
    levels = [(logger, logger.level) for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        for logger, level in levels:
            logger.setLevel(level)
