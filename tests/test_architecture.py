"""The floors of docs/architecture.md, checked on the source: no import runs up a floor, backends reach each other
only through a package's public API, and no two packages import each other (type-only imports aside)."""

from __future__ import annotations

import ast
import inspect
import typing
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "execspace"

#: Floor of each top-level module or package of execspace (docs/architecture.md).
GROUND = (
    "models",
    "errors",
    "capabilities",
    "envpolicy",
    "languages",
    "mime",
    "artifacts",
    "owner",
    "rundirs",
    "userconfig",
    "tomlconfig",
    "listening",
    "tracing",
    "otel",
    "scrape",
    "audit",
)
FLOORS = {
    **dict.fromkeys(GROUND, 0),
    "workspace": 1,
    "environments": 2,
    "process": 2,
    **dict.fromkeys(("protocols", "backend", "engine", "keywords", "registry"), 3),
    "backends": 4,
    **dict.fromkeys(("executor", "sync", "testing"), 5),
    "tools": 6,
    "cli": 7,
    "server": 7,
    "mcp": 7,
    "agent": 7,
    "integrations": 7,
    "__main__": 8,
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = ("execspace", *path.relative_to(PACKAGE).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, *, type_only: bool = False) -> Iterator[str]:
    """execspace modules ``name`` imports anywhere (functions included: a lazy import is a dependency too), except
    under ``if TYPE_CHECKING`` unless ``type_only``."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    yield from _imports_in(path.read_text(), package, type_only=type_only)


def _imports_in(source: str, package: str, *, type_only: bool = False) -> Iterator[str]:
    def walk(body: list[ast.stmt]) -> Iterator[str]:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and not type_only:
                continue
            if isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = (f"{base}.{node.module}" if node.module else base) if node.level else node.module or ""
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    yield sub if sub in MODULES else target
            elif isinstance(node, ast.Import):
                yield from (alias.name for alias in node.names)
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(node, field, None)
                if isinstance(inner, list):
                    yield from walk(inner)

    yield from (m for m in walk(ast.parse(source).body) if m.startswith("execspace"))


EDGES = {name: set(_imports(name)) for name in MODULES}


def _floor(module: str) -> int | None:
    parts = module.split(".")
    return FLOORS.get(parts[1]) if len(parts) > 1 else None  # the package itself: its lazy public namespace


def _unit(module: str) -> str:
    """The package a module belongs to for the cycle check: execspace.X, or execspace.backends.X."""
    parts = module.split(".")
    return ".".join(parts[:3] if len(parts) > 2 and parts[1] == "backends" else parts[:2])


def test_every_module_has_a_floor() -> None:
    assert [m for m in MODULES if m != "execspace" and _floor(m) is None] == []


def test_no_import_runs_up_a_floor() -> None:
    upward = []
    for name, targets in EDGES.items():
        for target in targets:
            here, there = _floor(name), _floor(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{name} (floor {here}) -> {target} (floor {there})")
    assert upward == []


def test_backends_use_each_other_only_through_the_public_package() -> None:
    reaching = set()
    for name, targets in EDGES.items():
        for target in targets:
            sibling = _floor(name) == _floor(target) == FLOORS["backends"] and _unit(name) != _unit(target)
            if sibling and target != _unit(target):  # a module inside another backend's package
                reaching.add(f"{name} -> {target}")
    assert reaching == set()


def test_components_use_backends_only_through_their_public_package() -> None:
    """The server, CLI, MCP server, tools… see a backend through its package's face (``execspace.backends.X``),
    never one of its modules, not even for a type (the test kit, below them, may reach in)."""
    reaching = set()
    for name in MODULES:
        floor = _floor(name)
        if floor is None or floor <= FLOORS["testing"]:
            continue
        for target in _imports(name, type_only=True):
            if _floor(target) == FLOORS["backends"] and target.count(".") > 2:
                reaching.add(f"{name} -> {target}")
    assert reaching == set()


def test_no_two_packages_import_each_other() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    for name, targets in EDGES.items():
        graph[_unit(name)].update(_unit(t) for t in targets if _unit(t) != _unit(name))
    cycles = []
    for start in sorted(graph):
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start and start != "execspace":
                    cycles.append(" -> ".join([*path, nxt]))
                elif nxt not in seen and nxt != "execspace":
                    seen.add(nxt)
                    stack.append((nxt, [*path, nxt]))
    assert cycles == []


#: Where the types the seam's protocols name may come from: the ground's vocabulary, the protocols themselves, the
#: standard library's; never the machinery (workspace/, process/) or a backend.
_SEAM_TYPE_MODULES = {f"execspace.{m}" for m in (*GROUND, "protocols")}


def _named_types(hint: object) -> Iterator[type]:
    """The classes a resolved annotation names, through unions, generics and ``Literal`` (whose values are no type)."""
    if isinstance(hint, type) and not typing.get_args(hint):
        yield hint
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return
    if isinstance(origin, type):
        yield origin
    for arg in typing.get_args(hint):
        yield from _named_types(arg)


def _member_hints(cls: type) -> Iterator[tuple[str, object]]:
    yield from ((f"{cls.__name__}.{n}", h) for n, h in typing.get_type_hints(cls).items())
    for name, member in vars(cls).items():
        func = member.fget if isinstance(member, property) else member
        if inspect.isfunction(func) and (not name.startswith("_") or name in ("__aenter__", "__aexit__")):
            yield from ((f"{cls.__name__}.{name}:{n}", h) for n, h in typing.get_type_hints(func).items())


def test_the_seams_protocols_name_no_internal_type() -> None:
    """Every annotation of the seam (attributes, parameters, results) resolves, at run time, to a ground type, a
    protocol of the seam or a standard one: a backend author implements them without importing the machinery."""
    import execspace.protocols as seam

    internal = []
    for name in seam.__all__:
        for where, hint in _member_hints(getattr(seam, name)):
            internal += [
                f"{where}: {t.__module__}.{t.__qualname__}"
                for t in _named_types(hint)
                if t.__module__.startswith("execspace") and t.__module__ not in _SEAM_TYPE_MODULES
            ]
    assert internal == []


#: Module cycles that other work removes; each entry names it. Nothing may join this list.
def _module_cycles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each as a sorted tuple."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                cycles.add(tuple(sorted([node, *component])))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    """No import cycle between modules, a lazy import (in a function) counting as much as one at the top; only
    imports under ``if TYPE_CHECKING`` are left out. A package's ``__init__`` counts as a module."""
    edges = {name: {t for t in targets if t in MODULES and t != name} for name, targets in EDGES.items()}
    assert _module_cycles(edges) == set()


def test_the_cycle_check_finds_a_lazy_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert _module_cycles(edges) == {("a", "b", "c")}
    source = "def f():\n    with x:\n        from .models import X\nif TYPE_CHECKING:\n    from . import errors\n"
    assert list(_imports_in(source, "execspace")) == ["execspace.models"]


def test_tools_use_the_workspace_package_only_through_its_face() -> None:
    """tools/ stand on the seam and public APIs: from workspace/ only what its face (``execspace.workspace``)
    exports, never one of its modules, whose names are the backends' machinery."""
    reaching = sorted(
        f"{name} -> {target}"
        for name, targets in EDGES.items()
        if name.startswith("execspace.tools.")
        for target in targets
        if target.startswith("execspace.workspace.")
    )
    assert reaching == []


def test_tools_and_cli_name_no_machinery_module() -> None:
    """What the seam's acceptance check greps for: not even a string naming these modules in tools/ or cli/."""
    fragments = ("workspace.confine", "workspace.staging", "workspace.hostfs", "sandbox.bwrap", "sandbox.policy import")
    naming = sorted(
        f"{path.relative_to(PACKAGE)}: {fragment}"
        for folder in ("tools", "cli")
        for path in (PACKAGE / folder).rglob("*.py")
        for fragment in fragments
        if fragment in path.read_text()
    )
    assert naming == []


def test_the_workspace_face_exports_what_it_names() -> None:
    import execspace.workspace as face

    assert sorted(face.__all__) == sorted(face._LAZY)
    assert all(getattr(face, name).__name__ == name for name in face.__all__)
