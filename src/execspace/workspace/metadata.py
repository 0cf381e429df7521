"""``metadata.json``: what was staged into and collected from a workspace.

Writes are atomic (temp file + rename). A corrupt file never blocks work: it is
moved aside as ``metadata.json.corrupt-<time>`` (nothing is lost) and a fresh
record starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PathDenied
from .layout import METADATA_FILE

__all__ = ["InputRecord", "OutputRecord", "WorkspaceMetadata", "load_metadata", "refuse_record", "save_metadata"]

SCHEMA_VERSION = 1


@dataclass
class InputRecord:
    src: str
    dest: str
    resolved: str
    mode: str
    version: int | None = None
    ts: float = field(default_factory=time.time)


@dataclass
class OutputRecord:
    globs: list[str]
    files: list[str]
    saved_as: list[str]
    limits_hit: bool
    ts: float = field(default_factory=time.time)


@dataclass
class WorkspaceMetadata:
    id: str = ""
    version: int = SCHEMA_VERSION
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    inputs: list[InputRecord] = field(default_factory=list)
    outputs: list[OutputRecord] = field(default_factory=list)
    skills: dict[str, dict[str, Any]] = field(default_factory=dict)
    recovered_from: str | None = None
    """Name of the corrupt file moved aside when this record was started fresh."""
    forked_from: str | None = None
    """The snapshot id (or ``workspace:<id>``) this workspace was forked or restored from."""

    def last_input_version(self, dest: str, artifact: str) -> int | None:
        for rec in reversed(self.inputs):
            if rec.dest == dest and rec.resolved == artifact and rec.version is not None:
                return rec.version
        return None

    def to_json(self) -> bytes:
        """Serialise the record (UTF-8 JSON, indented, keys sorted)."""
        return json.dumps(asdict(self), indent=2, sort_keys=True).encode()

    @classmethod
    def from_json(cls, raw: bytes | str) -> WorkspaceMetadata:
        """Parse a record; raise ``ValueError`` when it is not valid metadata."""
        try:
            return _from_dict(json.loads(raw))
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise ValueError(f"invalid workspace metadata: {exc}") from exc


def load_metadata(root: Path, ws_id: str = "") -> WorkspaceMetadata:
    """Read the record; a missing one is fresh, a corrupt one is moved aside and replaced."""
    path = root / METADATA_FILE
    try:
        # O_NOFOLLOW: a program may have replaced the file with a link to a host file
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = f.read(16 * 1024 * 1024)
    except FileNotFoundError:
        return WorkspaceMetadata(id=ws_id)
    except OSError:
        raw = b"<unreadable>"
    try:
        return WorkspaceMetadata.from_json(raw)
    except ValueError:
        aside = f"{METADATA_FILE}.corrupt-{int(time.time())}-{secrets.token_hex(3)}"
        with contextlib.suppress(OSError):
            path.replace(root / aside)
        return WorkspaceMetadata(id=ws_id, recovered_from=aside)


def _from_dict(data: dict[str, Any]) -> WorkspaceMetadata:
    if not isinstance(data, dict):
        raise TypeError("metadata root is not an object")
    return WorkspaceMetadata(
        id=str(data.get("id", "")),
        version=int(data.get("version", SCHEMA_VERSION)),
        created_at=float(data.get("created_at", time.time())),
        updated_at=float(data.get("updated_at", time.time())),
        inputs=[_input_record(r) for r in data.get("inputs", [])],
        outputs=[OutputRecord(**r) for r in data.get("outputs", [])],
        skills=dict(data.get("skills", {})),
        recovered_from=data.get("recovered_from"),
        forked_from=data.get("forked_from"),
    )


def _input_record(raw: Any) -> InputRecord:
    rec = InputRecord(**raw)
    # a pinned version is fed back into artifact loads: it must really be a version
    if rec.version is not None and (type(rec.version) is not int or rec.version < 1):
        raise TypeError(f"input record version must be a positive integer, got {rec.version!r}")
    return rec


def save_metadata(root: Path, meta: WorkspaceMetadata) -> None:
    """Write the record atomically (a unique temp file renamed over the old one)."""
    meta.updated_at = time.time()
    tmp = root / f".{METADATA_FILE}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    data = meta.to_json()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        tmp.replace(root / METADATA_FILE)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def is_metadata_temp(name: str) -> bool:
    return name.startswith(f".{METADATA_FILE}.") and name.endswith(".tmp")


def refuse_record(path: str) -> None:
    """Raise ``PathDenied`` if the workspace-relative ``path`` is the workspace's record or one of its own files
    (a temporary write, a corrupt record kept aside): only execspace's bookkeeping writes or removes them, never a
    tool or a stage destination."""
    parts = [p for p in path.split("/") if p not in ("", ".")] if isinstance(path, str) else []
    if len(parts) == 1 and (parts[0].startswith(METADATA_FILE) or is_metadata_temp(parts[0])):
        raise PathDenied(path, f"it is the workspace's own record ({METADATA_FILE}), which only execspace writes")
