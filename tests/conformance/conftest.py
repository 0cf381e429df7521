"""Binds the conformance suite to every backend that works on this host.

A backend that cannot run here is skipped with its reason, so the log shows which ran.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace.registry import probe_backend
from tests.support import make_traversable

BACKENDS = ["local", "sandbox"]


@pytest.fixture(params=BACKENDS)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    name = request.param
    probe = await probe_backend(name)
    if not probe.ok:
        pytest.skip(f"backend {name} unavailable here: {probe.reason} (fix: {probe.fix})")
    root = tmp_path / "ws"
    if name == "sandbox":
        make_traversable(tmp_path)  # the per-workspace sandbox uid must reach the workspace
    async with execspace.open_engine(name, workspace_root=root, host_roots=[tmp_path / "host"]) as engine:
        yield engine


@pytest.fixture
async def any_ws(any_engine: execspace.BaseEngine) -> execspace.Workspace:
    return await any_engine.manager.create_workspace("conf/user/session")
