"""PPO agents and the shipped pretrained policy (``autotune.policies``): see README.md here."""

__all__: list[str] = []
