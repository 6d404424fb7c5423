"""Gymnasium environments over the training loop (``autotune.envs``): see README.md here."""

__all__: list[str] = []
