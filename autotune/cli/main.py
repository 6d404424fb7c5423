"""The ``autotune`` command: one registry of thin commands over the library.

Exit codes, each with one line on stderr and no traceback:

- 0: done;
- 1: a configuration failed to train;
- 2: a user mistake (bad workload reference, bad config value, a file where a directory goes), or an
  optional dependency the command needs is not installed (the line names the extra): nothing written;
- 3: the loss became NaN or infinite where a result would be meaningless (``tune``, ``train --adapt``);
- 4: over the memory budget: ``train`` (with or without ``--adapt``) measured a step over it (unless
  ``--allow-over-budget``), or ``measure --memory-budget`` measured a peak over it;
- 130: Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from collections.abc import Iterator, Sequence

from autotune.dependencies import DISTRIBUTION
from autotune.errors import AutotuneError, NonFiniteLossError, TrainingError

__all__ = ["EXIT_NON_FINITE_LOSS", "EXIT_OVER_BUDGET", "main", "warnings_as_lines"]

#: Exit code of a run whose loss became NaN or infinite (:class:`NonFiniteLossError`).
EXIT_NON_FINITE_LOSS = 3
#: Exit code of ``train`` when a step measured over the memory budget, and of ``measure`` when its peak is.
EXIT_OVER_BUDGET = 4

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
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "func"):
        parser.print_help()
        return 2
    # A command's machine output (--json, best's export) is stdout's alone: the user's own prints
    # (nanoGPT's build prints its parameter count) go to stderr while it runs, and the command
    # writes its output to args.stdout.
    args.stdout = sys.stdout
    machine = getattr(args, "json", False) or getattr(args, "machine_output", False)
    try:
        with (
            warnings_as_lines(args.command),  # autotune's warnings, in every command: one line each
            contextlib.redirect_stdout(sys.stderr) if machine else contextlib.nullcontext(),
        ):
            result: int = args.func(args)
        return result
    except NonFiniteLossError as e:
        print(f"autotune {args.command}: {e}", file=sys.stderr)
        return EXIT_NON_FINITE_LOSS
    except TrainingError as e:
        print(f"autotune {args.command}: {e}", file=sys.stderr)
        return 1
    except AutotuneError as e:
        print(f"autotune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:
        from autotune.dependencies import missing_dependency

        missing = missing_dependency(e)
        if missing is None:  # not one of autotune's dependencies: a bug, or the user's own import
            raise
        print(f"autotune {args.command}: error: {missing}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"autotune {args.command}: interrupted", file=sys.stderr)
        return 130


@contextlib.contextmanager
def warnings_as_lines(command: str) -> Iterator[None]:
    """Inside: each of autotune's own warnings (:class:`~autotune.errors.AutotuneWarning`) is one
    line on stderr, ``autotune COMMAND: warning: ...``, not Python's two lines with a source line."""
    from autotune.errors import AutotuneWarning

    with warnings.catch_warnings():
        warnings.simplefilter("always", AutotuneWarning)  # each is the command's output, even if repeated
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
            if issubclass(category, AutotuneWarning):
                print(f"autotune {command}: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, *args, **kwargs)  # type: ignore[arg-type]

        warnings.showwarning = show
        yield


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotune", description="Measure and search PyTorch training configurations.")
    parser.add_argument("--version", action="version", version=f"autotune {_version()}", help="print the version")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub)
    return parser
