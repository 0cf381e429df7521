"""Remember the sandbox's probe on disk, so that each new engine (and each CLI call) does not redo it.

The probe starts a real sandbox and checks from inside that it holds (~45 ms). Its verdict depends on the
bwrap binary, the kernel, our uid and the seccomp filter, so those form the key; a success is kept for an
hour. Failures are never cached: a fixed host is noticed at once. A stale success cannot open a hole: a run
still goes through bwrap with every flag, and fails if the boundary cannot be built.

The verdict lives in this user's private execspace directory, which no sandbox sees even through a grant
that covers it (the sandbox engine hides it like its workspaces), and is read only from a file of ours that
nobody else may write. Nothing else is cached: the seccomp program is rebuilt by each process (it takes
half a millisecond), since a program trusted from a file is one a sandbox could rewrite.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import time
from pathlib import Path

from ...registry import Probe
from ...workspace.hostmanager import default_workspace_root, private_dir

__all__ = ["ProbeCache"]

_TTL = 3600.0


class ProbeCache:
    """Probe verdicts on disk, in this user's private execspace directory."""

    def __init__(self, directory: Path | None = None, ttl: float = _TTL) -> None:
        self.directory = directory or default_workspace_root().parent
        self.ttl = ttl

    def key(self, bwrap: str, bpf: bytes) -> str:
        real = os.path.realpath(bwrap)
        st = os.stat(real)
        parts = [real, str(st.st_size), str(st.st_mtime_ns), os.uname().release, str(os.geteuid())]
        parts.append(hashlib.sha256(bpf).hexdigest())
        return hashlib.sha256("\0".join(parts).encode()).hexdigest()

    @property
    def _file(self) -> Path:
        return self.directory / "sandbox-probe.json"

    def get(self, key: str) -> Probe | None:
        try:
            fd = os.open(self._file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd) as f:
                if not (_ours(os.fstat(fd), 0o600) and _ours(os.lstat(self.directory), 0o711)):
                    return None
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            return None
        if time.time() - float(entry.get("at", 0)) > self.ttl:
            return None
        return Probe(True, str(entry.get("reason", "")) + " (cached)")

    def put(self, key: str, probe: Probe) -> None:
        if not probe.ok:
            return
        with contextlib.suppress(OSError):
            private_dir(self.directory, 0o711)
            tmp = self.directory / f".sandbox-probe.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, "at": time.time(), "reason": probe.reason}, f)
            os.replace(tmp, self._file)


def _ours(st: os.stat_result, widest: int) -> bool:
    """Owned by us and writable by nobody else (not a symlink: that is never stat'ed through here)."""
    return st.st_uid == os.geteuid() and not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & ~widest == 0
