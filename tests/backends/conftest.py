"""Fixtures shared by the backend tests (the docker daemon and image ones live in tests/conftest.py)."""

# only the container tests use Podman: registered here rather than for the whole suite
from tests.backends.docker_fixture import podman_daemon, podman_image

__all__ = ["podman_daemon", "podman_image"]
