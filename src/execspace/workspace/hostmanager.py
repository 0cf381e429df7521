"""WorkspaceManager for host-directory workspaces (local, sandbox)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import stat
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from ..audit import AuditSink
from ..errors import CapabilityError, InvalidSpec, PathDenied, SetupFailed, WorkspaceNotFound
from ..models import Persistence, Snapshot, Workspace, WorkspacePolicy
from ..tracing import (
    NO_TRACER,
    WORKSPACE_CLEANUP,
    WORKSPACE_CREATE,
    WORKSPACE_FORK,
    WORKSPACE_RESTORE,
    WORKSPACE_SNAPSHOT,
    AttributeValue,
    Tracer,
)
from .branches import Branches, overlay_supported
from .confine import remove_tree
from .diskimages import ensure_disk_mounted, image_of, make_disk, remove_disk
from .layers import chain_of, remove_layers
from .layout import METADATA_FILE, ensure_layout, sanitize_id
from .metadata import WorkspaceMetadata, save_metadata

__all__ = ["HostWorkspaceManager", "default_workspace_root", "remove_workspace_tree"]

#: Most forks one call makes (as E2B's fork API allows).
_MAX_FORKS = 100


def default_workspace_root() -> Path:
    """``$TMPDIR/execspace-<uid>/workspaces``: private to this user."""
    return Path(tempfile.gettempdir()) / f"execspace-{os.getuid()}" / "workspaces"


def private_dir(path: Path, mode: int = 0o700, *, keep_mode: bool = False) -> None:
    """Create ``path`` with ``mode`` (0700, or 0711 when a sandbox uid must traverse it)
    and check that nobody else planted or owns it. A parent named ``execspace-<uid>``
    is kept at 0711: traversable, not listable, shared by the backends' roots. With ``keep_mode``, a ``path``
    that exists keeps its mode (a directory of the user's is never changed)."""
    checks = [(path, mode)]
    if path.parent.name.startswith("execspace-"):
        checks.insert(0, (path.parent, 0o711))
    checks[0][0].parent.mkdir(parents=True, exist_ok=True)
    # a shared /tmp lets another user pre-create our directory: refuse to use it, and
    # check each level before creating the next so nothing is made through a planted link
    for p, want in checks:
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=want)
        st = p.lstat()
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise SetupFailed("workspace root", f"{p} is a symlink or not a directory", "remove it and retry")
        if st.st_uid != os.getuid():
            raise SetupFailed("workspace root", f"{p} is owned by uid {st.st_uid}", "remove it or pick another root")
        if st.st_mode & 0o777 != want and not (keep_mode and p == path):
            os.chmod(p, want)


