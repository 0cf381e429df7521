"""Snapshots, forks and restores of the workspaces under one root: copy-on-write where this process can mount
an overlay (root, :mod:`.layers`), plain copies elsewhere (:mod:`.snapshots`). Blocking; the manager runs it
in a thread.

In copy-on-write mode a snapshot of a fork copies only the fork's own changes (its overlay upper) as a new
layer over the chain the fork stands on, and a fork of a snapshot is an empty upper over that chain: its cost
does not grow with the workspace. The first snapshot or fork of a plain workspace that nothing runs in moves its
tree into the store whole (one rename, :meth:`Branches.layer`) and mounts the workspace again as an overlay over
it, so that it too costs what changed since; a plain workspace something holds (a program, a session, any process
of the host: :mod:`.holders`), or whose tree a copy would not keep whole (a hard link to a file outside it,
:func:`.treecopy.movable`), is copied instead.
Past :data:`MAX_DEPTH` layers a snapshot is flattened into one whole copy (read through the overlay), so reads
stay fast.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import InvalidSpec
from ..models import Snapshot
from .confinecore import DIR_FLAGS
from .holders import open_anywhere
from .layers import (
    LAYERS_DIR,
    chain_of,
    copy_root_attrs,
    layers_dir,
    mount_overlay,
    overlay_ready,
    unmount,
    write_record,
)
from .layout import METADATA_FILE
from .metadata import load_metadata, save_metadata
from .snapshots import SnapshotStore, exchange_dirs
from .treecopy import movable

__all__ = ["MAX_DEPTH", "Branches", "overlay_supported"]

#: Most layers under a fork: a snapshot past it is flattened into one whole copy.
MAX_DEPTH = 16


@functools.cache  # a fact of this kernel and privilege: probed once per process
def overlay_supported() -> bool:
    """Whether this process may mount overlays (as root, on a kernel that has them): forks are ``cow``."""
    if os.geteuid() != 0:
        return False
    scratch = Path(tempfile.mkdtemp(prefix="execspace-overlay-probe-"))
    return overlay_ready(scratch / "probe") and _rmdir(scratch)


def _rmdir(path: Path) -> bool:
    with contextlib.suppress(OSError):
        path.rmdir()
    return True


class Branches:
    def __init__(self, root: Path, *, cow: bool) -> None:
        self.root = root
        self.store = SnapshotStore(root)
        self.cow = cow
        # one thread of one process forks, snapshots and collects on a root at a time: a collection never
        # frees a layer being mounted (the thread lock, then an flock on the store, which a killed holder drops)
        self._lock = threading.Lock()

    def acquire(self) -> int:
        """Take the root's lock (blocking: from a worker thread); :meth:`release` gives it back, from any thread."""
        self._lock.acquire()
        try:
            fd = self.store.lock_file()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            self._lock.release()
            raise
        return fd

    def release(self, fd: int) -> None:
        os.close(fd)
        self._lock.release()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = self.acquire()
        try:
            yield
        finally:
            self.release(fd)

    # -- layering --------------------------------------------------------------------

    def acquire_to_layer(self, ws_dir: Path) -> tuple[int, bool]:
        """Take the root's lock (:meth:`acquire`) and say whether :meth:`layer` may move the plain workspace's tree:
        a walk of it (:func:`.treecopy.movable`) finds nothing the copy it replaces would leave out, such as a hard
        link to a file outside it, and no process of the host has it open (:func:`.holders.open_anywhere`). The
        caller releases the lock."""
        fd = self.acquire()
        try:
            return fd, self._movable(ws_dir)
        except BaseException:
            self.release(fd)
            raise

    def _movable(self, ws_dir: Path) -> bool:
        if not self.cow or chain_of(ws_dir) is not None or os.path.ismount(ws_dir):
            return False
        top = os.open(ws_dir, DIR_FLAGS)
        try:
            inodes = movable(top)
        finally:
            os.close(top)  # before looking for holders: this one is not
        return inodes is not None and not open_anywhere(inodes)

    def layer(self, ws_dir: Path, ws_id: str) -> bool:
        """Make the plain workspace ``ws_dir`` (nothing may run in it: its tree moves) an overlay over its own tree,
        moved whole into the store by a rename, with an empty upper: from then on a snapshot or fork copies only
        what changed since (:meth:`_snapshot`). The caller holds the lock (:meth:`acquire`). False where it stays
        plain (copies mode, already layered, a mount of its own such as a disk bound); :meth:`acquire_to_layer`
        says first whether the tree may move."""
        if not self.cow or chain_of(ws_dir) is not None or os.path.ismount(ws_dir):
            return False
        built = self.store.new_partial()
        try:
            upper = built / "upper"
            upper.mkdir(mode=0o700)
            (built / "work").mkdir(mode=0o700)
            top, dst = os.open(ws_dir, DIR_FLAGS), os.open(upper, DIR_FLAGS)
            try:
                copy_root_attrs(top, dst)
            finally:
                os.close(top)
                os.close(dst)
            snap_id = self.store.adopt(ws_dir, ws_id)
        except BaseException:
            self.store.discard(built)
            raise
        try:
            ws_dir.mkdir(mode=0o700)
            write_record(built, [snap_id])
            (self.root / LAYERS_DIR).mkdir(mode=0o700, exist_ok=True)
            os.rename(built, layers_dir(ws_dir))
            mount_overlay(ws_dir, [self.store.tree(snap_id)])
        except BaseException:
            self._unlayer(ws_dir, snap_id, built)
            raise
        return True

    def _unlayer(self, ws_dir: Path, snap_id: str, built: Path) -> None:
        """Put a workspace whose layering failed half-way back as it was (its tree, plain, at its path)."""
        if os.path.ismount(ws_dir):
            unmount(ws_dir)
        for leftover in (built, layers_dir(ws_dir)):
            if leftover.exists():
                shutil.rmtree(leftover)  # ours: an empty upper, a work directory, a record
        with contextlib.suppress(FileNotFoundError):
            ws_dir.rmdir()
        self.store.give_back(snap_id, ws_dir)

    # -- snapshots -------------------------------------------------------------------

    def snapshot(self, ws_dir: Path, ws_id: str, name: str | None) -> Snapshot:
        with self._locked():
            return self._snapshot(ws_dir, ws_id, name)

    def _snapshot(self, ws_dir: Path, ws_id: str, name: str | None) -> Snapshot:
        chain = chain_of(ws_dir)
        if chain is None or len(chain) >= MAX_DEPTH:
            return self.store.take(ws_dir, ws_id, name)  # a whole copy (through the overlay when flattening)
        parent = load_metadata(ws_dir).forked_from
        return self.store.take(layers_dir(ws_dir) / "upper", ws_id, name, base=chain, parent=parent)

    def remove_snapshot(self, key: Snapshot | str) -> None:
        with self._locked():
            self.store.remove(key, self._live())

    def collect(self) -> None:
        """Free removed snapshots nothing stands on any more (after a fork was cleaned up)."""
        if self.store.dir.is_dir():
            with self._locked():
                self.store.collect(self._live())

    def _live(self) -> list[list[str]]:
        try:
            names = os.listdir(self.root / LAYERS_DIR)
        except FileNotFoundError:
            return []
        return [c for n in names if (c := chain_of(self.root / n)) is not None]

    # -- forks -----------------------------------------------------------------------

    def fork(self, source: Path | Snapshot, ws_id: str, targets: list[tuple[str, Path]]) -> None:
        """Make each ``(new_id, ws_dir)`` of ``targets`` a workspace with the files of ``source`` (a workspace
        directory, of the workspace ``ws_id``, or a snapshot). Each is built aside and moved into place whole."""
        with self._locked():
            if isinstance(source, Snapshot):
                for new_id, ws_dir in targets:
                    self._fork_snapshot(source, new_id, ws_dir)
            elif self.cow:
                # the live workspace's state, frozen once (unlisted: freed when its last fork goes)
                snap = self._snapshot(source, ws_id, None)
                try:
                    for new_id, ws_dir in targets:
                        self._fork_snapshot(snap, new_id, ws_dir, f"workspace:{ws_id}")
                finally:
                    self.store.remove(snap, self._live())
            else:
                for new_id, ws_dir in targets:
                    copy = self.store.copy_workspace(source, new_id, f"workspace:{ws_id}")
                    self._move_into_place(copy, ws_dir, new_id)

    def _fork_snapshot(self, snap: Snapshot, new_id: str, ws_dir: Path, origin: str | None = None) -> None:
        if not self.cow:
            self._move_into_place(self.store.materialize(snap, new_id), ws_dir, new_id)
            return
        chain = self.store.chain(snap)
        built = self._layers(chain, new_id, origin or snap.id)
        try:
            (self.root / LAYERS_DIR).mkdir(mode=0o700, exist_ok=True)
            if ws_dir.exists() or layers_dir(ws_dir).exists():
                raise InvalidSpec(f"fork: a workspace with id {new_id!r} appeared meanwhile; pick another id")
            os.rename(built, layers_dir(ws_dir))
        finally:
            self.store.discard(built)
        ws_dir.mkdir(mode=0o700)
        mount_overlay(ws_dir, [self.store.tree(c) for c in chain])

    def _layers(self, chain: list[str], ws_id: str, origin: str) -> Path:
        """A fork's own layers, built aside: an empty upper with the snapshot's root (owner, mode, uid nonce)
        and its record naming ``ws_id``, and the overlay's work directory."""
        built = self.store.new_partial()
        try:
            upper = built / "upper"
            upper.mkdir(mode=0o700)
            (built / "work").mkdir(mode=0o700)
            top = os.open(self.store.tree(chain[0]), DIR_FLAGS)
            dst = os.open(upper, DIR_FLAGS)
            try:
                copy_root_attrs(top, dst)
            finally:
                os.close(top)
                os.close(dst)
            meta = load_metadata(self._with_metadata(chain), ws_id)
            meta.id, meta.forked_from = ws_id, origin
            save_metadata(upper, meta)
            write_record(built, chain)
        except BaseException:
            self.store.discard(built)
            raise
        return built

    def _with_metadata(self, chain: list[str]) -> Path:
        for snap_id in chain:  # the topmost layer that has the record (whiteouts of it are never made)
            if (self.store.tree(snap_id) / METADATA_FILE).is_file():
                return self.store.tree(snap_id)
        return self.store.tree(chain[0])

    def _move_into_place(self, copy: Path, ws_dir: Path, new_id: str) -> None:
        try:
            if ws_dir.exists():
                raise InvalidSpec(f"fork: a workspace with id {new_id!r} appeared meanwhile; pick another id")
            os.rename(copy, ws_dir)
        finally:
            self.store.discard(copy.parent)

    # -- restore ---------------------------------------------------------------------

    def restore(self, ws_dir: Path, ws_id: str, snap: Snapshot) -> None:
        """Give ``ws_dir`` the files of ``snap``; its programs must be stopped. Each step swaps whole trees."""
        with self._locked():
            if not self.cow:
                copy = self.store.materialize(snap, ws_id)
                try:
                    exchange_dirs(copy, ws_dir)
                finally:
                    self.store.discard(copy.parent)
                return
            chain = self.store.chain(snap)
            built = self._layers(chain, ws_id, snap.id)
            try:
                if chain_of(ws_dir) is not None:
                    unmount(ws_dir)
                    exchange_dirs(built, layers_dir(ws_dir))  # the old layers are the ones discarded now
                else:
                    old = self.store.new_partial()
                    (old / "empty").mkdir(mode=0o700)
                    exchange_dirs(old / "empty", ws_dir)  # the plain tree moves aside, whole
                    (self.root / LAYERS_DIR).mkdir(mode=0o700, exist_ok=True)
                    os.rename(built, layers_dir(ws_dir))
                    self.store.discard(old)
            finally:
                self.store.discard(built)
            mount_overlay(ws_dir, [self.store.tree(c) for c in chain])
            self.store.collect(self._live())

    def ensure_mounted(self, ws_dir: Path) -> None:
        """Mount a fork's overlay again where it is not (after a reboot; or a killed fork's, which was
        complete before it was moved into place)."""
        chain = chain_of(ws_dir)
        if chain is not None:
            ws_dir.mkdir(mode=0o700, exist_ok=True)
            mount_overlay(ws_dir, [self.store.tree(c) for c in chain])
