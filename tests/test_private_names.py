"""`client/` uses httpx, httpcore and `ssl` through their public names only, so a new minor
version of httpx cannot break it unannounced.

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


def findings(source: str, where: str = "<source>") -> list[str]:
    """What `source` touches of the libraries' private parts, one line each."""
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # a local name -> the library object it stands for
    found: list[str] = []

    def say(node: ast.AST, what: str) -> None:
        found.append(f"{where}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if of_a_library(alias.name):
                    imported[(alias.asname or alias.name).split(".")[0]] = alias.name
                    if any(private(part) for part in alias.name.split(".")[1:]):
                        say(node, f"imports {alias.name}")
        elif isinstance(node, ast.ImportFrom) and of_a_library(node.module or ""):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                if any(private(p) for p in [*node.module.split(".")[1:], alias.name]):  # type: ignore[union-attr]
                    say(node, f"imports {alias.name} from {node.module}")

    def resolve(node: ast.expr) -> object | None:
        """The library object a dotted name stands for, if it stands for one."""
        if isinstance(node, ast.Name) and node.id in imported:
            module, _, name = imported[node.id].partition(".")
            value: object = importlib.import_module(module)
            for part in name.split(".") if name else []:
                value = getattr(value, part)
            return value
        if isinstance(node, ast.Attribute) and (base := resolve(node.value)) is not None:
            return getattr(base, node.attr, None)
        return None

    subclass_names: dict[ast.AST, set[str]] = {}  # a class's node -> its library bases' names
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [resolve(base) for base in node.bases]
            names = set().union(*(class_names(b) for b in bases if isinstance(b, type)))
            subclass_names[node] = names
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name in names:
                    say(item, f"{node.name} overrides {item.name} of its library base")
    for cls, names in subclass_names.items():
        for node in ast.walk(cls):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
                and node.attr in names
            ):
                say(node, f"{cls.name} uses {node.attr} of its library base")  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            is_self = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if resolve(node.value) is not None:
                say(node, f"{ast.unparse(node)}: a private name of a library")
            elif not is_self and node.attr in library_names():
                say(node, f"{ast.unparse(node)}: {node.attr} is a library's private name")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "setattr", "hasattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and private(node.args[1].value)
            and node.args[1].value in library_names()
        ):
            say(node, f"{node.func.id}(..., {node.args[1].value!r}): a library's private name")
    return found


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
