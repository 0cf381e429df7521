"""Where the command line keeps its workspaces: ``$TMPDIR/execspace-cli-<uid>/<backend>/``, apart from the
library's default roots (``$TMPDIR/execspace-<uid>/...``), which every program using execspace on this host shares
(a server's sandboxes, an agent's sessions, tests). ``execspace ws`` looks only here unless given ``--root``, so
that its ``list`` shows, and its ``gc`` removes, only what ``execspace run`` and ``exec-code`` made."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ..registry import choose_default_backend, load_backend

__all__ = ["cli_base", "cli_roots", "in_cli_root"]


def cli_base() -> Path:
    """``$TMPDIR/execspace-cli-<uid>``: one directory per backend under it."""
    return Path(tempfile.gettempdir()) / f"execspace-cli-{os.getuid()}"


def cli_roots() -> list[Path]:
    """The workspace roots the command line has made on this host (directories, never links, under the base)."""
    try:
        with os.scandir(cli_base()) as entries:
            return sorted(Path(e.path) for e in entries if e.is_dir(follow_symlinks=False))
    except FileNotFoundError:
        return []


async def in_cli_root(backend: str | None, options: Mapping[str, object]) -> tuple[str, dict[str, object]]:
    """The backend a command opens (the default choice made now when ``backend`` is None) and its options with
    the command line's workspace root, where the backend keeps workspaces on this host and none was given."""
    name = backend if backend not in (None, "auto") else await choose_default_backend(options)
    assert name is not None
    if "workspace_root" in options or "workspace_root" not in load_backend(name).options.option_names():
        return name, dict(options)
    return name, {**options, "workspace_root": cli_base() / name}
