"""Helpers shared by test modules (not fixtures: those live in conftest.py files)."""

from __future__ import annotations

import os
from pathlib import Path


def make_traversable(path: Path) -> None:
    """Let the sandbox's per-workspace uid traverse down to ``path`` (needed when tests run as root).

    Only directories we own are touched; ``/`` and shared dirs like ``/tmp`` already allow traversal.
    """
    for p in (path, *path.parents):
        if p == Path("/"):
            break
        st = p.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o011 != 0o011:
            p.chmod(st.st_mode | 0o011)
