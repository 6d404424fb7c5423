"""The examples in the public API's docstrings run, and print what they say (``make test``)."""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
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
    "autotune.adapt.source_choice",
    "autotune.adapt.sources",
    "autotune.search.export",
    "autotune.search.compile_pick",
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


#: The public API whose every parameter is described: ``autotune.__all__``, ``autotune.adapt.__all__``,
#: ``autotune.envs.__all__``, the policies' and the two callbacks. The environments document their
#: arguments Gymnasium's way (an ``## Arguments`` section of ``- ``name``:`` items).
def _public() -> list[tuple[str, object]]:
    import autotune
    import autotune.adapt

    names = [(f"autotune.{n}", getattr(autotune, n)) for n in autotune.__all__]
    names += [(f"autotune.adapt.{n}", getattr(autotune.adapt, n)) for n in autotune.adapt.__all__]
    for module in ("autotune.envs", "autotune.policies", "autotune.policies.tune"):
        m = importlib.import_module(module)
        names += [(f"{module}.{n}", getattr(m, n)) for n in m.__all__ if callable(getattr(m, n))]
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
    described = (rf"^\s+{re.escape(p)}( \([^)]*\))?:|^- ``{re.escape(p)}``:" for p in params)  # Google, Gymnasium
    missing = [p for p, pattern in zip(params, described, strict=True) if not re.search(pattern, doc, re.MULTILINE)]
    assert not missing, f"{name}'s docstring does not describe {missing}"


# ---- The API reference (docs/api.md): the public API, all of it, and nothing else -----------------

#: The modules whose ``__all__`` is the public API: the packages, and the callbacks' modules.
API_MODULES = (
    "autotune",
    "autotune.adapt",
    "autotune.envs",
    "autotune.policies",
    "autotune.policies.tune",
    "autotune.integrations.hf",
    "autotune.integrations.lightning",
)
API_PAGE = ROOT / "docs" / "api.md"
DIRECTIVE = re.compile(r"^::: (\S+)$", re.M)
#: Examples that train for real (seconds to tens of seconds): run with ``pytest -m slow``.
SLOW_EXAMPLES = {"autotune.envs.calibrate", "autotune.policies.tune.Tuned", "autotune.policies.tune.tune"}


def _api() -> tuple[dict[str, object], set[str]]:
    """Every public name by its dotted path, and the modules that could not load (an extra missing)."""
    names: dict[str, object] = {}
    missing: set[str] = set()
    for module in API_MODULES:
        try:
            m = importlib.import_module(module)
        except ImportError:
            missing.add(module)
            continue
        names |= {f"{module}.{n}": getattr(m, n) for n in m.__all__}
    return names, missing


def _documented() -> tuple[dict[str, object], set[str]]:
    """Each public class and function under its first public path, and the other paths (aliases)."""
    first: dict[int, str] = {}
    aliases: set[str] = set()
    for name, obj in API.items():
        if inspect.isclass(obj) or inspect.isfunction(obj):
            if id(obj) in first:
                aliases.add(name)  # autotune.adapt.Adaptive is autotune.Adaptive
            else:
                first[id(obj)] = name
    return {name: API[name] for name in first.values()}, aliases


API, API_MISSING = _api()
DOCUMENTED, ALIASES = _documented()


def test_the_api_page_documents_every_public_name_and_nothing_else() -> None:
    text = API_PAGE.read_text()
    directives = set(DIRECTIVE.findall(text))
    unloaded = {d for d in directives if d.rpartition(".")[0] in API_MISSING}
    assert directives - unloaded == set(DOCUMENTED), "docs/api.md: one ::: directive per public class and function"
    mentioned = sorted(set(API) - set(DOCUMENTED))  # constants, and a second path to a documented name
    assert mentioned == ["autotune.adapt.Adaptive", "autotune.envs.PROFILE_DIR", "autotune.policies.PRETRAINED_DIR"]
    assert all(f"`{name}`" in text for name in mentioned), "docs/api.md names each public constant and alias"


def test_the_api_page_shows_no_internal_of_the_adaptive_run() -> None:
    text = API_PAGE.read_text()
    for internal in ("Decider", "Controller", "BudgetGate", "FrontEnd", "SideBySide", "Verdict"):
        assert not re.search(rf"^::: \S+\.{internal}$", text, re.M), internal
    assert re.findall(r"^      members: \[(.*)\]$", text, re.M) == ["history, evaluation_peak", "history"]


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_public_class_and_function_has_an_example(name: str) -> None:
    doc = inspect.getdoc(DOCUMENTED[name]) or ""
    assert re.search(r"^(Example:|## Example)$", doc, re.M), f"{name}'s docstring has no Example section"
    assert ">>> " in doc, f"{name}'s example is not a doctest"


def _doctests(name: str) -> list[doctest.DocTest]:
    obj = DOCUMENTED[name]
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = finder.find(obj, name, module=inspect.getmodule(obj), globs={})
    return [t for t in found if t.examples]


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_EXAMPLES else n for n in sorted(DOCUMENTED)],
)
def test_public_examples_run(name: str) -> None:
    tests = _doctests(name)
    assert tests, f"{name} has no doctest"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"


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
