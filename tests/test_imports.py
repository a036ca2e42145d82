"""The package's import graph: modules grouped in floors, each importing only from its own floor
or below, and no cycle anywhere (ARCHITECTURE.md, "The tree").

Read from the source with `ast` (imports inside `if TYPE_CHECKING:` are left out: they never run),
so it also holds for imports made inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import evalpush

PACKAGE = Path(evalpush.__file__).parent

FLOORS: list[set[str]] = [
    {"evalpush", "evalpush.core"},
    {"evalpush.log"},
    {"evalpush.config"},
    {
        "evalpush.discover",
        "evalpush.runs",
        "evalpush.convert",
        "evalpush.client",
        "evalpush.ledger",
        "evalpush.local_platform",
    },
    {"evalpush.upload"},
    {"evalpush.app"},
    {"evalpush.service", "evalpush.push"},
    {"evalpush.cli", "evalpush.__main__"},
]
"""Each floor's top-level parts; a module's floor is its part's."""


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(("evalpush", *path.relative_to(PACKAGE).with_suffix("").parts))
        found[name.removesuffix(".__init__")] = path
    return found


def part(module: str) -> str:
    return ".".join(module.split(".")[:2])


def floor(module: str) -> int:
    return next(i for i, parts in enumerate(FLOORS) if part(module) in parts)


def graph() -> dict[str, set[str]]:
    known = modules()
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_bytes())
        skipped = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parent, *([base] if base else [])])
                # `from P import name`: the submodule P.name if there is one, else P itself
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("evalpush"):
                    edges[name].add(target)
    return edges


def test_every_module_has_a_floor() -> None:
    assert [name for name in modules() if not any(part(name) in f for f in FLOORS)] == []


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    upward = [
        f"{name} (floor {floor(name)}) imports {target} (floor {floor(target)})"
        for name, targets in graph().items()
        for target in sorted(targets)
        if floor(target) > floor(name)
    ]
    assert upward == []


def test_the_import_graph_has_no_cycle() -> None:
    edges = graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(edges[node]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    assert cycles == []
