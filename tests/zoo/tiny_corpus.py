"""The real-model corpus at its tiny (CI) sizes, as workload references a child process can load.

``tests/zoo/tiny_corpus.py:hf_gpt2`` builds ``CORPUS["hf-gpt2"]`` at ``CORPUS["hf-gpt2"].tiny``:
study trials and ``tune`` rebuild their workload from such a reference in another process.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autotune.workload import Workload
from autotune.zoo import CORPUS

__all__ = ["build", "function_name", "reference"]


def function_name(name: str) -> str:
    return name.replace("-", "_")


def reference(name: str) -> str:
    return f"{Path(__file__).resolve()}:{function_name(name)}"


def build(name: str) -> Workload:
    entry = CORPUS[name]
    return entry.build(**entry.tiny)


def __getattr__(attr: str) -> Callable[[], Workload]:
    names = {function_name(n): n for n in CORPUS}
    if attr not in names:
        raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
    return lambda: build(names[attr])
