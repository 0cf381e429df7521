"""Artifacts: named, versioned blobs that outlive workspaces.

An artifact lives in a scope (app, user, session). A name starting with ``user:``
is *user-wide*: every session of that app and user sees it; any other name belongs
to one session. Each save of a name makes a new version: 1, 2, 3… Version numbers
are never reused, not even after a delete, so ``artifact://name@3`` always means
the same bytes or nothing.

Names may contain ``/`` (``out/report.csv``) but not NUL, a leading ``/`` or a
``..`` component. References are written ``artifact://name@version``; see
:func:`parse_artifact_ref` and :func:`format_artifact_ref`.

Two services are built in: :class:`InMemoryArtifactService` (tests, one process)
and :class:`FileArtifactService` (a directory tree, safe for several processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import quote

from .errors import ArtifactNotFound, InvalidSpec

__all__ = [
    "ARTIFACT_SCHEME",
    "USER_PREFIX",
    "Artifact",
    "ArtifactScope",
    "ArtifactService",
    "FileArtifactService",
    "InMemoryArtifactService",
    "format_artifact_ref",
    "is_user_scoped",
    "parse_artifact_ref",
    "validate_artifact_name",
]

#: Prefix of references to artifacts.
ARTIFACT_SCHEME = "artifact://"
#: Prefix of names shared by all sessions of an app and user.
USER_PREFIX = "user:"
_DEFAULT_MIME = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class ArtifactScope:
    """Where artifacts live: one session of one user of one app."""

    app: str
    user: str
    session: str

    def __post_init__(self) -> None:
        for label in ("app", "user", "session"):
            value = getattr(self, label)
            if not isinstance(value, str) or not value or "\0" in value or not _utf8(value):
                raise InvalidSpec(f"artifact scope {label} must be a non-empty string without NUL, got {value!r}")

    @classmethod
    def from_workspace_id(cls, ws_id: str) -> ArtifactScope:
        """Scope of a workspace id ``app/user/session``; missing (or empty) parts become ``default``.

        A longer id keeps the rest in the session (``a/b/c/d`` -> session ``c/d``). Distinct ids get distinct
        scopes: a part written out as ``default`` (or ``=default``, ``==default``…) gets one more ``=`` in
        front, so ``app/alice/default`` (session ``=default``) never shares the scope of ``app/alice``.
        """
        parts = ws_id.split("/", 2)
        parts += [""] * (3 - len(parts))
        app, user, session = (_scope_part(p) for p in parts)
        return cls(app, user, session)

    def describe(self, name: str = "") -> str:
        """The scope as text, as seen by ``name`` (user-wide names ignore the session)."""
        if is_user_scoped(name):
            return f"{self.app}/{self.user} (user-wide)"
        return f"{self.app}/{self.user}/{self.session}"


_DEFAULT_PART = "default"


def _scope_part(part: str) -> str:
    # injective: "" -> "default", "=" * k + "default" -> "=" * (k + 1) + "default", anything else unchanged
    if not part:
        return _DEFAULT_PART
    return "=" + part if part.lstrip("=") == _DEFAULT_PART else part


@dataclass(frozen=True, slots=True)
class Artifact:
    """One version of an artifact."""

    name: str
    version: int
    data: bytes = field(repr=False)
    mime_type: str
    created_at: float
    """Unix time of the save."""


@runtime_checkable
class ArtifactService(Protocol):
    """Stores artifacts. Every method is safe to call from concurrent coroutines."""

    async def save(self, scope: ArtifactScope, name: str, data: bytes, mime_type: str = _DEFAULT_MIME) -> int:
        """Store ``data`` as the next version of ``name`` and return that version (1 for the first).

        Raises ``InvalidSpec`` for an invalid name.
        """
        ...

    async def load(self, scope: ArtifactScope, name: str, version: int | None = None) -> Artifact:
        """Return one version (``None``: the latest); raise ``ArtifactNotFound`` if it does not exist."""
        ...

    async def list_versions(self, scope: ArtifactScope, name: str) -> list[int]:
        """Existing versions of ``name``, ascending; empty when there are none."""
        ...

    async def list_names(self, scope: ArtifactScope) -> list[str]:
        """Sorted names visible in the scope: the session's and the user-wide (``user:``) ones."""
        ...

    async def delete(self, scope: ArtifactScope, name: str, version: int | None = None) -> None:
        """Delete one version, or all of them (``None``). Raise ``ArtifactNotFound`` if nothing matched.

        Deleted version numbers are not given out again.
        """
        ...


