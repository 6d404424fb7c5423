"""Which run a saved adaptive state is of: every front end's resume refuses another model's or batch's.

:class:`autotune.Adaptive` and the framework callbacks (:mod:`autotune.integrations`) save a
:func:`model_record` beside their state and check it, and the effective batch, on a resume.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotune.config import TrainConfig
    from autotune.workload import Workload

__all__ = ["check_saved_batch", "check_saved_model", "model_record"]


def model_record(workload: Workload) -> dict[str, Any]:
    """Which model a saved state is of, as plain values: its parameter layout's hash
    (:attr:`Workload.fingerprint`) and its parameter count, for :func:`check_saved_model`."""
    return {"fingerprint": workload.fingerprint, "parameters": workload.num_parameters}


def check_saved_model(
    saved: Mapping[str, Any] | None, here: Mapping[str, Any], *, state: str, run: str, fix: str
) -> None:
    """Refuse a state saved for another model: another model's configuration and measurements are
    not this one's. Every front end's resume runs it.

    Args:
        saved: The state's :func:`model_record` (None: a state from before it was kept, not checked).
        here: This run's :func:`model_record`.
        state: Whose state it is, as the message names it (``"Adaptive"``).
        run: What this run is called (``"run"``, ``"fit"``).
        fix: What to do instead, the message's end.

    Raises:
        ConfigError: the fingerprints differ.
    """
    if saved is not None and saved["fingerprint"] != here["fingerprint"]:
        raise ConfigError(
            f"{state} state was saved for another model ({saved['parameters']:,} parameters, fingerprint "
            f"{saved['fingerprint']}), but this {run}'s model has {here['parameters']:,} parameters (fingerprint "
            f"{here['fingerprint']}): {fix}."
        )


def check_saved_batch(
    saved: TrainConfig, here: TrainConfig, *, adapt_batch: bool, state: str, run: str, fix: str
) -> None:
    """Refuse a state saved at another effective batch: the batch is the user's (the learning rate
    and the data order follow it), and only a run that adapts it may resume at another. Every
    front end's resume runs it.

    Args:
        saved: The configuration the state was saved at.
        here: This run's configuration.
        adapt_batch: Whether this run adapts the effective batch (then any saved one resumes).
        state: Whose state it is, as the message names it (``"Adaptive"``).
        run: What this run is called (``"run"``, ``"fit"``).
        fix: What to do instead, the message's end.

    Raises:
        ConfigError: the effective batches differ and this run does not adapt its batch.
    """
    if not adapt_batch and saved.effective_batch_size != here.effective_batch_size:
        raise ConfigError(
            f"{state} state's effective batch must be this {run}'s ({here.effective_batch_size}), but got "
            f"{saved.effective_batch_size}: {fix}."
        )
