"""The sandbox's modes the attack suites run in: each sandbox engine they open is opened once per mode."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from execspace.backends.sandbox import SessionConfig

#: ``open_engine("sandbox", **options)`` of each mode (a session pool of one: pooled sessions are attacked too).
SANDBOX_MODES: dict[str, Mapping[str, object]] = {
    "per-run": {},
    "session": {"mode": "session", "session": SessionConfig(pool_size=1)},
}


@pytest.fixture(params=list(SANDBOX_MODES))
def sandbox_mode(request: pytest.FixtureRequest) -> Mapping[str, object]:
    """The options of one sandbox mode, for a suite's engine fixture."""
    return SANDBOX_MODES[request.param]
