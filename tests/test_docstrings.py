"""The examples in the public API's docstrings run, and print what they say (``make test``)."""

from __future__ import annotations

import ast
import doctest
import importlib
import io
import re
import tokenize

import pytest

from tests.paths import ROOT

#: Modules whose docstrings hold runnable examples (Google style ``Example:`` sections).
MODULES = (
    "autotune.config",
    "autotune.units",
    "autotune.resolve",
    "autotune.memory.predict",
    "autotune.errors",
    "autotune.procs.measure",
    "autotune.knobs",
    "autotune.workload",
    "autotune.adapt.adaptive",
    "autotune.adapt.sources",
    "autotune.search.export",
    "autotune.train.wrappers",
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(module, name) if t.examples]
    assert tests, f"{name} has no docstring example"
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} docstring examples of {name} failed"


#: The public API the docs site's reference renders (docs/api.md): ``autotune.__all__``,
#: ``autotune.adapt.__all__`` and the two callbacks.
def _public() -> list[tuple[str, object]]:
    import autotune
    import autotune.adapt

    names = [(f"autotune.{n}", getattr(autotune, n)) for n in autotune.__all__]
    names += [(f"autotune.adapt.{n}", getattr(autotune.adapt, n)) for n in autotune.adapt.__all__]
    for module in ("autotune.integrations.hf", "autotune.integrations.lightning"):
        try:
            callback = importlib.import_module(module).AutotuneCallback
        except ImportError:  # an optional dependency not installed: its callback is not public here
            continue
        names.append((f"{module}.AutotuneCallback", callback))
    return names


CHECKED = _public()


@pytest.mark.parametrize(("name", "obj"), CHECKED, ids=[name for name, _ in CHECKED])
def test_public_names_document_every_parameter(name: str, obj: object) -> None:
    """A one-line summary, then every parameter in ``Args:`` (or, for a record, ``Attributes:``)."""
    import inspect
    import re

    doc = inspect.getdoc(obj)
    assert doc, f"{name} has no docstring"
    summary = doc.split("\n\n")[0]
    assert "\n" not in summary, f"{name}'s summary is more than one line: {summary!r}"
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return
    if isinstance(obj, type) and "__init__" not in vars(obj) and not hasattr(obj, "__dataclass_fields__"):
        return  # no constructor of its own (a protocol or an abstract base): nothing to pass
    params = [
        p.name
        for p in inspect.signature(obj).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"
    ]
    missing = [p for p in params if not re.search(rf"^\s+{re.escape(p)}( \([^)]*\))?:", doc, re.MULTILINE)]
    assert not missing, f"{name}'s docstring does not describe {missing}"


#: Measurement history belongs on the benchmarks page and in commit messages, not in the code: a
#: docstring or comment that dates a figure ("2026-11-28") or names the commit it was measured at
#: ("commit 1dac74e") is history. Cheap, precise patterns only: an ISO date, and a word of 7-40 hex
#: digits with both a digit and a letter (a commit hash; a plain number or an English word is not).
HISTORY = re.compile(
    r"\b20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b"
    r"|\b(?=[0-9a-f]{0,39}\d)(?=[0-9a-f]{0,39}[a-f])[0-9a-f]{7,40}\b"
)
PACKAGE_SOURCES = [p for folder in ("autotune", "envs", "policies") for p in sorted((ROOT / folder).rglob("*.py"))]


def history_lines(source: str, name: str) -> list[str]:
    """``name:line: text`` for each docstring or comment line of ``source`` that dates a figure or
    names a commit (:data:`HISTORY`)."""
    found: list[tuple[int, str]] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0]
                lines = enumerate(doc.splitlines(), start=first.lineno)
                found += [(number, line.strip()) for number, line in lines if HISTORY.search(line)]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT and HISTORY.search(token.string):
            found.append((token.start[0], token.string.strip()))
    return [f"{name}:{line}: {text}" for line, text in sorted(found)]


def test_history_lines_finds_dates_and_commits_in_docstrings_and_comments() -> None:
    source = (
        '"""Measured on 2026-11-28."""\n'
        "def f():\n"
        '    """At commit 1dac74e: 3.1x. Issue #139214, 1.5e10, a 0xff mask, deadbeef, 20261128."""\n'
        "    x = '2026-11-28'  # seen at 9b8624b\n"
        "    # the ratio: 2.40 GB, fp16, cafe01 (six digits), 2026-13-01 (no month)\n"
    )
    assert history_lines(source, "m.py") == [
        "m.py:1: Measured on 2026-11-28.",
        "m.py:3: At commit 1dac74e: 3.1x. Issue #139214, 1.5e10, a 0xff mask, deadbeef, 20261128.",
        "m.py:4: # seen at 9b8624b",
    ]


def test_no_dates_or_commits_in_the_packages_docstrings_and_comments() -> None:
    found = [line for path in PACKAGE_SOURCES for line in history_lines(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], (
        "measurement history in docstrings or comments (say what and why; figures go on "
        "docs/benchmarks.md):\n" + "\n".join(found)
    )
