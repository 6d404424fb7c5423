"""The examples in the public API's docstrings run, and print what they say (``make test``)."""

from __future__ import annotations

import doctest
import importlib

import pytest

#: Modules whose docstrings hold runnable examples (Google style ``Example:`` sections).
MODULES = ("autotune.config", "autotune.units", "autotune.resolve", "autotune.memory.predict")


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
