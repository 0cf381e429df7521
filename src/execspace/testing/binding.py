"""How the conformance kit opens an engine: an :class:`EngineBinding` (one mode of one backend: how to open it for a
test), given to :class:`~execspace.testing.conformance.EngineConformance` as ``bindings``, and what suites that open
engines themselves use (:func:`open_bound`).

Needs pytest and pytest-asyncio (the rest of execspace never imports this module).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace.engine import open_engine_from
from execspace.registry import probe_backend

__all__ = [
    "BindContext",
    "EngineBinding",
    "Feature",
    "backend_binding",
    "make_traversable",
    "needs",
    "open_bound",
]


class Feature(enum.StrEnum):
    """A section of the kit beyond the file API and the manager; it runs where the engine's ``describe()`` says the
    engine has it, and is skipped elsewhere."""

    PROGRAMS = "programs"
    """``runner.run_program`` / ``start_program`` run programs in the workspace (``Capabilities.programs``)."""
    SNAPSHOTS = "snapshots"
    """The manager snapshots, forks and restores (``Capabilities.fork``, ``SupportsSnapshots``)."""
    KERNELS = "kernels"
    """The engine has stateful kernels (``Capabilities.kernels``, ``SupportsKernels``)."""


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
    """One mode of one backend, as the kit sees it: ``open`` opens an engine for one test (and may ``pytest.skip``
    with the reason when it cannot run here). What the engine has is its ``describe()``'s to say."""

    name: str
    open: Opener


def backend_binding(
    backend: str,
    *,
    name: str | None = None,
    options: Mapping[str, object] | None = None,
    probe_options: Mapping[str, object] | None = None,
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

    return EngineBinding(name or backend, open_engine)


@contextlib.asynccontextmanager
async def open_bound(
    binding: EngineBinding, request: pytest.FixtureRequest, tmp_path: Path, host_roots: Sequence[Path] | None = None
) -> AsyncIterator[execspace.BaseEngine]:
    """An engine of ``binding`` rooted in ``tmp_path/ws``, for suites that open engines themselves.
    ``host_roots`` defaults to ``tmp_path/host``."""
    roots = (tmp_path / "host",) if host_roots is None else tuple(host_roots)
    async with binding.open(BindContext(request, tmp_path, tmp_path / "ws", roots)) as engine:
        yield engine


def needs(*features: Feature) -> pytest.MarkDecorator:
    """Marks a case of the kit that needs ``features``: where the engine's ``describe()`` says it lacks one, the case
    is skipped, saying so (the kit's ``needs_<feature>`` fixtures). A plain ``usefixtures`` mark, so binders register
    no marker of ours."""
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
