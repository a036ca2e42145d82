"""`client/` uses httpx, httpcore and `ssl` through their public names only: a new minor
version that reworks those libraries' internals leaves it working (pyproject allows httpx <1).

Read from the source with `ast`. Flagged: an import of a private module or name of those
libraries; a private attribute of one of their modules or of a name imported from them; a private
attribute (read, written, or named to `getattr`) of any other object when the libraries define
that name; in a class built on one of their classes, a method or a `self` attribute whose name
is private to that base. Dunder names (`__enter__`, `__mro__`) are protocol, not private."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import ssl
import textwrap
from pathlib import Path

import httpcore
import httpx
import pytest

import evalpush.client

LIBRARIES = ("httpx", "httpcore", "ssl", "_ssl")
CLIENT = Path(evalpush.client.__file__).parent


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def of_a_library(module: str) -> bool:
    return module.split(".")[0] in LIBRARIES


def self_attributes(tree: ast.AST) -> set[str]:
    """Private names a source defines: methods and class attributes, and `self.X` it assigns."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    return {name for name in names if private(name)}


@functools.cache
def library_names() -> frozenset[str]:
    """Every private attribute name the libraries' own sources define."""
    sources = [Path(ssl.__file__)]
    for package in (httpx, httpcore):
        sources += Path(package.__file__).parent.rglob("*.py")
    names: set[str] = set()
    for source in sources:
        names |= self_attributes(ast.parse(source.read_bytes()))
    return frozenset(names)


def class_names(cls: type) -> set[str]:
    """The private names a library class and its library bases define."""
    names: set[str] = set()
    for base in cls.__mro__:
        if of_a_library(base.__module__):
            names |= {name for name in vars(base) if private(name)}
            for value in vars(base).values():  # `inspect.getsource(base)` looks in `httpx`
                if inspect.isfunction(value):
                    names |= self_attributes(ast.parse(textwrap.dedent(inspect.getsource(value))))
    return names


def library_imports(tree: ast.AST) -> tuple[dict[str, str], list[ast.AST]]:
    """Each local name bound to a library (its dotted path), and the imports of private parts."""
    imported: dict[str, str] = {}
    private_imports: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if of_a_library(a.name)):
                imported[(alias.asname or alias.name).split(".")[0]] = alias.name
                if any(private(part) for part in alias.name.split(".")[1:]):
                    private_imports.append(node)
        elif isinstance(node, ast.ImportFrom) and of_a_library(module := node.module or ""):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{module}.{alias.name}"
                if any(private(part) for part in [*module.split(".")[1:], alias.name]):
                    private_imports.append(node)
    return imported, private_imports


def resolve(node: ast.expr, imported: dict[str, str]) -> object | None:
    """The library object a dotted name stands for, if it stands for one."""
    if isinstance(node, ast.Name) and node.id in imported:
        module, _, path = imported[node.id].partition(".")
        value: object = importlib.import_module(module)
        for part in path.split(".") if path else []:
            value = getattr(value, part, None)
        return value
    if isinstance(node, ast.Attribute) and (base := resolve(node.value, imported)) is not None:
        return getattr(base, node.attr, None)
    return None


def is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def subclass_findings(tree: ast.AST, imported: dict[str, str]) -> list[ast.AST]:
    """In a class built on a library class: its methods, and `self` attributes, named as the
    base's private ones."""
    found: list[ast.AST] = []
    for cls in (node for node in ast.walk(tree) if isinstance(node, ast.ClassDef)):
        bases = [resolve(base, imported) for base in cls.bases]
        names = set().union(*(class_names(b) for b in bases if isinstance(b, type)))
        found += [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
        found += [
            n
            for n in ast.walk(cls)
            if isinstance(n, ast.Attribute) and is_self(n.value) and n.attr in names
        ]
    return found


def attribute_findings(tree: ast.AST, imported: dict[str, str]) -> list[ast.AST]:
    """Private attributes of a library's module or name, and any other object's private
    attribute (or `getattr` of one) that the libraries define."""
    found: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            if resolve(node.value, imported) is not None or (
                not is_self(node.value) and node.attr in library_names()
            ):
                found.append(node)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in library_names()
        ):
            found.append(node)
    return found


def findings(source: str, where: str = "<source>") -> list[str]:
    """What `source` touches of the libraries' private parts, one line each."""
    tree = ast.parse(source)
    imported, found = library_imports(tree)
    found += subclass_findings(tree, imported) + attribute_findings(tree, imported)
    return [
        f"{where}:{getattr(node, 'lineno', 0)}: {ast.unparse(node).splitlines()[0]}"
        for node in found
    ]


def test_the_client_touches_no_private_name_of_httpx_httpcore_or_ssl() -> None:
    found = [
        line
        for path in sorted(CLIENT.rglob("*.py"))
        for line in findings(path.read_text(), str(path.relative_to(CLIENT.parent)))
    ]
    assert found == []


USES = {
    "a private module": "from httpx._transports.default import HTTPTransport",
    "a private module attribute": "import ssl\nssl._create_unverified_context()",
    "an SSLSocket's private object": "def f(sock):\n    return sock._sslobj",
    "getattr of a private name": "def f(sock):\n    return getattr(sock, '_sslobj')",
    "a base's private method overridden": (
        "import httpx\nclass C(httpx.Client):\n    def _init_transport(self, **kw): ..."
    ),
    "a base's private attribute set": (
        "import httpx\nclass T(httpx.HTTPTransport):\n"
        "    def __init__(self, pool):\n        self._pool = pool"
    ),
}


@pytest.mark.parametrize("source", USES.values(), ids=USES.keys())
def test_the_check_finds_each_kind_of_private_use(source: str) -> None:
    assert findings(source) != []


def test_the_check_leaves_a_subclass_its_own_private_names() -> None:
    source = (
        "import httpcore\nclass S(httpcore.NetworkStream):\n"
        "    def __init__(self, sock):\n        self._sock = sock\n"
        "    def close(self):\n        self._sock.close()\n"
    )
    assert findings(source) == []
