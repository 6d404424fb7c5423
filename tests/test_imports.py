"""Imports inside the autotune package point one way: no import cycles, none up the layers.

Imports inside functions (deliberately lazy) count as much as module-level ones: a circle of
modules that call each other is one tangle however late its imports run, and a lazy import up the
layers is still a lower layer depending on a higher one. Only imports under ``if TYPE_CHECKING:``
(never run) are left out. ``envs/`` and ``policies/`` install as ``autotune.envs`` and
``autotune.policies`` (pyproject's package-dir), so they are read as such. And no module imports
another module's private (``_name``) names: a name used across modules is public in its one home.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Source folder -> the package it installs as.
PACKAGES = {"autotune": "autotune", "envs": "autotune.envs", "policies": "autotune.policies"}


def _modules() -> dict[str, Path]:
    """Every module of the installed package, by dotted name."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((package, *parts))] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_level(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Import statements run at import time: not in a def or class body, not under TYPE_CHECKING."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                found += _module_level(node.body)
            found += _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                found += _module_level(block)
        elif isinstance(node, ast.With):
            found += _module_level(node.body)
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The autotune modules an import statement loads (``from pkg import sub`` loads ``pkg.sub``)."""
    if isinstance(node, ast.Import):
        return {alias.name for alias in node.names if alias.name in modules}
    base = _source(node, module, is_package)
    targets = {f"{base}.{alias.name}" for alias in node.names} & modules
    if base in modules and len(targets) < len(node.names):
        targets.add(base)
    return targets


def _source(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted name ``from X import ...`` reads from, a relative ``X`` resolved."""
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        package = module if is_package else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{base}" if base else package
    return base


def _lazy(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Import statements run when a function runs: inside a def (not under TYPE_CHECKING)."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found += _module_level(node.body)
            found += [
                n
                for inner in node.body
                for n in ast.walk(inner)
                if isinstance(n, ast.Import | ast.ImportFrom) and not _under_type_checking(n, node)
            ]
    return found


def _under_type_checking(target: ast.AST, root: ast.AST) -> bool:
    """Whether ``target`` sits in an ``if TYPE_CHECKING:`` body somewhere below ``root``."""
    for node in ast.walk(root):
        if (
            isinstance(node, ast.If)
            and _is_type_checking(node.test)
            and any(target is n for stmt in node.body for n in ast.walk(stmt))
        ):
            return True
    return False


def import_graph(*, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the autotune modules it imports at module level (``lazy``: also inside functions)."""
    modules = _modules()
    names = set(modules)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in _module_level(tree.body) + (_lazy(tree) if lazy else []):
            edges |= _targets(node, name, is_package, names)
        graph[name] = edges - {name}
    return graph


def _home(module: str) -> str | None:
    """``autotune.<home>`` for a module of a home (a sub-package, ``envs`` and ``policies`` included)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) >= 2 and parts[1] in _HOMES else None


_HOMES = {p.parent.name for p in (ROOT / "autotune").glob("*/__init__.py")} | {"envs", "policies"}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that starts and ends at the same module, or None."""
    done: set[str] = set()
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> list[str] | None:
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_stack:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle is not None:
                    return cycle
        stack.pop()
        on_stack.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_graph_reads_the_package() -> None:
    graph = import_graph()
    assert "autotune.workload" in graph["autotune.zoo"]
    assert "autotune.envs.core" in graph
    # Lazy imports inside functions are not edges.
    assert "autotune.procs.multirank" not in graph["autotune.measurement.schedule"]


def test_no_import_cycles_lazy_imports_included() -> None:
    cycle = find_cycle(import_graph(lazy=True))
    assert cycle is None, "import cycle (lazy imports included): " + " -> ".join(cycle or [])


def test_lazy_imports_are_edges_of_the_lazy_graph() -> None:
    lazy = import_graph(lazy=True)
    assert "autotune.memory.model" in lazy["autotune.memory.audit"]  # inside audit()
    assert "autotune.memory.model" not in import_graph()["autotune.memory.audit"]


def _home_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Home -> the other homes its modules import (a module outside any home stands for itself)."""
    homes: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = _home(module) or module
        homes.setdefault(source, set()).update((_home(t) or t) for t in targets)
        homes[source].discard(source)
    return homes


def test_no_cycles_between_homes_lazy_imports_included() -> None:
    cycle = find_cycle(_home_graph(import_graph(lazy=True)))
    assert cycle is None, "homes that import each other (lazy imports included): " + " -> ".join(cycle or [])


#: The architecture's layers, lowest first (see ARCHITECTURE.md): a module may import modules of
#: its own layer or below, never above. ``procs`` sits above ``measurement``: a rank runs the
#: measurement schedule, and nothing in ``measurement/`` imports ``procs/``, lazily or not.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "errors",
        "dependencies",
        "settings",
        "units",
        "_lazy",
        "console",
        "config",
        "knobs",
        "workload",
        "batches",
        "worst_case",
        "zoo",
        "resolve",
    ),
    ("train",),
    ("measurement",),
    ("memory", "procs"),
    ("search", "envs", "report"),
    ("policies", "adapt", "integrations"),
    ("cli",),
)


def _layer(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None  # the package itself: the lazy public API
    for rank, homes in enumerate(LAYERS):
        if parts[1] in homes:
            return rank
    return None


def test_every_home_has_a_layer() -> None:
    homes = {name.split(".")[1] for name in import_graph() if name.count(".") >= 1}
    unplaced = sorted(h for h in homes if _layer(f"autotune.{h}") is None)
    assert unplaced == [], f"modules of no layer (add them to LAYERS and ARCHITECTURE.md): {unplaced}"


def test_imports_point_down_the_layers_lazy_imports_included() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph(lazy=True).items()
        for target in targets
        if (a := _layer(module)) is not None and (b := _layer(target)) is not None and b > a
    )
    assert upward == [], "imports that point up the layers (lazy imports included):\n" + "\n".join(upward)


#: Private names one module may import from another, each with why. Empty: a name used across
#: modules is public in its one home.
PRIVATE_IMPORTS: dict[str, str] = {}


def private_imports(modules: dict[str, Path] | None = None) -> list[str]:
    """``module -> source._name`` for every private name a module of ``modules`` (default: the
    package's) imports from another (module-level and lazy imports alike; dunders are not private)."""
    modules = _modules() if modules is None else modules
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = _source(node, name, path.name == "__init__.py")
            if source in modules and source != name:
                found += [f"{name} -> {source}.{a.name}" for a in node.names if _private(a.name)]
    return sorted(found)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_private_imports_reads_lazy_and_relative_imports(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(
        "from pkg.b import _x, y, __version__\ndef f():\n    from .b import _z\n    from os import _exit\n"
    )
    (tmp_path / "b.py").write_text("from pkg.b import _self\n")
    modules = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    assert private_imports(modules) == ["pkg.a -> pkg.b._x", "pkg.a -> pkg.b._z"]


def test_no_module_imports_another_modules_private_names() -> None:
    found = [line for line in private_imports() if line.split(" -> ")[1] not in PRIVATE_IMPORTS]
    assert found == [], "private names imported from another module (make them public in one home):\n" + "\n".join(
        found
    )
