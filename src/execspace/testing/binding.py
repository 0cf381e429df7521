"""How a backend binds the conformance kit: an :class:`EngineBinding` (how to open an engine, what it cannot do),
offered to the kit's cases as the ``engine_binding`` fixture, and the fixtures the cases use on top of it.

Needs pytest and pytest-asyncio (the rest of execspace never imports this module).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest
import pytest_asyncio

import execspace
from execspace.engine import open_engine_from
from execspace.registry import probe_backend

__all__ = [
    "BindContext",
    "EngineBinding",
    "Feature",
    "any_engine",
    "any_ws",
    "backend_binding",
    "bind",
    "make_traversable",
    "needs",
    "needs_programs",
    "open_bound",
]


class Feature(enum.StrEnum):
    """What a case may need beyond the file API; a binding lists the ones its engine lacks."""

    PROGRAMS = "programs"
    """``runner.run_program`` / ``start_program`` run programs in the workspace."""


@dataclass(frozen=True, slots=True)
class BindContext:
    """What a binding gets to open its engine for one test."""

    request: pytest.FixtureRequest
    """The test's request: a binding that needs other fixtures (a daemon, a server) asks it for them."""
    tmp_path: Path
    workspace_root: Path
    """Where the engine keeps its workspaces (``tmp_path/ws``)."""
    host_roots: tuple[Path, ...]
    """The host directories ``host://`` inputs may come from (``tmp_path/host`` unless the suite says otherwise)."""


Opener = Callable[[BindContext], AbstractAsyncContextManager[execspace.BaseEngine]]


@dataclass(frozen=True, slots=True)
class EngineBinding:
    """One mode of one backend, as the kit sees it.

    ``open`` opens an engine for one test (and may ``pytest.skip`` with the reason when it cannot run here);
    ``lacks`` names the features this mode does not have, each with the reason its cases are skipped.
    """

    name: str
    open: Opener
    lacks: Mapping[Feature, str] = field(default_factory=lambda: MappingProxyType({}))


def backend_binding(
    backend: str,
    *,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    probe_options: Mapping[str, object] | None = None,
    lacks: Mapping[Feature, str] | None = None,
    traversable: bool = False,
) -> EngineBinding:
    """The binding of a registered backend (built in or from the ``execspace.backends`` entry-point group):
    probed with ``probe_options`` (a failed probe skips, with its reason and fix), then opened with
    ``execspace.open_engine(backend, workspace_root=..., host_roots=..., **options)``: the keywords its options
    class takes (see :mod:`execspace.backend`).

    ``traversable``: the backend runs programs as another uid (the sandbox as root), which must reach the
    workspace root through the test's tmp dirs.
    """
    opts: dict[str, Any] = dict(options or {})  # any option of any backend: checked when it opens
    probing = dict(probe_options or {})

    @contextlib.asynccontextmanager
    async def open_engine(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
        probe = await probe_backend(backend, **probing)
        if not probe.ok:
            pytest.skip(f"backend {backend} unavailable here: {probe.reason} (fix: {probe.fix})")
        if traversable:
            make_traversable(ctx.tmp_path)
        keywords = {"workspace_root": ctx.workspace_root, "host_roots": list(ctx.host_roots), **opts}
        async with open_engine_from(backend, keywords) as engine:
            yield engine

    return EngineBinding(name or backend, open_engine, MappingProxyType(dict(lacks or {})))


def bind(*bindings: EngineBinding) -> Any:
    """The ``engine_binding`` fixture over ``bindings`` (test ids are their names): assign it in the module
    that star-imports the kit, or in a conftest.py above it."""

    @pytest.fixture(name="engine_binding", params=bindings, ids=[b.name for b in bindings])
    def engine_binding(request: pytest.FixtureRequest) -> EngineBinding:
        binding: EngineBinding = request.param
        return binding

    return engine_binding


@contextlib.asynccontextmanager
async def open_bound(
    binding: EngineBinding, request: pytest.FixtureRequest, tmp_path: Path, host_roots: Sequence[Path] | None = None
) -> AsyncIterator[execspace.BaseEngine]:
    """An engine of ``binding`` rooted in ``tmp_path/ws``, for suites that open engines themselves.
    ``host_roots`` defaults to ``tmp_path/host``."""
    roots = (tmp_path / "host",) if host_roots is None else tuple(host_roots)
    async with binding.open(BindContext(request, tmp_path, tmp_path / "ws", roots)) as engine:
        yield engine


@pytest_asyncio.fixture
async def any_engine(
    engine_binding: EngineBinding, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[execspace.BaseEngine]:
    """The engine each case runs on, opened by the ``engine_binding`` fixture the binder provides."""
    async with open_bound(engine_binding, request, tmp_path) as engine:
        yield engine


@pytest_asyncio.fixture
async def any_ws(any_engine: execspace.BaseEngine) -> execspace.Workspace:
    return await any_engine.manager.create_workspace("conf/user/session")


@pytest.fixture
def needs_programs(engine_binding: EngineBinding) -> None:
    """Skips (before the engine opens) when the binding lacks programs; cases use it through :func:`needs`."""
    _require(engine_binding, Feature.PROGRAMS)


def _require(binding: EngineBinding, feature: Feature) -> None:
    if feature in binding.lacks:
        pytest.skip(f"{binding.name} has no {feature}: {binding.lacks[feature]}")


def needs(*features: Feature) -> pytest.MarkDecorator:
    """Marks a case that needs ``features``: on a binding that lacks one it is skipped with the binding's reason.

    A plain ``usefixtures`` mark, so binders register no marker of ours.
    """
    return pytest.mark.usefixtures(*(f"needs_{f}" for f in features))


def make_traversable(path: Path) -> None:
    """Let the sandbox's per-workspace uid traverse down to ``path`` (needed when tests run as root).

    Only directories we own are touched; ``/`` and shared dirs like ``/tmp`` already allow traversal.
    """
    for p in (path, *path.parents):
        if p == Path("/"):
            break
        st = p.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o011 != 0o011:
            p.chmod(st.st_mode | 0o011)
