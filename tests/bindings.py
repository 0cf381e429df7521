"""This repository's bindings of the conformance kit (execspace.testing): one per mode of every backend.

A mode that cannot run here skips with its reason, so the log shows which ran. The container mode runs against
the session's docker fixture (a private dockerd when none answers); the jupyter remote modes against the
session's Jupyter Server (tests/conftest.py). Other suites that run their own tests on several backends
(tests/tools) open them with :func:`open_backend`, so that each mode is opened one way everywhere.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from itertools import count
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import execspace
from execspace.backends.sandbox import SessionConfig
from execspace.registry import probe_backend
from execspace.testing.binding import BindContext, EngineBinding, backend_binding, open_bound
from execspace.workspace.diskimages import DISKS_DIR, disk_tools_missing
from execspace.workspace.hostmanager import remove_workspace_tree
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon

if TYPE_CHECKING:
    from execspace.backends.jupyter import KernelMode
    from execspace.backends.jupyter.remote_server import LocalServer

#: no warm pools: they have their own tests; here they would only start containers and kernels nobody uses
_NO_POOL = {"pool_size": 0}


def _kernels(kind: str) -> KernelMode:
    """A jupyter mode without a pool, or a skip where the jupyter extra is not installed."""
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
    from execspace.backends.jupyter import HostKernels, SandboxedKernels

    return HostKernels(pool_size=0) if kind == "host" else SandboxedKernels(pool_size=0)


@contextlib.asynccontextmanager
async def _container(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    # requested lazily: the other modes must not need (or skip for lack of) a daemon
    daemon: Daemon = ctx.request.getfixturevalue("docker_daemon")
    image: str = ctx.request.getfixturevalue("test_image")
    async with container_engine(daemon, image, ctx.workspace_root, host_roots=list(ctx.host_roots), **_NO_POOL) as e:
        yield e


_remote_roots = count()


@contextlib.asynccontextmanager
async def _jupyter_remote(ctx: BindContext, *, shared_filesystem: bool) -> AsyncIterator[execspace.BaseEngine]:
    pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")
    from execspace.backends.jupyter import ServerKernels

    server: LocalServer = ctx.request.getfixturevalue("jupyter_server")
    mode = ServerKernels(
        server.url, server.token, shared_filesystem=shared_filesystem, remote_root=f"conf{next(_remote_roots)}"
    )
    async with execspace.open_engine(
        "jupyter", mode=mode, host_roots=list(ctx.host_roots), workspace_root=ctx.workspace_root
    ) as engine:
        yield engine


@contextlib.asynccontextmanager
async def _jupyter_shared(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    async with _jupyter_remote(ctx, shared_filesystem=True) as engine:
        yield engine


@contextlib.asynccontextmanager
async def _jupyter_server_workspaces(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    async with _jupyter_remote(ctx, shared_filesystem=False) as engine:
        yield engine


@contextlib.asynccontextmanager
async def _jupyter_default(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    # its default mode where the sandbox works (the test fails instead of falling back), host mode elsewhere
    sandboxed = (await probe_backend("jupyter", mode=_kernels("sandboxed"))).ok
    async with (JUPYTER_SANDBOXED if sandboxed else JUPYTER_HOST).open(ctx) as engine:
        yield engine


def _jupyter(kind: str, *, traversable: bool = False) -> EngineBinding:
    """A jupyter mode whose kernels' classes load when a test opens it, so that a missing extra skips it."""
    name = f"jupyter-{kind}"

    @contextlib.asynccontextmanager
    async def open_jupyter(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
        mode = _kernels(kind)
        probing = {"mode": mode} if kind == "sandboxed" else None
        bound = backend_binding(
            "jupyter", name=name, options={"mode": mode}, probe_options=probing, traversable=traversable
        )
        async with bound.open(ctx) as engine:
            yield engine

    return EngineBinding(name, open_jupyter)


@contextlib.asynccontextmanager
async def _e2b_serve(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
    from tests.server.conftest import Server

    server: Server = ctx.request.getfixturevalue("e2b_server")
    async with execspace.open_engine(
        "e2b",
        api_url=server.url,
        sandbox_url=server.url,
        api_key=server.key,
        template="base",
        persistence="turn",  # each test's sandboxes are killed when its engine closes
        host_roots=list(ctx.host_roots),
        kill_grace=1.0,
    ) as engine:
        yield engine


JUPYTER_HOST = _jupyter("host")
JUPYTER_SANDBOXED = _jupyter("sandboxed", traversable=True)  # the per-workspace sandbox uid must reach the workspace

#: Session mode: a pool of one, so that the kit's workspaces also come from pooled sessions.
SANDBOX_SESSION = backend_binding(
    "sandbox",
    name="sandbox-session",
    options={"mode": "session", "session": SessionConfig(pool_size=1)},
    probe_options={"mode": "session"},
    traversable=True,
)

_SANDBOX_SESSION_DISK = backend_binding(
    "sandbox",
    name="sandbox-session-disk",
    options={"mode": "session", "session": SessionConfig(disk_bytes=64 << 20)},
    probe_options={"mode": "session"},
    traversable=True,
)


@contextlib.asynccontextmanager
async def _sandbox_session_disk(ctx: BindContext) -> AsyncIterator[execspace.BaseEngine]:
    """Session mode with each workspace on a 64 MiB filesystem of its own (as root). The kit keeps its workspaces:
    their disks are removed after each test, so that no mount outlives it."""
    if why := disk_tools_missing():
        pytest.skip(f"no disk-bounded workspaces here: {why}")
    try:
        async with _SANDBOX_SESSION_DISK.open(ctx) as engine:
            yield engine
    finally:
        for image in (ctx.workspace_root / DISKS_DIR).glob("*.img"):
            remove_workspace_tree(ctx.workspace_root / image.stem)


#: Every mode, by name: the conformance kit runs on each (tests/conformance), its kernels' basics included.
MODES: dict[str, EngineBinding] = {
    b.name: b
    for b in (
        backend_binding("local"),
        backend_binding("sandbox", traversable=True),
        SANDBOX_SESSION,
        EngineBinding("sandbox-session-disk", _sandbox_session_disk),
        EngineBinding("container", _container),
        JUPYTER_HOST,
        JUPYTER_SANDBOXED,
        EngineBinding("jupyter-remote", _jupyter_shared),
        EngineBinding("jupyter-remote-noshare", _jupyter_server_workspaces),
    )
}
#: The e2b backend against ``execspace serve`` (in its default sandbox-session mode).
MODES["e2b-serve"] = EngineBinding("e2b-serve", _e2b_serve)

#: The backends other suites run their own tests on (with options of their own), and with jupyter in its
#: default mode, what tests/tools runs on (the sandbox in both its modes: the tools meet session mode too).
BACKENDS = ["local", "sandbox", "sandbox-session", "container"]
#: The sandbox's modes, for the suites that attack it (tests/redteam).
SANDBOX_MODES = ["sandbox", "sandbox-session"]
ENGINES = [*BACKENDS, "jupyter"]
_OTHER_SUITES = {**MODES, "jupyter": EngineBinding("jupyter", _jupyter_default)}


@contextlib.asynccontextmanager
async def open_backend(
    request: pytest.FixtureRequest, name: str, tmp_path: Path, host_roots: list[Path] | None = None
) -> AsyncIterator[execspace.BaseEngine]:
    """An engine of mode ``name`` rooted in ``tmp_path/ws``, or a skip saying why it cannot run here.
    ``host_roots`` defaults to ``tmp_path/host``."""
    async with open_bound(_OTHER_SUITES[name], request, tmp_path, host_roots) as engine:
        yield engine


@pytest.fixture(params=ENGINES)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    """An engine of each of :data:`ENGINES`, for suites of their own (assign it to a module's fixture name)."""
    async with open_backend(request, request.param, tmp_path) as engine:
        yield engine
