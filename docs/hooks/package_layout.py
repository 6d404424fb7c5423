"""mkdocs hook: lay the package out the way it installs, for mkdocstrings to read.

``envs/`` and ``policies/`` sit at the top of the repository but install as ``autotune.envs`` and
``autotune.policies`` (pyproject's package-dir), which griffe, reading sources, cannot follow: the
Makefile's typecheck target stages a copy for mypy for the same reason. Here the Python sources
are copied to ``build/docs-src/autotune`` at every docs build (symbolic links do not do: griffe
resolves them and lists the real folder).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
STAGE = ROOT / "build" / "docs-src"
# Source folder -> where it lands inside the staged ``autotune`` package.
MAPPED = {"envs": "envs", "policies": "policies"}


def stage() -> Path:
    package = STAGE / "autotune"
    if STAGE.exists():
        shutil.rmtree(STAGE)
    only_sources = shutil.ignore_patterns("__pycache__", "*.json", "*.safetensors", "*.md")
    shutil.copytree(ROOT / "autotune", package, ignore=only_sources)
    for source, name in MAPPED.items():
        shutil.copytree(ROOT / source, package / name, ignore=only_sources)
    return STAGE


def on_config(config: Any, **kwargs: Any) -> Any:
    stage()
    return config


if __name__ == "__main__":
    # `make docs` stages the sources before mkdocs starts: mkdocstrings drops a search path that
    # does not exist when it reads its configuration, before this hook's on_config runs, and a
    # fresh clone has no build/ yet (its first build then fails to find autotune.envs).
    stage()
