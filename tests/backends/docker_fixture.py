"""Session fixtures for the container backend: a reachable daemon and an image built offline.

If no daemon answers, a private ``dockerd`` is started (when installed; CI installs
``docker.io``) with its own data root and socket, and stopped at the end. ``podman_daemon``
does the same with ``podman system service`` (``podman_image`` imports the test image there).
Nothing is installed here; without a daemon the tests skip with the reason.

The test image is an empty root with the host's ``/usr`` and ``/etc`` bind-mounted
read-only — for tests only (it exposes the host's programs and /etc to the container);
docs/backends.md has the recipe for a real self-contained image.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from execspace.backends.container.daemon import connect
from execspace.testing.private_daemon import (
    HOST_USR_BINDS,
    DaemonUnavailable,
    import_host_usr_image,
    ping,
    start_private_daemon,
)

TEST_BINDS = HOST_USR_BINDS


@dataclass(frozen=True)
class Daemon:
    host: str
    """``unix://…`` URL of the daemon."""
    socket: str
    kind: str = "docker"


def _private(kind: str) -> Iterator[Daemon]:
    try:
        private = start_private_daemon(kind)
    except DaemonUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield Daemon(private.host, private.socket, kind)
    finally:
        private.stop()


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[Daemon]:
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")
    existing = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if ping(existing):
        yield Daemon(existing, existing.removeprefix("unix://"))
        return
    yield from _private("docker")


@pytest.fixture(scope="session")
def podman_daemon() -> Iterator[Daemon]:
    """A private Podman service (its Docker-compatible API)."""
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")
    yield from _private("podman")


def _import(daemon: Daemon) -> str:
    client = connect(daemon.host, timeout=30)
    try:
        return import_host_usr_image(client)
    finally:
        client.close()


@pytest.fixture(scope="session")
def test_image(docker_daemon: Daemon) -> str:
    """Imports the test image once (about 0.1 s); no registry is involved."""
    return _import(docker_daemon)


@pytest.fixture(scope="session")
def podman_image(podman_daemon: Daemon) -> str:
    """The test image, imported into the Podman service once."""
    return _import(podman_daemon)
