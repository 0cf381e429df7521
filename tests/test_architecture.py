"""The floors of docs/architecture.md, checked on the source: no import runs up a floor, backends reach each other
only through a package's public API, and no two packages import each other (type-only imports aside)."""

from __future__ import annotations

import ast
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

    yield from (m for m in walk(ast.parse(path.read_text()).body) if m.startswith("execspace"))


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
