"""mkdocs hook: the CLI reference page, generated from the argument parsers at build time.

``docs/cli.md`` holds a marker; this hook replaces it with every command's ``--help`` as
argparse prints it (``autotune.cli.main._parser``), so the reference can never drift from the
code: there is nothing hand-copied to update.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-reference -->"


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _help(parser: argparse.ArgumentParser) -> str:
    return parser.format_help().rstrip()


def cli_reference() -> str:
    from autotune.cli.main import _parser

    os.environ["COLUMNS"] = "100"  # argparse wraps at the terminal's width: one width for every build
    parser = _parser()
    commands = _subcommands(parser)
    lines = ["```text", _help(parser), "```", ""]
    for name, sub in commands.items():
        lines += [f"## autotune {name}", "", "```text", _help(sub), "```", ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    if MARKER in markdown:
        return markdown.replace(MARKER, cli_reference())
    return markdown