# -- names and references -----------------------------------------------------------


def is_user_scoped(name: str) -> bool:
    """True for names shared by all sessions of the user (``user:…``)."""
    return name.startswith(USER_PREFIX)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def validate_artifact_name(name: str) -> str:
    """Return ``name`` if it is a valid artifact name, else raise ``InvalidSpec``."""
    if not isinstance(name, str) or not name:
        raise InvalidSpec("artifact name must be a non-empty string")
    if "\0" in name or not _utf8(name):
        raise InvalidSpec(f"artifact name {name!r} contains a NUL byte or invalid text")
    bare = name[len(USER_PREFIX) :] if is_user_scoped(name) else name
    if not bare:
        raise InvalidSpec(f"artifact name {name!r} needs a name after the {USER_PREFIX!r} prefix")
    if bare.startswith("/"):
        raise InvalidSpec(f"artifact name {name!r} must not start with '/'")
    if ".." in bare.split("/"):
        raise InvalidSpec(f"artifact name {name!r} must not contain a '..' component")
    return name


def _check_version(version: int | None) -> None:
    if version is not None and (type(version) is not int or version < 1):
        raise InvalidSpec(f"artifact versions are integers starting at 1, got {version!r}")


def parse_artifact_ref(ref: str) -> tuple[str, int | None]:
    """Split ``artifact://name@3``, ``name@3`` or ``name`` into (name, version or None).

    Only an all-digit suffix after the *last* ``@`` is a version: ``a@b`` and ``a@``
    are names. An empty or invalid name raises ``InvalidSpec``.
    """
    body = ref[len(ARTIFACT_SCHEME) :] if ref.startswith(ARTIFACT_SCHEME) else ref
    name, version = body, None
    at = body.rfind("@")
    if at >= 0:
        suffix = body[at + 1 :]
        if suffix and suffix.isascii() and suffix.isdigit():
            name, version = body[:at], int(suffix)
    if not name:
        raise InvalidSpec(f"invalid artifact ref {ref!r}: the name is empty")
    validate_artifact_name(name)
    return name, version


def format_artifact_ref(name: str, version: int) -> str:
    """``artifact://name@version``; :func:`parse_artifact_ref` reads it back."""
    return f"{ARTIFACT_SCHEME}{name}@{version}"


def _not_found(scope: ArtifactScope, name: str, version: int | None) -> ArtifactNotFound:
    what = f"artifact {name!r}" if version is None else f"artifact {name!r} version {version}"
    return ArtifactNotFound(
        f"{what} not found in scope {scope.describe(name)}; list_names() and list_versions() show what exists"
    )


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    raise InvalidSpec(f"artifact data must be bytes, got {type(data).__name__}; encode text first")


# -- in memory ------------------------------------------------------------------------

_Key = tuple[str, str, str | None, str]


def _key(scope: ArtifactScope, name: str) -> _Key:
    return (scope.app, scope.user, None if is_user_scoped(name) else scope.session, name)


