"""The examples in the public API's docstrings run, and print what they say (``make test``)."""

from __future__ import annotations

import doctest
import importlib

import pytest

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
