"""Remember the sandbox's set-up work on disk, so that each new engine (and each CLI call) does not redo it.

:class:`ProbeCache`: the probe starts a real sandbox and checks from inside that it holds (~45 ms). Its
verdict depends on the bwrap binary, the kernel, our uid and the seccomp filter, so those form the key;
a success is kept for an hour. Failures are never cached: a fixed host is noticed at once. A stale
success cannot open a hole: a run still goes through bwrap with every flag, and fails if the boundary
cannot be built.

:class:`BpfCache`: building the seccomp filter means importing pyseccomp, whose import alone runs
``ctypes.util.find_library`` twice (~90 ms here), for bytes that depend only on the rules and the
architecture. They are kept for a day (so that a libseccomp upgrade is picked up), keyed by the rules
themselves, in the same private directory; a file that is not a whole number of BPF instructions is
ignored and rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import time
from pathlib import Path

from ...registry import Probe
from ...workspace.hostmanager import default_workspace_root, private_dir

__all__ = ["BpfCache", "ProbeCache"]

_TTL = 3600.0
_BPF_TTL = 86400.0
_BPF_INSTRUCTION = 8  # struct sock_filter


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


class BpfCache:
    """Compiled seccomp programs on disk, one file per rule set and architecture."""

    def __init__(self, directory: Path | None = None, ttl: float = _BPF_TTL) -> None:
        self.directory = directory or default_workspace_root().parent
        self.ttl = ttl

    def key(self, rules: str) -> str:
        return hashlib.sha256(f"bpf-v1\0{os.uname().machine}\0{rules}".encode()).hexdigest()[:32]

    def _file(self, key: str) -> Path:
        return self.directory / f"seccomp-{key}.bpf"

    def get(self, key: str) -> bytes | None:
        try:
            fd = os.open(self._file(key), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if time.time() - os.fstat(f.fileno()).st_mtime > self.ttl:
                    return None
                data = f.read(1 << 20)
        except OSError:
            return None
        return data if data and len(data) % _BPF_INSTRUCTION == 0 else None

    def put(self, key: str, data: bytes) -> None:
        with contextlib.suppress(OSError):
            private_dir(self.directory, 0o711)
            tmp = self.directory / f".seccomp-{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._file(key))