class InMemoryArtifactService:
    """Artifacts in a dict, for tests and single-process use. Nothing is shared between instances."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._store: dict[_Key, dict[int, Artifact]] = {}
        self._last: dict[_Key, int] = {}

    async def save(self, scope: ArtifactScope, name: str, data: bytes, mime_type: str = _DEFAULT_MIME) -> int:
        validate_artifact_name(name)
        blob = _as_bytes(data)
        key = _key(scope, name)
        async with self._lock:
            version = self._last.get(key, 0) + 1
            self._last[key] = version
            self._store.setdefault(key, {})[version] = Artifact(name, version, blob, mime_type, time.time())
            return version

    async def load(self, scope: ArtifactScope, name: str, version: int | None = None) -> Artifact:
        validate_artifact_name(name)
        _check_version(version)
        async with self._lock:
            versions = self._store.get(_key(scope, name), {})
            wanted = max(versions, default=None) if version is None else version
            if wanted is None or wanted not in versions:
                raise _not_found(scope, name, version)
            return versions[wanted]

    async def list_versions(self, scope: ArtifactScope, name: str) -> list[int]:
        validate_artifact_name(name)
        async with self._lock:
            return sorted(self._store.get(_key(scope, name), {}))

    async def list_names(self, scope: ArtifactScope) -> list[str]:
        async with self._lock:
            return sorted(
                key[3]
                for key, versions in self._store.items()
                if versions and key[:2] == (scope.app, scope.user) and key[2] in (None, scope.session)
            )

    async def delete(self, scope: ArtifactScope, name: str, version: int | None = None) -> None:
        validate_artifact_name(name)
        _check_version(version)
        async with self._lock:
            versions = self._store.get(_key(scope, name), {})
            if version is None and versions:
                versions.clear()
            elif version is not None and version in versions:
                del versions[version]
            else:
                raise _not_found(scope, name, version)


# -- on disk --------------------------------------------------------------------------

_USER_DIR = "_user"
_META = "meta.json"
_DATA = "data"
_COMPONENT_MAX = 200  # bytes; file systems allow 255


def _encode(text: str) -> str:
    """One safe, reversible-enough directory name for ``text``.

    Percent-encoding leaves no ``/``; a leading dot is encoded so that ``.`` and
    ``..`` are plain names; ``~`` is encoded so it can only appear as the separator
    of the hash that keeps over-long names distinct.
    """
    enc = quote(text, safe="").replace("~", "%7E")
    if enc.startswith("."):
        enc = "%2E" + enc[1:]
    if len(enc) > _COMPONENT_MAX:
        enc = enc[:120] + "~" + hashlib.sha256(text.encode()).hexdigest()[:32]
    return enc


def _encode_session(session: str) -> str:
    enc = _encode(session)
    # ``_user`` holds the user-wide names; no session may map onto it
    return "%5F" + enc[1:] if enc.startswith("_") else enc


def _version_dirs(name_dir: Path) -> list[int]:
    """Every claimed version number (complete, incomplete or deleted)."""
    try:
        with os.scandir(name_dir) as it:
            return [int(e.name) for e in it if e.name.isascii() and e.name.isdigit()]
    except FileNotFoundError:
        return []


def _complete_versions(name_dir: Path) -> list[int]:
    """Versions whose ``meta.json`` exists: written last, so these are complete."""
    return sorted(v for v in _version_dirs(name_dir) if (name_dir / str(v) / _META).is_file())


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


class FileArtifactService:
    """Artifacts in a directory tree, safe across coroutines, threads and processes.

    Layout::

        root/<app>/<user>/<session | _user>/<encoded name>/<version>/{data, meta.json}

    A save claims its version by creating the version directory (``mkdir`` is
    atomic: of two writers only one succeeds, the other takes the next number),
    writes ``data`` through a temp file and rename, and writes ``meta.json`` last.
    A version directory without ``meta.json`` is incomplete (a save in progress or
    one that crashed) and is invisible to readers. A delete removes ``meta.json``
    first and keeps the empty directory, so the number is never handed out again.
    """

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def _name_dir(self, scope: ArtifactScope, name: str) -> Path:
        sub = _USER_DIR if is_user_scoped(name) else _encode_session(scope.session)
        return self.root / _encode(scope.app) / _encode(scope.user) / sub / _encode(name)

    async def save(self, scope: ArtifactScope, name: str, data: bytes, mime_type: str = _DEFAULT_MIME) -> int:
        validate_artifact_name(name)
        blob = _as_bytes(data)
        return await asyncio.to_thread(self._save, self._name_dir(scope, name), name, blob, mime_type)

    @staticmethod
    def _save(name_dir: Path, name: str, data: bytes, mime_type: str) -> int:
        name_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        while True:
            version = max(_version_dirs(name_dir), default=0) + 1
            vdir = name_dir / str(version)
            try:
                vdir.mkdir(mode=0o700)
            except FileExistsError:
                continue  # another writer claimed it first: take the next number
            break
        try:
            _write_atomic(vdir / _DATA, data)
            meta = {
                "name": name,
                "version": version,
                "mime_type": mime_type,
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "created_at": time.time(),
            }
            _write_atomic(vdir / _META, json.dumps(meta, sort_keys=True).encode())
        except BaseException:
            # never became visible (no meta.json): free the number again
            with contextlib.suppress(OSError):
                (vdir / _DATA).unlink()
            with contextlib.suppress(OSError):
                vdir.rmdir()
            raise
        return version

    async def load(self, scope: ArtifactScope, name: str, version: int | None = None) -> Artifact:
        validate_artifact_name(name)
        _check_version(version)
        return await asyncio.to_thread(self._load, scope, name, version)

    def _load(self, scope: ArtifactScope, name: str, version: int | None) -> Artifact:
        name_dir = self._name_dir(scope, name)
        candidates = reversed(_complete_versions(name_dir)) if version is None else [version]
        for v in candidates:
            art = _read_version(name_dir / str(v), name, v)
            if art is not None:
                return art
            # the latest was deleted while we looked: fall back to the one before
        raise _not_found(scope, name, version)

    async def list_versions(self, scope: ArtifactScope, name: str) -> list[int]:
        validate_artifact_name(name)
        return await asyncio.to_thread(_complete_versions, self._name_dir(scope, name))

    async def list_names(self, scope: ArtifactScope) -> list[str]:
        return await asyncio.to_thread(self._list_names, scope)

    def _list_names(self, scope: ArtifactScope) -> list[str]:
        base = self.root / _encode(scope.app) / _encode(scope.user)
        names: set[str] = set()
        for sub in (base / _encode_session(scope.session), base / _USER_DIR):
            try:
                with os.scandir(sub) as it:
                    dirs = [Path(e.path) for e in it if e.is_dir(follow_symlinks=False)]
            except FileNotFoundError:
                continue
            for name_dir in dirs:
                for v in reversed(_complete_versions(name_dir)):
                    meta = _read_meta(name_dir / str(v))
                    if meta is not None and isinstance(meta.get("name"), str):
                        names.add(meta["name"])
                        break
        return sorted(names)

    async def delete(self, scope: ArtifactScope, name: str, version: int | None = None) -> None:
        validate_artifact_name(name)
        _check_version(version)
        await asyncio.to_thread(self._delete, scope, name, version)

    def _delete(self, scope: ArtifactScope, name: str, version: int | None) -> None:
        name_dir = self._name_dir(scope, name)
        targets = _complete_versions(name_dir) if version is None else [version]
        removed = 0
        for v in targets:
            vdir = name_dir / str(v)
            meta = _read_meta(vdir)
            if meta is None or meta.get("name") != name:
                continue
            try:
                (vdir / _META).unlink()  # the version disappears here, atomically
            except FileNotFoundError:
                continue  # deleted concurrently
            removed += 1
            with contextlib.suppress(FileNotFoundError):
                (vdir / _DATA).unlink()
        if not removed:
            raise _not_found(scope, name, version)


def _read_meta(vdir: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads((vdir / _META).read_bytes())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def _read_version(vdir: Path, name: str, version: int) -> Artifact | None:
    meta = _read_meta(vdir)
    # the name check guards against two names sharing a directory (case-folding file systems)
    if meta is None or meta.get("name") != name:
        return None
    try:
        data = (vdir / _DATA).read_bytes()
    except FileNotFoundError:
        return None
    return Artifact(
        name=name,
        version=version,
        data=data,
        mime_type=str(meta.get("mime_type") or _DEFAULT_MIME),
        created_at=float(meta.get("created_at", 0.0)),
    )
