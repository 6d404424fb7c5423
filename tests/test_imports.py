"""Imports inside the autotune package point one way: no import cycles, none up the layers.

Imports inside functions (deliberately lazy) count as much as module-level ones: a circle of
modules that call each other is one tangle however late its imports run, and a lazy import up the
layers is still a lower layer depending on a higher one. Only imports under ``if TYPE_CHECKING:``
(never run) are left out. ``envs/`` and ``policies/`` install as ``autotune.envs`` and
``autotune.policies`` (pyproject's package-dir), so they are read as such. And no module imports
another module's private (``_name``) names: a name used across modules is public in its one home.
The graph is read by scripts/architecture_diagram.py, which also draws it into ARCHITECTURE.md:
the last test here fails when that drawing is not what the code says.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _load_reader() -> ModuleType:
    """scripts/architecture_diagram.py: the one reader of the package's imports (it also draws
    ARCHITECTURE.md's diagram from them)."""
    spec = importlib.util.spec_from_file_location("architecture_diagram", ROOT / "scripts" / "architecture_diagram.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


reader = _load_reader()
import_graph = reader.import_graph


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


def test_no_cycles_between_homes_lazy_imports_included() -> None:
    cycle = find_cycle(reader.home_graph(import_graph(lazy=True)))
    assert cycle is None, "homes that import each other (lazy imports included): " + " -> ".join(cycle or [])


def test_every_home_has_a_layer() -> None:
    homes = {name.split(".")[1] for name in import_graph() if name.count(".") >= 1}
    unplaced = sorted(h for h in homes if reader.layer(f"autotune.{h}") is None)
    assert unplaced == [], f"modules of no layer (add them to LAYERS in scripts/architecture_diagram.py): {unplaced}"


def test_imports_point_down_the_layers_lazy_imports_included() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in import_graph(lazy=True).items()
        for target in targets
        if (a := reader.layer(module)) is not None and (b := reader.layer(target)) is not None and b > a
    )
    assert upward == [], "imports that point up the layers (lazy imports included):\n" + "\n".join(upward)


#: Private names one module may import from another, each with why. Empty: a name used across
#: modules is public in its one home.
PRIVATE_IMPORTS: dict[str, str] = {}


def private_imports(modules: dict[str, Path] | None = None) -> list[str]:
    """``module -> source._name`` for every private name a module of ``modules`` (default: the
    package's) imports from another (module-level and lazy imports alike; dunders are not private)."""
    modules = reader.modules() if modules is None else modules
    found = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            source = reader.source_of(node, name, path.name == "__init__.py")
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


def test_architecture_diagram_is_drawn_from_the_code() -> None:
    block = reader.current_block(reader.ARCHITECTURE.read_text())
    assert block is not None, f"ARCHITECTURE.md lost its diagram markers: {reader.BEGIN} ... {reader.END}"
    assert block == reader.diagram(), f"ARCHITECTURE.md's diagram is not the code's imports: run {reader.REGENERATE}"


def test_reduced_leaves_out_implied_arrows_only() -> None:
    graph = {"a": {"b", "c", "d"}, "b": {"c"}, "c": set(), "d": set()}
    assert reader.reduced(graph) == {"a": {"b", "d"}, "b": {"c"}, "c": set(), "d": set()}
