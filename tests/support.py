"""Helpers shared by test modules (not fixtures: those live in conftest.py files)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

from execspace.testing.binding import make_traversable

__all__ = ["CLI", "daemon_served", "make_traversable", "running_daemon"]

CLI = [sys.executable, "-m", "execspace"]


@contextlib.contextmanager
def running_daemon() -> Iterator[dict[str, str]]:
    """The environment of a caller that reaches a fresh warm daemon of its own (stopped afterwards)."""
    # unix socket paths must fit in 107 bytes: pytest's tmp_path may not
    with tempfile.TemporaryDirectory(prefix="xdg", dir="/tmp") as runtime:
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
        env.pop("EXECSPACE_DAEMON", None)
        started = subprocess.run([*CLI, "daemon", "start", "--idle-timeout", "120"], env=env, capture_output=True)
        assert started.returncode == 0, started.stderr
        try:
            yield env
        finally:
            subprocess.run([*CLI, "daemon", "stop"], env=env, capture_output=True, check=False)


def daemon_served(env: dict[str, str]) -> int:
    """How many commands the daemon reached with ``env`` has run."""
    out = subprocess.run([*CLI, "daemon", "status"], env=env, capture_output=True, text=True, check=True).stdout
    return int(out.split("served=")[1].split()[0])