class HostWorkspaceManager:
    """Workspaces as directories under ``root``; one per id (session) or per call (turn)."""

    def __init__(
        self,
        backend: str,
        root: Path | None = None,
        *,
        prepare: Callable[[Path], None] | None = None,
        program_path: Callable[[Path], str] = str,
        program_binds: tuple[tuple[str, str], ...] = (),
        private_root: bool = True,
        adopt: Callable[[Path], bool] | None = None,
        refill: Callable[[], None] | None = None,
        stop_programs: Callable[[Workspace], Awaitable[None]] | None = None,
        copy_on_write: bool = False,
        freeze: Callable[[Workspace], contextlib.AbstractAsyncContextManager[None]] | None = None,
        disk_bytes: int | None = None,
        keep_root_mode: bool = False,
        holds: Callable[[Workspace], bool] | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        """``adopt`` is offered each new workspace directory under ``root`` before it is made, and returns True
        when it put a directory there itself (a warm pool's slot, see :mod:`.slots`); ``refill`` runs on the
        event loop after each creation, failed ones too (the pool tops up what it gave). ``stop_programs`` kills
        every program still running in a workspace; cleanup awaits it before removing the tree (the runner
        knows the programs, e.g. :meth:`~execspace.process.hostrunner.HostRunner.stop_programs`).
        ``copy_on_write`` lets forks be overlays where this process can mount them (root): only for backends
        whose programs see the workspace through a mount of its path (local, sandbox). ``freeze`` stops the
        workspace's programs for a block (:meth:`~execspace.process.hostrunner.HostRunner.frozen`): a snapshot,
        or a fork of the live workspace, copies a state none of them changes meanwhile. ``disk_bytes`` puts each
        new workspace under ``root`` on a filesystem of that size (:mod:`.diskimages`, root only; the caller checks
        :func:`.diskimages.disk_tools_missing`); such workspaces have no snapshots or forks. ``keep_root_mode``
        leaves the mode of a root that exists as it is (``execspace ws`` over a root it did not make, such as the
        user's directory holding a ``--workspace DIR``); the root is made private only when it is created.
        ``holds`` says whether anything of the backend holds the workspace's tree now (a program, a session): the
        first snapshot or fork of a plain workspace nothing holds makes it copy-on-write itself
        (:meth:`.Branches.layer`), so that it and every later one copies only what changed. ``tracer`` makes a span
        of each creation, clean-up, snapshot, fork and restore; ``audit`` gets a line of each creation and
        clean-up."""
        self.backend = backend
        self.tracer = tracer
        self.audit = audit
        self._stop_programs = stop_programs
        self._adopt = adopt
        self._refill = refill
        self._program_path = program_path
        self._program_binds = program_binds
        self._private_root = private_root
        self._keep_root_mode = keep_root_mode
        self.root = Path(root) if root is not None else default_workspace_root()
        self._prepare = prepare
        self._known: dict[str, Workspace] = {}
        self._creating: dict[str, asyncio.Future[Workspace]] = {}
        self._root_ready = False
        self._copy_on_write = copy_on_write
        self._freeze = freeze
        self._holds = holds
        self._branches: Branches | None = None
        self.disk_bytes = disk_bytes

    async def create_workspace(
        self, exec_id: str, policy: WorkspacePolicy | None = None, *, path: Path | None = None
    ) -> Workspace:
        with self.tracer.span(WORKSPACE_CREATE, self._attributes(exec_id)):
            try:
                ws = await self._create_or_join(exec_id, policy or WorkspacePolicy(), path)
            finally:
                if self._refill is not None:
                    self._refill()
        if self.audit is not None:
            self.audit.record("workspace.create", {"workspace": ws.id, "backend": self.backend})
        return ws

    async def _create_or_join(self, exec_id: str, policy: WorkspacePolicy, path: Path | None) -> Workspace:
        if path is None and policy.persistence is Persistence.SESSION and self._cached(exec_id):
            return self._known[exec_id]
        session = policy.persistence is Persistence.SESSION
        key = f"{exec_id}\0{path}" if path is not None else exec_id
        task = self._creating.get(key) if session else None
        if task is None:
            task = asyncio.ensure_future(self._create_shared(key, exec_id, policy, path))
            # if every caller was cancelled, nobody reads a failure: mark it retrieved
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            if session:
                self._creating[key] = task
        # the creation runs in its own task: a cancelled caller stops waiting, the others still get it
        return await asyncio.shield(task)

    async def _create_shared(self, key: str, exec_id: str, policy: WorkspacePolicy, path: Path | None) -> Workspace:
        session = policy.persistence is Persistence.SESSION
        try:
            ws = await asyncio.to_thread(self._create, exec_id, policy, path)
        finally:
            if session:
                self._creating.pop(key, None)
        if session and path is None:
            self._known[exec_id] = ws
        return ws

    def _create(self, exec_id: str, policy: WorkspacePolicy, path: Path | None) -> Workspace:
        if path is not None:
            if self.disk_bytes is not None:
                raise CapabilityError(
                    "a disk-bounded workspace at a path of the caller's", self.backend, "omit path= (or the disk bound)"
                )
            ws_dir = Path(path).absolute()
            if ws_dir.is_symlink():
                raise PathDenied(str(ws_dir), "the workspace directory must not be a symlink")
            ws_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
        else:
            self._ensure_root()
            name = sanitize_id(exec_id)
            if policy.persistence is Persistence.TURN:
                name = f"{name}-{secrets.token_hex(4)}"
            ws_dir = self.root / name
            if self._adopt is None or not self._adopt(ws_dir):
                # 0700: the root may be traversable (0711, for a sandbox uid) and workspace names are guessable
                ws_dir.mkdir(mode=0o700, exist_ok=True)
            if self.disk_bytes is not None:
                self._bound(ws_dir, self.disk_bytes)
        return self._laid_out(ws_dir, exec_id, policy)

    def _bound(self, ws_dir: Path, size: int) -> None:
        """Put ``ws_dir`` on its own filesystem of ``size`` bytes, or mount again the one it has."""
        if image_of(ws_dir).exists():
            ensure_disk_mounted(ws_dir)
            return
        with os.scandir(ws_dir) as entries:
            empty = next(entries, None) is None
        if empty:
            try:
                make_disk(ws_dir, size)
            except BaseException:
                ws_dir.rmdir()  # a workspace that could not be bounded is not made at all
                raise
        else:
            raise SetupFailed(
                self.backend,
                f"the workspace {ws_dir} exists without a disk bound",
                "remove it (execspace ws rm) or open it with an engine that has no disk bound",
            )

    def _laid_out(self, ws_dir: Path, exec_id: str, policy: WorkspacePolicy) -> Workspace:
        if chain_of(ws_dir) is not None:
            self.branches.ensure_mounted(ws_dir)
        ensure_layout(ws_dir)
        if not (ws_dir / METADATA_FILE).exists():
            save_metadata(ws_dir, WorkspaceMetadata(id=exec_id))
        if self._prepare is not None:
            self._prepare(ws_dir)
        return Workspace(
            id=exec_id,
            path=self._program_path(ws_dir),
            backend=self.backend,
            host_path=ws_dir,
            policy=policy,
            program_binds=self._program_binds,
        )

    def _cached(self, exec_id: str) -> bool:
        """Whether a cached handle exists and its directory is still there (another
        engine on the same root may have cleaned it up)."""
        ws = self._known.get(exec_id)
        if ws is None:
            return False
        if ws.host_path is not None and not ws.host_path.is_dir():
            del self._known[exec_id]
            return False
        return True

    async def get_workspace(self, exec_id: str) -> Workspace:
        if self._cached(exec_id):
            return self._known[exec_id]
        ws_dir = self.root / sanitize_id(exec_id)
        if chain_of(ws_dir) is not None:
            await asyncio.to_thread(self.branches.ensure_mounted, ws_dir)
        # one this manager is making has no record yet either: not a leftover
        laid_out = await asyncio.to_thread(self._disk_laid_out, ws_dir, exec_id in self._creating)
        if not laid_out or not (ws_dir / METADATA_FILE).exists():
            raise WorkspaceNotFound(
                f"no workspace for id {exec_id!r} under {self.root}; create it with create_workspace()"
            )
        ws = Workspace(
            id=exec_id,
            path=self._program_path(ws_dir),
            backend=self.backend,
            host_path=ws_dir,
            program_binds=self._program_binds,
        )
        self._known[exec_id] = ws
        return ws

    @staticmethod
    def _disk_laid_out(ws_dir: Path, creating: bool) -> bool:
        """Mount a disk-bounded workspace's image again where it is not (after a reboot); False when its disk was
        made but never laid out (its maker died in between: it never was a workspace), which is removed then, so
        that no mount or image outlives it. True for a workspace without a disk bound."""
        if not image_of(ws_dir).exists():
            return True
        ensure_disk_mounted(ws_dir)
        if creating or (ws_dir / METADATA_FILE).exists():
            return True
        remove_workspace_tree(ws_dir)
        return False

    # -- snapshots and forks (see .branches) ---------------------------------------------------------------

    @property
    def branches(self) -> Branches:
        if self._branches is None:
            self._branches = Branches(self.root, cow=self._copy_on_write and overlay_supported())
        return self._branches

    @property
    def fork_mode(self) -> Literal["cow", "copy"]:
        return "cow" if self.branches.cow else "copy"

    async def snapshot(self, ws: Workspace, name: str | None = None) -> Snapshot:
        """Freeze the workspace's files now, its programs stopped meanwhile where the backend can (see
        ``freeze``). Processes and kernels are never part of a snapshot."""
        with self.tracer.span(WORKSPACE_SNAPSHOT, self._attributes(ws.id)) as span:
            ws_dir = self._own_dir(ws)
            self._refuse_branches("a snapshot")
            self._ensure_root()
            await self._layer(ws, ws_dir)
            async with self._frozen(ws):
                snap = await asyncio.to_thread(self.branches.snapshot, ws_dir, ws.id, name)
            span.set("execspace.snapshot.id", snap.id)
            return snap

    async def _layer(self, ws: Workspace, ws_dir: Path) -> None:
        """Make the plain workspace copy-on-write where nothing holds its tree (its tree moves: a program in it
        would go on writing the frozen layer). The check and the move happen in one step of the event loop, so no
        run of this engine starts in between; the lock, the walk that says whether the tree may move (no hard link
        out of it) and the look for other processes holding it (:meth:`.Branches.acquire_to_layer`) are taken
        aside, in a thread: they take a while."""
        if self._holds is None or not self.branches.cow or chain_of(ws_dir) is not None or self._holds(ws):
            return
        taking = asyncio.ensure_future(asyncio.to_thread(self.branches.acquire_to_layer, ws_dir))
        try:
            fd, movable = await asyncio.shield(taking)
        except asyncio.CancelledError:  # the thread still takes it: given back then
            taking.add_done_callback(self._give_back)
            raise
        try:
            if movable and not self._holds(ws):
                self.branches.layer(ws_dir, ws.id)
        finally:
            self.branches.release(fd)

    def _give_back(self, taken: asyncio.Future[tuple[int, bool]]) -> None:
        if not taken.cancelled() and taken.exception() is None:
            self.branches.release(taken.result()[0])

    def _frozen(self, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        return self._freeze(ws) if self._freeze is not None else contextlib.nullcontext()

    async def list_snapshots(self) -> list[Snapshot]:
        return await asyncio.to_thread(self.branches.store.list)

    async def get_snapshot(self, key: str) -> Snapshot:
        """The snapshot of that id or name (``SnapshotNotFound`` when there is none)."""
        return await asyncio.to_thread(self.branches.store.get, key)

    async def remove_snapshot(self, snapshot: Snapshot | str) -> None:
        """Remove a snapshot (by handle, id or name); what was forked or restored from it keeps working."""
        await asyncio.to_thread(self.branches.remove_snapshot, snapshot)

    async def fork(
        self,
        source: Workspace | Snapshot | str,
        count: int = 1,
        ids: Sequence[str] | None = None,
        *,
        policy: WorkspacePolicy | None = None,
    ) -> list[Workspace]:
        """``count`` new workspaces, each starting with the files of ``source`` (a workspace now, or a
        snapshot: its handle, id or name); ``ids`` names them (default ``<source id>/fork-<hex>``). Each is
        complete before it is listed: one killed mid-way leaves nothing behind that a manager uses."""
        source_id = source.id if isinstance(source, Workspace | Snapshot) else source
        attributes: dict[str, AttributeValue] = {
            "execspace.fork.source": source_id,
            "execspace.fork.count": max(count, len(ids or ())),
        }
        with self.tracer.span(WORKSPACE_FORK, self._attributes(None, attributes)):
            return await self._fork(source, count, ids, policy)

    async def _fork(
        self, source: Workspace | Snapshot | str, count: int, ids: Sequence[str] | None, policy: WorkspacePolicy | None
    ) -> list[Workspace]:
        self._refuse_branches("a fork")
        if not isinstance(source, Workspace):
            source = await asyncio.to_thread(self.branches.store.get, source)
        new_ids = self._fork_ids(source, count, ids)
        self._ensure_root()
        pol = policy or WorkspacePolicy(persistence=Persistence.SESSION)
        targets = [(new_id, self.root / sanitize_id(new_id)) for new_id in new_ids]
        origin = self._own_dir(source) if isinstance(source, Workspace) else source
        if isinstance(source, Workspace) and isinstance(origin, Path):
            await self._layer(source, origin)
        async with self._frozen(source) if isinstance(source, Workspace) else contextlib.nullcontext():
            await asyncio.to_thread(self.branches.fork, origin, source.id, targets)
        forks = [await asyncio.to_thread(self._laid_out, ws_dir, new_id, pol) for new_id, ws_dir in targets]
        self._known.update((ws.id, ws) for ws in forks)
        return forks

    def _fork_ids(self, source: Workspace | Snapshot, count: int, ids: Sequence[str] | None) -> list[str]:
        if ids is not None:
            new_ids = list(ids)
            if len(new_ids) != count and count != 1:
                raise InvalidSpec(f"fork: {len(new_ids)} ids for count={count}; give one id per fork")
        else:
            base = source.id if isinstance(source, Workspace) else source.workspace
            new_ids = [f"{base}/fork-{secrets.token_hex(4)}" for _ in range(count)]
        if not 1 <= len(new_ids) <= _MAX_FORKS:
            raise InvalidSpec(f"fork: count must be 1..{_MAX_FORKS}, got {len(new_ids)}")
        if len(set(new_ids)) != len(new_ids):
            raise InvalidSpec("fork: the ids must be distinct")
        for new_id in new_ids:
            if (self.root / sanitize_id(new_id)).exists():
                raise InvalidSpec(f"fork: a workspace with id {new_id!r} exists; remove it or pick another id")
        return new_ids

    async def restore(self, ws: Workspace, snapshot: Snapshot | str) -> None:
        """Bring the workspace's files back to ``snapshot`` (every byte and mode; what was added since is
        gone). Programs still running in it are stopped first; each step swaps whole trees, so the workspace
        is never seen half-restored."""
        with self.tracer.span(WORKSPACE_RESTORE, self._attributes(ws.id)):
            ws_dir = self._own_dir(ws)
            self._refuse_branches("a restore")
            snap = await asyncio.to_thread(self.branches.store.get, snapshot)
            if self._stop_programs is not None:
                await self._stop_programs(ws)
            await asyncio.to_thread(self.branches.restore, ws_dir, ws.id, snap)
            await asyncio.to_thread(self._laid_out, ws_dir, ws.id, ws.policy)

    def _refuse_branches(self, what: str) -> None:
        # a fork or a restored tree would not be on a filesystem of its own: it would escape the bound
        if self.disk_bytes is not None:
            raise CapabilityError(
                f"{what} of a disk-bounded workspace", self.backend, "use an engine without a disk bound for forks"
            )

    def _own_dir(self, ws: Workspace) -> Path:
        if ws.host_path is None or ws.host_path.parent != self.root:
            raise InvalidSpec(
                f"workspace {ws.id!r} is not one of this manager's (under {self.root}); "
                "snapshots and forks are of workspaces the engine created under its root"
            )
        return ws.host_path

    def _ensure_root(self) -> None:
        if not self._root_ready:
            private_dir(self.root, 0o700 if self._private_root else 0o711, keep_mode=self._keep_root_mode)
            self._root_ready = True

    async def cleanup(self, ws: Workspace) -> None:
        with self.tracer.span(WORKSPACE_CLEANUP, self._attributes(ws.id)):
            await self._cleanup(ws)
        if self.audit is not None:
            self.audit.record("workspace.cleanup", {"workspace": ws.id, "backend": self.backend})

    def _attributes(
        self, workspace: str | None, more: Mapping[str, AttributeValue] | None = None
    ) -> dict[str, AttributeValue]:
        found: dict[str, AttributeValue] = {"execspace.backend": self.backend, **(more or {})}
        if workspace is not None:
            found["execspace.workspace.id"] = workspace
        return found

    async def _cleanup(self, ws: Workspace) -> None:
        if self._known.get(ws.id) == ws:
            del self._known[ws.id]
        if self._stop_programs is not None:
            # a program still running could keep changing the tree while it is removed
            await self._stop_programs(ws)
        if ws.host_path is None:
            return
        await asyncio.to_thread(remove_workspace_tree, ws.host_path)
        if ws.host_path.parent == self.root:
            await asyncio.to_thread(self.branches.collect)  # the snapshots only this fork stood on


def remove_workspace_tree(path: Path) -> None:
    """Remove a workspace directory by fds (see :func:`.confine.remove_tree`); its parent is ours, not the
    program's, so that one is opened by path. A fork's overlay is unmounted and its own layers removed first, a
    disk-bounded workspace's filesystem detached (what is removed then is its empty mount point) and its image
    deleted."""
    remove_layers(path)
    remove_disk(path)
    try:
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        remove_tree(parent, path.name, str(path))
    finally:
        os.close(parent)
