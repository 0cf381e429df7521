"""The conformance kit (execspace.testing.conformance) bound to every mode of every backend (tests/bindings.py)."""

from execspace.testing.conformance import EngineConformance
from tests.bindings import MODES


class TestEveryMode(EngineConformance):
    bindings = tuple(MODES.values())
