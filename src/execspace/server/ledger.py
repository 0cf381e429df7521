"""What a server leaves on disk if it dies: the workspaces of its sandboxes, found again by the next server.

Each server holds an exclusive ``flock`` on a lock file of its own in ``<workspace root>/.execspace-serve/`` for
its whole life, and beside it a directory with one empty file per sandbox id whose workspace may exist (written
before the workspace is made, removed after it is gone). The kernel drops the lock when the process ends, however
it ends (``kill -9`` included): a lock that another server can take belongs to a dead one, and that server's
sandboxes are removed through the Engine (their programs died with it; their files would stay forever).
Servers on one root thus never touch each other's sandboxes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

__all__ = ["Ledger", "new_sandbox_id"]

_DIR = ".execspace-serve"
_ID = re.compile(r"[0-9a-f]{20}")


def new_sandbox_id() -> str:
    return secrets.token_hex(10)


class Ledger:
    """This server's record of its sandboxes (a no-op without a workspace root to keep it in)."""

    def __init__(self, workspace_root: Path | None) -> None:
        self._dir: Path | None = None
        self._lock: int | None = None
        if workspace_root is None:
            return
        base = workspace_root / _DIR
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        name = secrets.token_hex(8)
        # locked under a name no other server looks at, then named: it is never seen unlocked
        pending = base / f"{name}.new"
        self._lock = os.open(pending, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._dir = base / name
        self._dir.mkdir(mode=0o700)
        os.rename(pending, base / f"{name}.lock")

    def new_id(self) -> str:
        """A sandbox id, recorded before its workspace exists (so a crash during its set-up is covered)."""
        sandbox_id = new_sandbox_id()
        if self._dir is not None:
            (self._dir / sandbox_id).touch(mode=0o600)
        return sandbox_id

    def forget(self, sandbox_id: str) -> None:
        """The sandbox's workspace is gone."""
        if self._dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self._dir / sandbox_id).unlink()

    def close(self) -> None:
        """Drop this server's record when every sandbox of it was removed; else leave it (unlocked now) for the
        next server on this root to finish."""
        if self._dir is None or self._lock is None:
            return
        with contextlib.suppress(OSError):  # not empty: a workspace could not be removed
            self._dir.rmdir()
            (self._dir.parent / f"{self._dir.name}.lock").unlink()
        os.close(self._lock)
        self._dir = self._lock = None

    def abandoned(self) -> Iterator[tuple[list[str], Path]]:
        """The sandbox ids of each dead server on this root, with its record; the caller calls :meth:`settled`
        for each it removed, and a record with none left goes. A record whose lock is held (a live server) is
        never yielded."""
        if self._dir is None:
            return
        base = self._dir.parent
        for lock_file in sorted(base.glob("*.lock")):
            if lock_file.stem == self._dir.name:
                continue
            with _taken(lock_file) as taken:
                if not taken:
                    continue  # its server is alive
                record = base / lock_file.stem
                ids = [p.name for p in record.iterdir() if _ID.fullmatch(p.name)] if record.is_dir() else []
                yield ids, record
                if not record.is_dir() or not any(_ID.fullmatch(p.name) for p in record.iterdir()):
                    shutil.rmtree(record, ignore_errors=True)
                    lock_file.unlink(missing_ok=True)

    @staticmethod
    def settled(record: Path, sandbox_id: str) -> None:
        """A dead server's sandbox is removed: its record goes once all of them are."""
        with contextlib.suppress(FileNotFoundError):
            (record / sandbox_id).unlink()


@contextlib.contextmanager
def _taken(lock_file: Path) -> Iterator[bool]:
    """Whether the lock of ``lock_file`` could be taken (its server is gone); held for the block."""
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
