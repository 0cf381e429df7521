"""Fixtures shared by the backend tests."""

from tests.backends.docker_fixture import docker_daemon, test_image

__all__ = ["docker_daemon", "test_image"]
