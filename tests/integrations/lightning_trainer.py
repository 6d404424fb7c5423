"""The Lightning Trainer the integration tests fit with: on the CPU, nothing written or drawn."""

from __future__ import annotations

from typing import Any

import lightning as L


def quiet_trainer(**kwargs: Any) -> L.Trainer:
    """A Lightning Trainer on the CPU without logger, checkpoints, progress bar or model summary."""
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
