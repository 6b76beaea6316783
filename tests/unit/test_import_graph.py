"""The deploykit package has no import cycle.

The graph is built from the source (ast), not by importing it, so it also sees imports inside
function bodies: a function-level import hides a cycle from Python's import machinery, but the
two modules still depend on each other. Edges, for absolute and relative imports alike:

- `import pkg.a.b` / `from pkg.a import b` depend on the module named and on each package above
  it (importing a submodule runs its package's `__init__` first), and on `pkg.a.b` when `b` is
  a submodule;
- a module's dependency on a package that contains it is left out: the child importing its
  parent `__init__`, which imports the child, is how Python packages work, not a cycle;
- imports under `if TYPE_CHECKING:` are left out: they never run, they only name types.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# The sources next to this test (the checkout under test), not an installed copy.
PACKAGE_DIR = Path(__file__).resolve().parents[2] / "tools" / "deploykit"


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str  # path:line of the import statement, for the failure message


def modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its
    `__init__.py`)."""
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except those under `if TYPE_CHECKING:`."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _with_ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _imported(node: ast.Import | ast.ImportFrom, source: str, is_package: bool,
              known: set[str]) -> list[str]:
    """The modules (and packages) one import statement runs, in or out of the package."""
    if isinstance(node, ast.Import):
        return [n for alias in node.names for n in _with_ancestors(alias.name)]
    if node.level:
        # Relative to the importing module's package (a package __init__ is its own package).
        package = source.split(".")
        if not is_package:
            package = package[:-1]
        base = ".".join(package[:len(package) - (node.level - 1)]
                        + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    out = _with_ancestors(base)
    # `from package import name`: name may be a submodule, which then runs too.
    out += [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
    return out


def import_graph(package_dir: Path) -> list[Edge]:
    """The import edges among the modules of the package in `package_dir`."""
    mods = modules(package_dir)
    known = set(mods)
    edges = []
    for source, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in _runtime_imports(tree):
            for target in _imported(node, source, is_package, known):
                if target not in known or target == source:
                    continue
                if source.startswith(target + "."):
                    continue  # a child importing a package it is in (module docstring)
                rel = path.relative_to(package_dir.parent).as_posix()
                edges.append(Edge(source, target, f"{rel}:{node.lineno}"))
    return edges


@dataclass(frozen=True)
class Cycle:
    modules: frozenset[str]  # the whole strongly connected component
    path: tuple[Edge, ...]  # one cycle through it, import by import

    def describe(self) -> str:
        lines = [f"  {' -> '.join([e.source for e in self.path] + [self.path[0].source])}"]
        lines += [f"    {e.source} -> {e.target}  ({e.where})" for e in self.path]
        rest = sorted(self.modules - {e.source for e in self.path})
        if rest:
            lines.append(f"    (also in this cycle: {', '.join(rest)})")
        return "\n".join(lines)


def import_cycles(edges: list[Edge]) -> list[Cycle]:
    """The strongly connected components of more than one module (Tarjan), each with one
    concrete cycle through it."""
    graph: dict[str, list[Edge]] = {}
    for e in edges:
        graph.setdefault(e.source, []).append(e)
        graph.setdefault(e.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.target not in index:
                connect(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [Cycle(frozenset(c), _cycle_in(c, graph)) for c in sorted(components)]


def _cycle_in(component: list[str], graph: dict[str, list[Edge]]) -> tuple[Edge, ...]:
    """A shortest cycle through the component's first module (breadth-first search)."""
    members = set(component)
    start = component[0]
    came_by: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in graph[v]:
                if e.target not in members:
                    continue
                if e.target == start:
                    path = [e]
                    while path[0].source != start:
                        path.insert(0, came_by[path[0].source])
                    return tuple(path)
                if e.target not in came_by:
                    came_by[e.target] = e
                    nxt.append(e.target)
        frontier = nxt
    raise AssertionError(f"{component} is not strongly connected")


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root / "pkg"


def test_the_graph_sees_function_level_relative_and_parent_imports(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "from .sub import thing\n",  # relative; parent -> child
        "pkg/a.py": "def f():\n    from pkg.sub import deep\n",  # in a function; a submodule
        "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n"
                    "else:\n    import json\nimport pkg\n",  # types only; its own package
        "pkg/sub/__init__.py": "from . import deep\n",
        "pkg/sub/deep.py": "from .. import b\n",  # two levels up, a module
    })
    edges = {(e.source, e.target) for e in import_graph(pkg)}
    assert edges == {("pkg", "pkg.sub"), ("pkg.sub", "pkg.sub.deep"), ("pkg.a", "pkg.sub"),
                     ("pkg.a", "pkg.sub.deep"), ("pkg.sub.deep", "pkg.b")}
    assert import_cycles(import_graph(pkg)) == []


def test_a_function_level_import_can_close_a_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/one/__init__.py": "from pkg.two.x import f\n",
        "pkg/two/__init__.py": "from pkg.two.x import f\n",
        "pkg/two/x.py": "def f():\n    import pkg.one\n",
    })
    (cycle,) = import_cycles(import_graph(pkg))
    assert cycle.modules == {"pkg.one", "pkg.two", "pkg.two.x"}
    assert "pkg/two/x.py:2" in cycle.describe()


def test_import_cycles_finds_a_cycle_and_names_each_import():
    e = [Edge("a", "b", "a.py:1"), Edge("b", "c", "b.py:2"), Edge("c", "a", "c.py:3"),
         Edge("c", "d", "c.py:4"), Edge("b", "a", "b.py:5")]
    (cycle,) = import_cycles(e)
    assert cycle.modules == {"a", "b", "c"}
    assert [(x.source, x.target) for x in cycle.path] == [("a", "b"), ("b", "a")]
    assert "a -> b -> a" in cycle.describe() and "also in this cycle: c" in cycle.describe()
    assert import_cycles([e[0], e[1], e[3]]) == []


def test_no_import_cycle():
    found = import_cycles(import_graph(PACKAGE_DIR))
    assert not found, "import cycle(s) in deploykit:\n" + "\n".join(c.describe() for c in found)
