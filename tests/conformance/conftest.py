"""Binds the conformance suite to every backend that works on this host.

A backend that cannot run here is skipped with its reason, so the log shows which ran.
The container backend runs against the session's docker fixture (a private dockerd when
none answers) and skips where there is no daemon we may use (e.g. as an unprivileged user).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace.registry import probe_backend
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
from tests.support import make_traversable

BACKENDS = ["local", "sandbox", "container"]
#: The engines this suite runs on: the backends above plus ``jupyter`` (its file API and programs; the kernels have
#: their own tests in tests/backends/test_jupyter*.py). Kept apart from BACKENDS, which other suites import with
#: fixtures of their own that would need the jupyter options below.
ENGINES = [*BACKENDS, "jupyter"]


@pytest.fixture(params=ENGINES)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    async with open_backend(request, request.param, tmp_path) as engine:
        yield engine


@contextlib.asynccontextmanager
async def open_backend(
    request: pytest.FixtureRequest, name: str, tmp_path: Path, host_roots: list[Path] | None = None
) -> AsyncIterator[execspace.BaseEngine]:
    """An engine of backend ``name`` rooted in ``tmp_path/ws``, or a skip saying why it cannot run here.

    Shared with the suites that run their own tests on every backend (tests/tools), so that each
    backend is opened one way everywhere. ``host_roots`` defaults to ``tmp_path/host``.
    """
    root = tmp_path / "ws"
    roots = [tmp_path / "host"] if host_roots is None else host_roots
    if name == "container":
        async with _container_engine(request, root, roots) as engine:
            yield engine
        return
    probe = await probe_backend(name)
    if not probe.ok:
        pytest.skip(f"backend {name} unavailable here: {probe.reason} (fix: {probe.fix})")
    options: dict[str, object] = {}
    if name in ("sandbox", "jupyter"):
        make_traversable(tmp_path)  # the per-workspace sandbox uid must reach the workspace
    if name == "jupyter":
        # its default mode where the sandbox works: kernels and programs in the OS sandbox (the test fails instead of
        # falling back); host mode elsewhere. No warm pool: these tests start no kernel.
        sandboxed = (await probe_backend("jupyter", kernel_isolation="sandbox")).ok
        options = {"kernel_isolation": "sandbox" if sandboxed else "none", "pool_size": 0}
    async with execspace.open_engine(name, workspace_root=root, host_roots=roots, **options) as engine:
        yield engine


@contextlib.asynccontextmanager
async def _container_engine(
    request: pytest.FixtureRequest, root: Path, host_roots: list[Path]
) -> AsyncIterator[execspace.BaseEngine]:
    # requested lazily: the other backends must not need (or skip for lack of) a daemon
    daemon: Daemon = request.getfixturevalue("docker_daemon")
    image: str = request.getfixturevalue("test_image")
    # no pool: it has its own tests; here it would only start containers nobody uses
    async with container_engine(daemon, image, root, host_roots=host_roots, pool_size=0) as engine:
        yield engine


@pytest.fixture
async def any_ws(any_engine: execspace.BaseEngine) -> execspace.Workspace:
    return await any_engine.manager.create_workspace("conf/user/session")
