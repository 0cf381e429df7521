"""Directories of this user's that execspace keeps for itself and that no sandbox may see.

Ground floor: the CLI launcher imports this before anything else (only ``os`` here), and the sandbox backend
hides these directories from every program, even through a grant that covers them.
"""

from __future__ import annotations

import os

__all__ = ["daemon_dirs"]


def daemon_dirs(environ: os._Environ[str] | dict[str, str] | None = None) -> tuple[str, ...]:
    """The directories a warm CLI daemon of this user may use: the one this environment picks first, and the
    ``/tmp`` fallback (a caller without ``XDG_RUNTIME_DIR`` uses it). Its key there lets a client run commands
    outside any sandbox."""
    env = os.environ if environ is None else environ
    fallback = f"/tmp/execspace-daemon-{os.getuid()}"
    base = env.get("XDG_RUNTIME_DIR")
    own = f"{base}/execspace-daemon-{os.getuid()}" if base else fallback
    return (own, fallback) if own != fallback else (own,)
