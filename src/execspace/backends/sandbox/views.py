"""Host trees a sandbox shows read-only at their own paths although its uid may not reach them (``read_views``).

A view is a read grant that is checked harder when the engine opens: as root each workspace's sandbox runs as an
unprivileged uid of its own, which cannot pass a 0700 directory such as ``/root``, so the grant helper
(:mod:`.grants`) shows a view under such a directory from a clone of its mount, in a mount namespace of the run's
own. Nothing of the user's is changed (no mode, no owner): the sandbox's uid reads what "other" may read in the tree,
no more, so the tree's top must be readable and searchable by others.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from ...errors import PolicyViolation
from .policy import SandboxPolicy, is_under

__all__ = ["check_views"]

#: Host locations a view may not name: the sandbox makes its own there.
_OWN = ("/proc", "/dev", "/sys", "/workspace")


def check_views(paths: Sequence[str], policy: SandboxPolicy, hidden: Sequence[Path]) -> None:
    """Refuse a view that is not a canonical absolute directory others may read and search, that names what the
    sandbox makes itself, or that would show what no sandbox may see (a hidden directory of execspace's, a path the
    policy denies or a credential store)."""
    denied = (*policy.no_access_paths, *policy.credential_paths, *(os.path.realpath(h) for h in hidden))
    for path in paths:
        if not path.startswith("/") or os.path.realpath(path) != path or path == "/":
            raise PolicyViolation(f"read_views: {path!r} must be a canonical absolute path (symlinks resolved), not /")
        if any(is_under(path, own) or is_under(own, path) for own in _OWN):
            raise PolicyViolation(f"read_views: {path} would replace the sandbox's own /proc, /dev, /sys or /workspace")
        if hit := next((d for d in denied if d.startswith("/") and (is_under(d, path) or is_under(path, d))), None):
            raise PolicyViolation(
                f"read_views: {path} would show {hit}, which no sandbox may see (a no-access path, a credential "
                "store, or execspace's own workspaces, keys and environments); name a narrower directory"
            )
        try:
            st = os.stat(path)
        except OSError as exc:
            raise PolicyViolation(f"read_views: {path} cannot be shown: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise PolicyViolation(f"read_views: {path} is not a directory")
        if os.geteuid() == 0 and st.st_mode & 0o005 != 0o005:
            raise PolicyViolation(
                f"read_views: {path} (mode {stat.S_IMODE(st.st_mode):04o}) is not readable and searchable by others, "
                "and as root each sandbox runs as an unprivileged uid of its own, which reads only what others may; "
                "execspace does not change your files' modes: make the tree with a umask of 022 (e.g. recreate the "
                "venv), or use a runtime environment (execspace env build code-interpreter)"
            )
