"""Shared fixtures: a local engine rooted in the test's tmp dir, and one workspace in it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine, Workspace


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        yield eng


@pytest.fixture
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("test/session")


# the daemon and image fixtures serve both the container tests and the conformance suite
from tests.backends.docker_fixture import docker_daemon, test_image  # noqa: E402

__all__ = ["docker_daemon", "engine", "test_image", "ws"]
