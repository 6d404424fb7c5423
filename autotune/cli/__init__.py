"""The ``autotune`` command line (``autotune.cli:main``); every command is a thin layer over one
public function of the library."""

from autotune.cli.main import main

__all__ = ["main"]
