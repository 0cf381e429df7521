"""The audit log: one JSON object per line for each security-relevant action (docs/operations.md "Audit log").

:class:`AuditLog` is the file. Each line is made whole in memory and handed to the kernel by one ``write`` on a
descriptor opened ``O_WRONLY | O_APPEND | O_CREAT`` (mode ``0600``), before the action's result goes back to its
caller: a process killed at any instant (SIGKILL) leaves every acknowledged action's line, and never half a line
(``O_APPEND`` puts each write at the end as one piece, so writers in several processes interleave whole lines,
and ``copytruncate`` rotation works). :meth:`AuditLog.reopen` opens the path anew (rotation by rename: serve and
the MCP server call it on ``SIGHUP``). The line reaches the kernel, not the disk: a machine that loses power may
lose what it had not written back (``fsync`` per line would cost a disk flush per command).

Whoever records says what happened in names, ids, paths, sizes and codes: never an environment value, a file's
content, a token or an API key (its :func:`key_id` at most).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import signal
import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .errors import SetupFailed

if TYPE_CHECKING:
    from .models import RunProgramSpec, RunResult

__all__ = [
    "AuditLog",
    "AuditSink",
    "AuditValue",
    "cell_executed",
    "key_id",
    "reopened_on_hangup",
    "run_ended",
    "run_lost",
    "run_started",
]

AuditValue = str | int | float | bool | None | Sequence[str]

_log = logging.getLogger("execspace.audit")
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def key_id(key: str) -> str:
    """The name of an API key (or bearer token) in an audit line: a hash that does not give the key away, the
    same for the same key on every server."""
    return hashlib.sha256(b"execspace api key\0" + key.encode()).hexdigest()[:16]


def run_started(workspace: str, spec: RunProgramSpec) -> dict[str, AuditValue]:
    """A ``command.start`` line's fields: the program, its arguments, user, cwd and the names of its variables."""
    return {
        "workspace": workspace,
        "argv": [spec.cmd, *spec.args],
        "user": spec.user,
        "cwd": spec.cwd,
        "env_names": sorted(spec.env),
    }


def run_ended(workspace: str, spec: RunProgramSpec, pid: int | None, result: RunResult) -> dict[str, AuditValue]:
    """A ``command.end`` line's fields: the program, its pid (None: it never started), exit code and limits."""
    return {
        "workspace": workspace,
        "argv": [spec.cmd, *spec.args],
        "pid": pid,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "limit_hit": result.limit_hit,
        "duration_s": round(result.duration, 6),
    }


def run_lost(workspace: str, spec: RunProgramSpec, pid: int | None, error: BaseException) -> dict[str, AuditValue]:
    """A ``command.end`` line's fields for a started program whose result never came (its supervision failed or
    was cancelled): ``run_ended``'s, with no exit code and the error's type."""
    return {
        "workspace": workspace,
        "argv": [spec.cmd, *spec.args],
        "pid": pid,
        "exit_code": None,
        "timed_out": False,
        "limit_hit": None,
        "duration_s": None,
        "error": type(error).__name__,
    }


def cell_executed(workspace: str, language: str, code: str) -> dict[str, AuditValue]:
    """A ``cell.execute`` line's fields: the kernel's language and the code's size (never the code)."""
    return {"workspace": workspace, "language": language, "code_bytes": len(code.encode())}


@runtime_checkable
class AuditSink(Protocol):
    """Where audit events go: given to the machinery by the backend's options (``audit=``), or to serve and the
    MCP server by their owners; never a global."""

    def record(self, event: str, fields: Mapping[str, AuditValue]) -> None:
        """Record ``event`` (``command.start``, ``file.write``…) with ``fields``, before returning."""
        ...


class AuditLog:
    """An append-only JSON-lines file (see the module's docstring). Safe to share between threads."""

    def __init__(self, path: Path | str) -> None:
        """Open (create, ``0600``) ``path`` for appending.

        Raises:
            SetupFailed: it cannot be opened (its directory is missing, or not writable).
        """
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd = self._open()
        self.lost = 0
        """Lines the kernel refused (a full disk): each is said in the log of ``execspace.audit`` too."""

    def _open(self) -> int:
        try:
            return os.open(self.path, _FLAGS, 0o600)
        except OSError as exc:
            raise SetupFailed(
                "audit",
                f"cannot open the audit log {self.path}: {exc.strerror or exc}",
                "give a file in a directory that exists and this user may write (--audit-log FILE)",
                component="audit log",
            ) from None

    def record(self, event: str, fields: Mapping[str, AuditValue]) -> None:
        moment = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        line = json.dumps({"time": moment, "event": event, **fields}, separators=(",", ":"), default=list) + "\n"
        data = line.encode()
        with self._lock:
            try:
                written = os.write(self._fd, data)
            except OSError as exc:
                written, error = 0, exc.strerror
            else:
                error = "a short write"
        if written != len(data):
            self.lost += 1
            _log.error("the audit log %s lost a %s line: %s", self.path, event, error)

    def reopen(self) -> None:
        """Open the path anew (a rotation renamed the file: lines go to a new one); on failure keep the old one."""
        try:
            fd = self._open()
        except SetupFailed as exc:
            _log.error("%s; the audit log goes on in the file it had open", exc)
            return
        with self._lock:
            self._fd, old = fd, self._fd
        os.close(old)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


@contextlib.contextmanager
def reopened_on_hangup(audit: AuditLog | None) -> Iterator[None]:
    """While the block runs, SIGHUP reopens ``audit`` (a rotation renamed it): serve's and the MCP server's."""
    if audit is None:
        yield
        return
    loop = asyncio.get_running_loop()
    try:
        loop.add_signal_handler(signal.SIGHUP, audit.reopen)
    except (RuntimeError, ValueError):  # not the main thread: the owner reopens it (AuditLog.reopen)
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
