"""The engine most adapter tests drive: a per-run sandbox on this test's own workspace root."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import BaseEngine
from execspace.testing.binding import make_traversable


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    make_traversable(tmp_path)  # as root, programs run as the workspace's own uid
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as eng:
        yield eng
