"""A server killed with -9 leaves its sandboxes' workspaces on disk; the next server on the same root removes them
(and the warm pool's slots), and never touches those of a server that is alive."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxException

from tests.support import until

from .conftest import Server, running_server


def _connect(server: Server) -> dict[str, str]:
    return {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}


def _entries(root: Path, prefix: str) -> set[str]:
    return {name for name in os.listdir(root) if name.startswith(prefix)}


def test_the_next_server_removes_what_a_killed_one_left_and_a_clean_stop_leaves_nothing(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with running_server(root) as first:
        sandbox = Sandbox.create(**_connect(first))
        sandbox.files.write("/home/user/kept.txt", "left behind")
        until("the pool filled", lambda: len(_entries(root, "e2b_")) >= 3)  # ours and the pool's
        before = _entries(root, "e2b_")
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=20)
    # taken after the kill: the pool may have been making one more slot until then
    left, slots = _entries(root, "e2b_"), _entries(root, ".pool-")
    assert before <= left  # killed: nothing of it could remove anything
    with running_server(root) as second:
        until("the dead server's workspaces removed", lambda: not _entries(root, "e2b_") & left)
        until("the dead server's pool slots removed", lambda: not _entries(root, ".pool-") & slots)
        with pytest.raises(SandboxException, match="not found"):
            Sandbox.connect(sandbox.sandbox_id, **_connect(second))
        assert Sandbox.create(**_connect(second)).commands.run("echo fresh").stdout == "fresh\n"
    assert _entries(root, "e2b_") == set() and _entries(root, ".pool-") == set()
    assert os.listdir(root / ".execspace-serve") == []


def test_a_second_server_on_the_same_root_leaves_the_first_ones_sandboxes_alone(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    with running_server(root) as first:
        sandbox = Sandbox.create(**_connect(first))
        sandbox.files.write("/home/user/mine.txt", "first's")
        with running_server(root) as second:
            Sandbox.create(**_connect(second)).kill()
        assert sandbox.commands.run("cat mine.txt").stdout == "first's"  # alive and whole after both
        assert sandbox.files.read("/home/user/mine.txt") == "first's"
