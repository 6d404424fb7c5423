"""The optional dependencies: which extra installs which module, and the one line that says so.

The base install (``pip install torch-autotune``) runs the study, ``tune``, the shipped policy and
``Adaptive``. DeepSpeed (ZeRO, several ranks), transformers (the Hugging Face corpus and callback),
Lightning (its callback) and the dashboard are extras: a command that needs a missing one says
which to install in one line, exits 2, and shows no traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from autotune.errors import MissingDependencyError

__all__ = ["BASE_MODULES", "DISTRIBUTION", "EXTRA_OF", "install_command", "missing_dependency"]

# The name autotune is installed under (pyproject.toml's [project] name): `autotune` on the public
# index is an unrelated project, so the distribution's name differs from the import name.
DISTRIBUTION: Final = "torch-autotune"

#: Top-level module -> the extra of ``torch-autotune`` that installs it.
EXTRA_OF: Final[Mapping[str, str]] = {
    "deepspeed": "zero",
    "transformers": "hf",
    "accelerate": "hf",
    "lightning": "lightning",
    "pytorch_lightning": "lightning",
    "optuna_dashboard": "dashboard",
    "plotly": "dashboard",
}

#: Top-level modules the base install brings: missing, the installation is broken.
BASE_MODULES: Final = frozenset(
    {"torch", "numpy", "rich", "sklearn", "optuna", "gymnasium", "stable_baselines3", "safetensors"}
)


def install_command(extra: str | None = None) -> str:
    """``pip install 'torch-autotune[EXTRA]'``, or the base install's command for ``None``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'" if extra else f"pip install {DISTRIBUTION}"


def missing_dependency(error: ModuleNotFoundError) -> MissingDependencyError | None:
    """The one-line error for an import of a dependency that is not installed, or None when the
    missing module is none of autotune's dependencies (a bug, or the user's own import)."""
    module = (error.name or "").partition(".")[0]
    if module in EXTRA_OF:
        extra = EXTRA_OF[module]
        return MissingDependencyError(f"this needs {module}, which is not installed: {install_command(extra)}")
    if module in BASE_MODULES:
        return MissingDependencyError(
            f"{module} is not installed, and every autotune command needs it: {install_command()} installs it"
        )
    return None
