"""The conformance kit (execspace.testing.conformance) on every mode of every backend (tests/bindings.py)."""

from execspace.testing.conformance import *  # noqa: F403 - the kit's cases and their fixtures
from tests.bindings import engine_binding

__all__ = ["engine_binding"]
