"""Snapshots of host-directory workspaces, and the copies a fork or a restore starts from.

::

    <root>/.snapshots/            0700, never inside any sandbox
      <snap-id>/snapshot.json     what it is (id, name, workspace, parent, time, size)
      <snap-id>/tree/             the frozen tree: a whole copy, or a layer over the snapshots its record's
                                  "chain" names (copy-on-write, :mod:`.branches`)
      .partial-<pid>-<hex>/       a snapshot, fork or restore being built
      .lock                       held (flock) by whoever changes the store

Everything is built under a ``.partial-*`` name and renamed into place when complete, so a process killed
mid-way leaves no half-made snapshot or workspace that anything lists or uses; the next store on the root
removes what dead processes left. A removed snapshot is unlisted at once and its tree freed once no listed
snapshot and no fork stands on it (:meth:`SnapshotStore.collect`), so removing it, its workspace or any fork of it
never breaks another.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..errors import InvalidSpec, PathDenied, SetupFailed, SnapshotNotFound
from ..models import Snapshot
from ..owner import pid_alive
from .confine import remove_tree
from .confinecore import DIR_FLAGS
from .layers import copy_root_attrs, merged_view
from .layout import METADATA_FILE
from .metadata import load_metadata, save_metadata
from .treecopy import copy_tree, tree_size

__all__ = ["SNAPSHOTS_DIR", "SnapshotStore", "exchange_dirs"]

SNAPSHOTS_DIR = ".snapshots"
_RECORD = "snapshot.json"
_TREE = "tree"
_PARTIAL = re.compile(r"\.partial-(\d+)-[0-9a-f]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:+-]{0,127}")
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


class SnapshotStore:
    """The snapshots kept under one workspace root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.dir = root / SNAPSHOTS_DIR
        # as root the trees keep their owners (a sandbox workspace's files belong to its sandbox uid)
        self._keep_owner = os.geteuid() == 0
        self._ready = False

    def _open(self) -> int:
        if not self._ready:
            with contextlib.suppress(FileExistsError):
                self.dir.mkdir(mode=0o700)
            st = self.dir.lstat()
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
                raise SetupFailed("snapshots", f"{self.dir} is not a directory of this user", "remove it and retry")
            os.chmod(self.dir, 0o700)
            self._ready = True
            self._remove_abandoned()
        return os.open(self.dir, DIR_FLAGS)

    def _remove_abandoned(self) -> None:
        """Remove what a killed process was building (its pid is gone)."""
        for name in os.listdir(self.dir):
            m = _PARTIAL.fullmatch(name)
            if m is not None and not pid_alive(int(m.group(1))):
                with contextlib.suppress(OSError):
                    self._remove(name)

    def lock_file(self) -> int:
        """An fd of the store's lock file (``.lock``), to ``flock``: held by whoever changes the store."""
        dfd = self._open()
        try:
            return os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        finally:
            os.close(dfd)

    def new_partial(self) -> Path:
        """A fresh empty directory to build in (renamed into place by the caller, or removed)."""
        dfd = self._open()
        try:
            name = f".partial-{os.getpid()}-{secrets.token_hex(6)}"
            os.mkdir(name, 0o700, dir_fd=dfd)
        finally:
            os.close(dfd)
        return self.dir / name

    def discard(self, partial: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._remove(partial.name)

    def _remove(self, name: str) -> None:
        dfd = os.open(self.dir, DIR_FLAGS)
        try:
            remove_tree(dfd, name, str(self.dir / name))
        finally:
            os.close(dfd)

    # -- snapshots -------------------------------------------------------------------

    def take(
        self, src: Path, ws_id: str, name: str | None, *, base: list[str] | None = None, parent: str | None = None
    ) -> Snapshot:
        """Freeze a copy of ``src`` as a new snapshot of the workspace ``ws_id``: of its whole tree, or with
        ``base`` (the chain under a copy-on-write fork) of its overlay upper, a layer over that chain."""
        self._check_name(name)
        partial = self.new_partial()
        try:
            tree = partial / _TREE
            tree.mkdir(mode=0o700)
            size = copy_from(src, tree, keep_owner=self._keep_owner, layer=base is not None)
            if base is None:
                parent = load_metadata(tree).forked_from
            snap_id = f"snap-{secrets.token_hex(8)}"
            snap = Snapshot(snap_id, name, ws_id, parent, time.time(), size, self.dir / snap_id / _TREE)
            record = {k: v for k, v in asdict(snap).items() if k != "path"}
            _write_json(partial / _RECORD, {**record, "chain": [snap_id, *(base or [])], "removed": False})
            os.rename(partial, self.dir / snap_id)
        except BaseException:
            self.discard(partial)
            raise
        return snap

    def adopt(self, tree: Path, ws_id: str) -> str:
        """Move the whole tree ``tree`` (a plain workspace nothing runs in) into the store as an unlisted layer, by
        one rename, and return its id; the caller mounts the workspace again over it. Its size is not counted: an
        unlisted layer is never shown."""
        partial = self.new_partial()
        try:
            snap_id = f"snap-{secrets.token_hex(8)}"
            parent = load_metadata(tree).forked_from
            snap = Snapshot(snap_id, None, ws_id, parent, time.time(), 0, self.dir / snap_id / _TREE)
            record = {k: v for k, v in asdict(snap).items() if k != "path"}
            _write_json(partial / _RECORD, {**record, "chain": [snap_id], "removed": True})
            os.rename(tree, partial / _TREE)
        except BaseException:
            self.discard(partial)
            raise
        try:
            os.rename(partial, self.dir / snap_id)
        except BaseException:
            os.rename(partial / _TREE, tree)  # the workspace's files go back where they were
            self.discard(partial)
            raise
        return snap_id

    def give_back(self, snap_id: str, tree: Path) -> None:
        """Undo :meth:`adopt`: the layer's tree back at ``tree`` (which must not exist), its entry gone."""
        os.rename(self.tree(snap_id), tree)
        self._remove(snap_id)

    def _check_name(self, name: str | None) -> None:
        if name is None:
            return
        if not _NAME.fullmatch(name):
            raise InvalidSpec(
                f"snapshot name {name!r}: use 1-128 letters, digits and _.@:+- (starting with a letter or digit)"
            )
        if any(s.name == name for s in self.list()):
            raise InvalidSpec(f"a snapshot named {name!r} exists: remove it first or pick another name")

    def chain(self, snap: Snapshot) -> list[str]:
        """The snapshot ids whose trees make ``snap``, top first (one, for a whole copy)."""
        chain: Any = self._record(snap.id).get("chain", [snap.id])
        return [str(c) for c in chain]

    def tree(self, snap_id: str) -> Path:
        return self.dir / snap_id / _TREE

    def _record(self, snap_id: str) -> dict[str, Any]:
        fd = os.open(self.dir / snap_id / _RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            raw = json.loads(f.read(1024 * 1024))
        if not isinstance(raw, dict):
            raise ValueError("not a snapshot record")
        return raw

    def list(self) -> list[Snapshot]:
        """Every complete snapshot, oldest first (a corrupt record is skipped, not repaired)."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        found = [s for n in names if n.startswith("snap-") and (s := self._load(n)) is not None]
        return sorted(found, key=lambda s: s.created_at)

    def _load(self, snap_id: str) -> Snapshot | None:
        try:
            raw: Any = self._record(snap_id)
            if raw.get("removed"):
                return None  # removed, kept only while a fork's overlay still stands on it
            return Snapshot(
                id=snap_id,
                name=raw["name"],
                workspace=str(raw["workspace"]),
                parent=raw["parent"],
                created_at=float(raw["created_at"]),
                size=int(raw["size"]),
                path=self.dir / snap_id / _TREE,
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def get(self, key: Snapshot | str) -> Snapshot:
        """The snapshot of that id or name.

        Raises:
            SnapshotNotFound: there is none (it was removed, or never taken on this root).
        """
        want = key.id if isinstance(key, Snapshot) else key
        for snap in self.list():
            if want in (snap.id, snap.name):
                return snap
        raise SnapshotNotFound(f"no snapshot {want!r} under {self.dir}: list_snapshots() shows them")

    def remove(self, key: Snapshot | str, live: Sequence[Sequence[str]]) -> None:
        """Remove a snapshot: unlisted at once, its tree freed once nothing stands on it (``live``: the chains
        under the copy-on-write forks of this root). What was forked or restored from it keeps working."""
        snap = self.get(key)
        record = self._record(snap.id)
        tmp = self.dir / snap.id / f".{_RECORD}.{secrets.token_hex(4)}"
        _write_json(tmp, {**record, "removed": True})
        os.replace(tmp, self.dir / snap.id / _RECORD)
        self.collect(live)

    def collect(self, live: Sequence[Sequence[str]]) -> None:
        """Free the trees of removed snapshots that no listed snapshot and no fork (``live``) stands on."""
        try:
            names = [n for n in os.listdir(self.dir) if n.startswith("snap-")]
        except FileNotFoundError:
            return
        records: dict[str, dict[str, Any]] = {}
        for n in names:
            with contextlib.suppress(OSError, ValueError):
                records[n] = self._record(n)
        used = {c for chain in live for c in chain}
        used |= {str(c) for r in records.values() if not r.get("removed") for c in r.get("chain", [])}
        for snap_id, record in records.items():
            if record.get("removed") and snap_id not in used:
                # renamed away first: from that instant nobody reads a half-removed tree
                doomed = self.new_partial()
                os.rename(self.dir / snap_id, doomed / "old")
                self.discard(doomed)

    def materialize(self, snap: Snapshot, ws_id: str) -> Path:
        """A complete copy of ``snap`` built under a partial name, recorded as the workspace ``ws_id`` forked
        from it; the caller renames it into place (or :meth:`discard` s it). A layered snapshot is copied
        from its merged view (a read-only overlay of its chain: as root, who made it)."""
        chain = self.chain(snap)
        if len(chain) == 1:
            return self.copy_workspace(snap.path, ws_id, snap.id)
        scratch = self.new_partial()
        try:
            with merged_view([self.tree(c) for c in chain], scratch / "merged") as merged:
                return self.copy_workspace(merged, ws_id, snap.id)
        finally:
            self.discard(scratch)

    def copy_workspace(self, src: Path, ws_id: str, origin: str) -> Path:
        """A complete copy of the tree ``src`` built under a partial name, recorded as the workspace ``ws_id``
        descended from ``origin``; the caller renames it into place (or :meth:`discard` s its parent)."""
        partial = self.new_partial()
        try:
            copy = partial / "ws"
            copy.mkdir(mode=0o700)
            copy_from(src, copy, keep_owner=self._keep_owner)
            record_origin(copy, ws_id, origin)
        except BaseException:
            self.discard(partial)
            raise
        return copy


def copy_from(src_dir: Path, dst_dir: Path, *, keep_owner: bool, layer: bool = False) -> int:
    """Copy the tree at ``src_dir`` (never a link) into the empty ``dst_dir``; the bytes it takes. As root
    the root's ``trusted.execspace.*`` attributes come too (a sandbox workspace's uid nonce: forks standing on
    this copy run as the uid that owns its files)."""
    try:
        sfd = os.open(src_dir, DIR_FLAGS)
    except OSError as exc:
        raise PathDenied(str(src_dir), f"cannot open it as a directory ({exc.strerror})") from exc
    try:
        dfd = os.open(dst_dir, DIR_FLAGS)
        try:
            copy_tree(sfd, dfd, keep_owner=keep_owner, layer=layer)
            if keep_owner:
                copy_root_attrs(sfd, dfd)
            return tree_size(dfd)
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)


def record_origin(ws_dir: Path, ws_id: str, origin: str) -> None:
    """The copy is the workspace ``ws_id`` now (not the one it was copied from), descended from ``origin``."""
    if not (ws_dir / METADATA_FILE).is_file():
        return
    meta = load_metadata(ws_dir, ws_id)
    meta.id = ws_id
    meta.forked_from = origin
    save_metadata(ws_dir, meta)


def _write_json(path: Path, data: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)


def exchange_dirs(a: Path, b: Path) -> None:
    """Swap two directories in one step (``renameat2(RENAME_EXCHANGE)``): at every instant each path is one
    whole tree, so a restore never leaves its workspace missing or half-copied."""
    libc = ctypes.CDLL(None, use_errno=True)  # libc, already loaded (find_library would run ldconfig)
    rc = libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a))
