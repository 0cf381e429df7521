"""One way for the container tests to open an engine on the test daemon, list its containers and write shell runs.

The daemon and image fixtures themselves live in docker_fixture.py (registered in tests/conftest.py and
tests/backends/conftest.py); ``engine_fixture`` builds a module's engine fixture on top of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.container.daemon import connect
from execspace.backends.container.reaper import LABEL
from tests.backends.docker_fixture import TEST_BINDS, Daemon


def sh(script: str, **spec: Any) -> RunProgramSpec:
    """``sh -c script``; ``spec`` sets the run's other fields (stdin, env, limits, timeout, network…)."""
    return RunProgramSpec("sh", ["-c", script], **spec)


@contextlib.asynccontextmanager
async def container_engine(
    daemon: Daemon, image: str, root: Path, *, warm: bool = False, **options: Any
) -> AsyncIterator[execspace.BaseEngine]:
    """A container engine on ``daemon`` rooted at ``root``, with the test image's host binds.

    ``options`` add engine options or replace the defaults (``read_only_binds`` included); ``warm`` waits until the
    pool has started its containers, for tests that look at them.
    """
    settings: dict[str, Any] = {
        "image": image,
        "docker_host": daemon.host,
        "workspace_root": root,
        "read_only_binds": TEST_BINDS,
        **options,
    }
    async with execspace.open_engine("container", **settings) as engine:
        if warm:
            await engine.pool.ready()
        yield engine


def engine_fixture(daemon: str = "docker_daemon", image: str = "test_image", **options: Any) -> object:
    """A module's engine fixture: ``container_engine`` in ``tmp_path/ws`` on the named daemon and image fixtures.

    Assign it to the fixture's name (``engine = engine_fixture(pool_size=0)``); pytest registers it under that name.
    """

    @pytest.fixture
    async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
        # looked up by name so one factory serves the Docker and the Podman daemon
        on: Daemon = request.getfixturevalue(daemon)
        async with container_engine(on, request.getfixturevalue(image), tmp_path / "ws", **options) as eng:
            yield eng

    return engine


def labelled_containers(daemon: Daemon, label: str) -> dict[str, dict[str, Any]]:
    """The containers carrying ``label`` (``key=value``), stopped ones too, by id, as the daemon lists them."""
    client = connect(daemon.host)
    try:
        return {c["Id"]: c for c in client.api.containers(all=True, filters={"label": label})}
    finally:
        client.close()


def engine_containers(daemon: Daemon, engine: execspace.BaseEngine | str) -> dict[str, dict[str, Any]]:
    """The containers of ``engine`` (or of the engine with this id: it outlives the engine's close), by id."""
    engine_id = engine if isinstance(engine, str) else engine.engine_id
    return labelled_containers(daemon, f"{LABEL}.engine={engine_id}")
