"""The ``autotune`` command: one registry of thin commands over the library.

A user mistake (bad workload reference, bad config value) prints one line and exits with 2;
a configuration that fails to train exits with 1; Ctrl-C exits with 130; no traceback either way.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from autotune.errors import AutotuneError, TrainingError

__all__ = ["main"]

# The command registry: each module has ``register(subparsers) -> None``, which adds its parsers
# and sets ``func`` (a handler taking the parsed args, returning the exit code). They must import
# only argparse-level code at module level, so ``autotune --help`` stays instant.
COMMAND_MODULES: tuple[str, ...] = (
    "autotune.cli.run",
    "autotune.cli.study",
    "autotune.cli.policy",
    "autotune.cli.train",
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autotune")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    try:
        result: int = args.func(args)
        return result
    except TrainingError as e:
        print(f"autotune {args.command}: {e}", file=sys.stderr)
        return 1
    except AutotuneError as e:
        print(f"autotune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Measure and search PyTorch training configurations.")
    parser.add_argument("--version", action="version", version=f"autotune {_version()}", help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser
