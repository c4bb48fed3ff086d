"""The shape of ``src/tether``: no import circles, and the layers import downwards only.

An edge is an ``import`` or ``from ... import`` anywhere in a module, including those
under ``if TYPE_CHECKING:`` (a type-only import of an owner is a circle too). ``from
package import name`` is an edge to ``package.name`` when that is a module, else to
the package. Executing a package's ``__init__`` on the way to one of its modules is
not counted: the rooms' ``__init__`` files re-export what other rooms use, and modules
inside a room import their siblings directly.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(current: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = current.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def import_graph() -> dict[str, set[str]]:
    """Module → the project modules it imports."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_graph_sees_type_checking_imports() -> None:
    graph = import_graph()
    # Guards the checker itself: a module known to import a sibling under
    # TYPE_CHECKING only must show that edge.
    assert "tether.engine.streams.stream" in graph["tether.engine.broker"]
    assert graph["tether.engine.consumers.consumer"]


def test_find_cycles_reports_a_circle() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_src() -> None:
    cycles = find_cycles(import_graph())
    assert cycles == [], "import circles:\n" + "\n".join(" ↔ ".join(c) for c in cycles)


# Which rooms a room may import. Listed rooms only: engine rooms never reach the front
# doors, the SDK never reaches the server, and so on (ARCHITECTURE.md's layers).
_FORBIDDEN = {
    "tether.protocol": ("tether.engine", "tether.storage", "tether.server", "tether.client"),
    "tether.engine": ("tether.server", "tether.client", "tether.spark", "tether.cli"),
    "tether.storage": ("tether.engine", "tether.server", "tether.client"),
    "tether.client": ("tether.engine", "tether.storage", "tether.server"),
    "tether.engine.streams": ("tether.engine.consumers", "tether.engine.jobs"),
    "tether.engine.consumers": ("tether.engine.jobs", "tether.engine.broker"),
    "tether.engine.broker": ("tether.engine.consumers", "tether.engine.jobs"),
}


@pytest.mark.parametrize("room", sorted(_FORBIDDEN))
def test_rooms_import_downwards(room: str) -> None:
    graph = import_graph()
    wrong = sorted(
        f"{module} → {target}"
        for module, targets in graph.items()
        if module == room or module.startswith(room + ".")
        for target in targets
        for banned in _FORBIDDEN[room]
        if target == banned or target.startswith(banned + ".")
    )
    assert wrong == []
