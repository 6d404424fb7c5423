"""Resolving a workload reference: a built-in name, ``random:SEED``, ``file.py:build`` or ``module:build``.

Its own module so that imports point one way: it needs both the contract
(:mod:`autotune.workload`) and the built-ins (:mod:`autotune.zoo`), and the zoo needs the contract.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from autotune import zoo
from autotune.errors import WorkloadError
from autotune.workload import Workload

__all__ = ["load_workload", "source_of"]


def load_workload(ref: str) -> Workload:
    """Resolve a workload reference into a :class:`Workload`.

    Args:
        ref: A built-in name (see ``autotune workloads``), ``random:SEED`` (or ``random2:SEED``)
            for a generated architecture, ``path/to/file.py:build`` or ``package.module:build``.
            The function named after the colon is called with no arguments and must return a
            :class:`Workload`.

    Returns:
        The workload, its ``source`` set to ``ref`` (so a study's child process can rebuild it).

    Raises:
        WorkloadError: with one line saying which file or name failed and what was expected.

    Example:
        >>> from autotune import load_workload
        >>> wl = load_workload("mlp-digits")
        >>> wl.name, wl.batch_size, wl.block_names()
        ('mlp-digits', 32, ('blocks.0', 'blocks.1', 'blocks.2', 'blocks.3'))
    """
    if ref in zoo.BUILTINS:
        return dataclasses.replace(zoo.BUILTINS[ref].build(), source=ref)
    if ref.partition(":")[0] in zoo.RANDOM_PREFIXES and ":" in ref:
        return dataclasses.replace(zoo.random_workload_from_ref(ref), source=ref)
    if ":" not in ref:
        names = ", ".join(sorted(zoo.BUILTINS))
        raise WorkloadError(
            f"unknown workload {ref!r}: expected a built-in name ({names}), 'random:SEED', "
            "'path/to/file.py:build' or 'package.module:build'"
        )
    target, _, attr = ref.rpartition(":")
    if not attr.isidentifier():
        raise WorkloadError(f"workload {ref!r}: {attr!r} after ':' is not a Python function name")
    module = _import_target(target, ref)
    fn = getattr(module, attr, None)
    if fn is None:
        raise WorkloadError(f"workload {ref!r}: {target!r} has no attribute {attr!r}")
    if not callable(fn):
        raise WorkloadError(f"workload {ref!r}: {attr!r} is a {type(fn).__name__}, expected a function")
    try:
        workload = fn()
    except WorkloadError:
        raise
    except Exception as e:  # the user's build() failed: report it in one line, keep the chain
        raise WorkloadError(f"workload {ref!r}: {attr}() raised {type(e).__name__}: {e}") from e
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload {ref!r}: {attr}() returned {type(workload).__name__}, expected autotune.Workload"
        )
    return dataclasses.replace(workload, source=source_of(ref))


def source_of(ref: str) -> str:
    """The ``Workload.source`` :func:`load_workload` gives ``ref``, without loading it: ``ref``,
    a file reference's path made absolute (valid from any working directory). A study's measuring
    child rebuilds the workload from it, and can start before this process has loaded it.

    Example:
        >>> from autotune.resolve import source_of
        >>> source_of("mlp-digits")
        'mlp-digits'
    """
    target, _, attr = ref.rpartition(":")
    if not target or not _is_file(target):  # a built-in name, random:SEED, package.module:build
        return ref
    return f"{Path(target).resolve()}:{attr}"


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _import_target(target: str, ref: str) -> Any:
    is_file = _is_file(target)
    try:
        if not is_file:
            return importlib.import_module(target)
        path = Path(target)
        if not path.is_file():
            raise WorkloadError(f"workload {ref!r}: file {target!r} does not exist")
        name = f"_autotune_user_workload_{abs(hash(path.resolve()))}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
        return module
    except WorkloadError:
        raise
    except ModuleNotFoundError as e:
        if not is_file and e.name is not None and target.startswith(e.name):
            raise WorkloadError(f"workload {ref!r}: no module named {target!r}") from None
        raise WorkloadError(f"workload {ref!r}: importing {target!r} raised {type(e).__name__}: {e}") from e
    except Exception as e:  # any error while importing user code becomes one line
        raise WorkloadError(f"workload {ref!r}: importing {target!r} raised {type(e).__name__}: {e}") from e
