"""The docs pages and the CLI's help (which docs/cli.md is generated from) say nothing stale.

Two rules, each checked on every page and every command:

* A page that points at a part of itself ("table above", "the fix below") has that part, in that
  direction. Pages are edited and split often: a sentence moved to another page keeps its "above"
  while the table it meant stays behind (docs/adaptive.md pointed at a "table above" that lived on
  the benchmarks page). Point at another page with a link instead.
* Help texts carry no issue numbers ("#3", "issue 22"): a user reading ``--help`` cannot follow
  them, and they go stale when the issue closes. They belong in commit messages and CHANGELOG.md.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from autotune.cli.main import _parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The phrasings the pages use for a part of the same page, and how each part is recognised.
# A table is its rows, a section its heading, an example or a command a code block, a picture its
# image; any other noun (a fix, a run, a study) must occur in that direction other than in another
# such reference (a "fix above" that only meets "the fix below" points at nothing). "Above it" /
# "below them" place one thing relative to another ("each figure, with the command above it"), not
# relative to where the reader is: not a reference.
REFERENCE = re.compile(
    r"\b(tables?|sections?|examples?|commands?|picture|figure|image|fix|run|study)\s+(above|below)\b"
    r"(?!\s+(?:it|them)\b)",
    re.I,
)
MARKERS = {
    "table": re.compile(r"^\|", re.M),
    "section": re.compile(r"^#{1,6} ", re.M),
    "example": re.compile(r"^```", re.M),
    "command": re.compile(r"^```", re.M),
    "picture": re.compile(r"!\["),
    "figure": re.compile(r"!\["),
    "image": re.compile(r"!\["),
}
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def _blank(text: str, pattern: re.Pattern[str]) -> str:
    """``text`` with every match of ``pattern`` replaced by spaces (offsets kept)."""
    return pattern.sub(lambda m: " " * len(m.group(0)), text)


def dangling_references(text: str) -> list[str]:
    """The references in ``text`` to a part of the same page that is not there, as "line N: phrase"."""
    prose = _blank(text, FENCE)  # a ``# comment`` in a code block is no heading
    found: list[str] = []
    for m in REFERENCE.finditer(prose):
        noun, where = m.group(1).lower().rstrip("s"), m.group(2).lower()  # "tables" -> "table"
        marker = MARKERS.get(noun)
        # Code blocks are what "example" and "command" point at; everything else is in the prose.
        haystack = text if noun in ("example", "command") else _blank(prose, REFERENCE)
        if marker is None:  # the word itself ("fixes" would match the verb: "the Trainer fixes its DataLoader")
            marker = re.compile(rf"\b{re.escape(m.group(1))}\b", re.I)
        part = haystack[: m.start()] if where == "above" else haystack[m.end() :]
        if not marker.search(part):
            found.append(f"line {text.count(chr(10), 0, m.start()) + 1}: {' '.join(m.group(0).split())!r}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_page_has_what_it_says_is_above_or_below(page: Path) -> None:
    assert dangling_references(page.read_text()) == [], f"{page.relative_to(ROOT)}: link to where it is instead"


def test_dangling_references_are_found_in_the_phrasings_the_pages_use() -> None:
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert dangling_references("a tracked step costs 1.1-15x a step, table above.\n") == ["line 1: 'table above'"]
    assert dangling_references(table + "\na tracked step costs 1.1-15x a step, table above.\n") == []
    assert dangling_references("the costs (table below).\n" + table) == []
    assert dangling_references(table + "the costs (table below).\n") == ["line 4: 'table below'"]
    # Two sentences pointing at each other: neither finds the fix itself.
    pair = "Mistral, before the fix\nbelow, was 2.3% over.\n\nas it was before the fake-branch fix above.\n"
    assert dangling_references(pair) == ["line 1: 'fix below'", "line 4: 'fix above'"]
    assert dangling_references("The fix: the profile asks the kernel.\n\nBefore the fix above, 72% low.\n") == []
    assert dangling_references("before the fix below.\n\nThe Trainer fixes its DataLoader.\n") == [
        "line 1: 'fix below'"
    ]
    # A comment in a code block is no section; a code block is an example.
    assert dangling_references("```python\n# my_model.py\n```\nthe section above\n") == ["line 4: 'section above'"]
    assert dangling_references("```bash\nautotune workloads\n```\nthe command above\n") == []
    assert dangling_references("![front](p.png)\n\n(the picture above)\n") == []
    assert dangling_references("Every figure was measured with the command above it.\n") == []


def _parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """``autotune`` and each of its commands, by name."""
    out = {"autotune": parser}
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            out |= {f"autotune {name}": sub for name, sub in action.choices.items()}
    return out


ISSUE = re.compile(r"#\d+|\bissues?\s+\d+", re.I)
PARSERS = _parsers(_parser())


def test_every_command_is_checked() -> None:
    assert {"autotune study", "autotune train", "autotune measure", "autotune tune"} <= set(PARSERS)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_help_carries_no_issue_number(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per argument: no number wrapped away from its word
    text = PARSERS[name].format_help()
    assert ISSUE.findall(text) == [], f"{name} --help names an issue: say what it means instead"


def test_the_issue_pattern_finds_the_forms_help_texts_used() -> None:
    found = ISSUE.findall("needs the DeepSpeed runner, #3; see issue 22, Issues 4 and transformers#32215")
    assert found == ["#3", "issue 22", "Issues 4", "#32215"]
    assert ISSUE.findall("--ranks 2 (> 1 needs DeepSpeed); 75% of the peak") == []


def test_the_home_page_shows_readmes_five_quick_starts_with_site_links() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("quick_starts", ROOT / "docs" / "hooks" / "quick_starts.py")
    assert spec is not None and spec.loader is not None
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    text = hook.quick_starts((ROOT / "README.md").read_text())
    assert re.findall(r"^### (Quick start \d)", text, re.M) == [f"Quick start {n}" for n in range(1, 6)]
    assert "](docs/" not in text and "](own-model.md)" in text
    assert "## Examples" not in text
    page = (ROOT / "docs" / "index.md").read_text()
    assert hook.on_page_markdown(page, page=None).count("### Quick start") == 5
