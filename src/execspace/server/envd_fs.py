"""envd's ``filesystem.Filesystem`` Connect service over the Engine's file API.

An entry is described as envd describes it: a directory's size is its own (what ``stat`` says), and a symbolic link
is reported by what it points to (its ``type`` and ``mode`` are the target's, ``symlink_target`` the target's
resolved path) with ``is_symlink`` set, so the SDK says ``SYMLINK`` where it reads that flag (2.5x on) and the
target's type where it does not (as envd's older SDKs expect). A link this file API cannot follow (to a path outside
what it serves, or through another link in a directory of the path) keeps ``SYMLINK`` as its type and its target
as written, made absolute. ``Remove`` of a path where nothing is succeeds, as envd's (``os.RemoveAll``) does.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import secrets
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof
from protobuf.wkt.google.protobuf.timestamp_pb import Timestamp

from ..errors import ExecspaceError
from ..models import FileEntry, FileKind
from ..protocols import SupportsFileMetadata
from .envd.filesystem import filesystem_pb as pb
from .envd.filesystem.filesystem_connect import Filesystem
from .events import FileChanged
from .paths import USER, to_sdk
from .rpc import ServiceBase, rpc_errors
from .sandboxes import Sandbox
from .streams import deadline_of, until_closed
from .watch import Change, DirectoryWatch
from .wholeview import SandboxView, outside_home

__all__ = ["FilesystemService", "described", "entry_info", "permissions"]

#: The deepest listing ``ListDir`` gives (the SDK's ``depth``, a uint32): deeper levels are left out, as below any
#: depth asked for. A listing is one walk that descends no further than the depth.
MAX_LIST_DEPTH = 64
#: A watched directory is polled at most this share of the time: a walk that takes longer stretches the interval.
_WATCH_DUTY = 0.1
#: Links followed to find what a symbolic link points to (the kernel's own limit for a path is 40).
_MAX_LINKS = 40

_TYPES = {FileKind.FILE: pb.FileType.FILE, FileKind.DIR: pb.FileType.DIRECTORY, FileKind.SYMLINK: pb.FileType.SYMLINK}
_EVENTS = {
    "create": pb.EventType.CREATE,
    "write": pb.EventType.WRITE,
    "remove": pb.EventType.REMOVE,
    "chmod": pb.EventType.CHMOD,
}


def entry_info(
    entry: FileEntry, target: tuple[str, FileEntry | None] | None = None, metadata: dict[str, str] | None = None
) -> pb.EntryInfo:
    """envd's view of an entry: everything in the home belongs to ``user``. A symbolic link's ``target`` is its
    resolved path and what is there (None: it could not be followed), see :func:`link_target`; ``metadata`` is the
    entry's (a link's: its target's, as envd reads it through the link)."""
    path = to_sdk(entry.path)
    kind, mode = entry.kind, entry.mode or 0
    info = pb.EntryInfo(
        name=posixpath.basename(path),
        path=path,
        size=entry.size,
        permissions=permissions(kind, mode),
        owner=USER,
        group=USER,
        modified_time=Timestamp.from_nanos(int(entry.mtime * 1e9)),
        is_symlink=kind is FileKind.SYMLINK,
        metadata=metadata or {},
    )
    if kind is FileKind.SYMLINK and target is not None:
        info.symlink_target, pointed = target
        if pointed is not None:
            kind, mode = pointed.kind, pointed.mode or 0
    info.type, info.mode = _TYPES.get(kind, pb.FileType.UNSPECIFIED), mode
    return info


async def link_target(sandbox: Sandbox, link: FileEntry) -> tuple[str, FileEntry | None]:
    """Where the symbolic link ``link`` leads, as an SDK path, and the entry there; the entry is None where the
    file API cannot follow it (then the path is the link's own target, made absolute)."""
    view = SandboxView(sandbox)
    here, written = to_sdk(link.path), link.link_target
    if written is None:
        written = (await view.stat(link.path)).link_target or ""
    first = posixpath.normpath(posixpath.join(posixpath.dirname(here), written))
    at = first
    for _ in range(_MAX_LINKS):
        try:
            found = await view.stat(view.path(at))
        except (OSError, ExecspaceError):
            return first, None
        if found.kind is not FileKind.SYMLINK:
            return at, found
        at = posixpath.normpath(posixpath.join(posixpath.dirname(at), found.link_target or ""))
    return first, None


def permissions(kind: FileKind, mode: int) -> str:
    """A mode as envd (Go's ``FileMode.String``) writes it: its type and special-bit letters, then ``rwx`` thrice
    (``-rw-r--r--``, ``drwxr-xr-x``, ``Lrwxrwxrwx``, ``urwxr-xr-x`` for a setuid file)."""
    kinds = {FileKind.DIR: "d", FileKind.SYMLINK: "L", FileKind.OTHER: "?"}.get(kind, "")
    special = "".join(c for bit, c in ((0o4000, "u"), (0o2000, "g"), (0o1000, "t")) if mode & bit)
    rwx = "".join(c if mode & (1 << (8 - i)) else "-" for i, c in enumerate("rwxrwxrwx"))
    return (kinds + special or "-") + rwx


class FilesystemService(ServiceBase, Filesystem):
    async def stat(self, request: pb.StatRequest, ctx: RequestContext[Any, Any], /) -> pb.StatResponse:
        sandbox = self.sandbox(ctx)
        return pb.StatResponse(entry=await self._stat(sandbox, request.path))

    async def _stat(self, sandbox: Sandbox, path: str) -> pb.EntryInfo:
        with rpc_errors(path):
            view = SandboxView(sandbox)
            async with sandbox.share.file_op():
                entry = await view.stat(view.path(path))
                return (await described(sandbox, [entry]))[0]

    async def list_dir(self, request: pb.ListDirRequest, ctx: RequestContext[Any, Any], /) -> pb.ListDirResponse:
        sandbox = self.sandbox(ctx)
        directory = await self._directory(sandbox, request.path)
        depth = min(max(request.depth, 1), MAX_LIST_DEPTH)
        with rpc_errors(request.path):
            async with sandbox.share.file_op():
                entries = await SandboxView(sandbox).list_dir(directory, depth=depth)
                infos = await described(sandbox, [e for e in entries if e.path != directory])
        return pb.ListDirResponse(entries=infos)

    async def _directory(self, sandbox: Sandbox, path: str) -> str:
        """The workspace path of ``path``, which must be a directory."""
        with rpc_errors(path):
            view = SandboxView(sandbox)
            directory = view.path(path)
            async with sandbox.share.file_op():
                entry = await view.stat(directory)
        if entry.kind is not FileKind.DIR:
            raise ConnectError(Code.INVALID_ARGUMENT, f"path {path!r} is not a directory")
        return directory

    async def make_dir(self, request: pb.MakeDirRequest, ctx: RequestContext[Any, Any], /) -> pb.MakeDirResponse:
        sandbox = self.sandbox(ctx)
        view = SandboxView(sandbox)
        with rpc_errors(request.path):
            path = view.path(request.path)
            async with sandbox.share.file_op():
                if await view.exists(path):
                    raise ConnectError(Code.ALREADY_EXISTS, f"{request.path!r} already exists")
                await view.make_dir(path)
        return pb.MakeDirResponse(entry=await self._stat(sandbox, request.path))

    async def move(self, request: pb.MoveRequest, ctx: RequestContext[Any, Any], /) -> pb.MoveResponse:
        sandbox = self.sandbox(ctx)
        view = SandboxView(sandbox)
        with rpc_errors(request.source):
            async with sandbox.share.file_op():
                source, destination = view.path(request.source), view.path(request.destination)
                await view.rename(source, destination)
        if self.sandboxes.events.listening:
            moved = FileChanged("rename", sandbox.id, sandbox.owner, to_sdk(source), to=to_sdk(destination))
            self.sandboxes.events(moved)
        return pb.MoveResponse(entry=await self._stat(sandbox, request.destination))

    async def remove(self, request: pb.RemoveRequest, ctx: RequestContext[Any, Any], /) -> pb.RemoveResponse:
        sandbox = self.sandbox(ctx)
        with rpc_errors(request.path), contextlib.suppress(FileNotFoundError):
            view = SandboxView(sandbox)
            async with sandbox.share.file_op():
                path = view.path(request.path)
                await view.remove(path)
            if self.sandboxes.events.listening:
                self.sandboxes.events(FileChanged("remove", sandbox.id, sandbox.owner, to_sdk(path)))
        return pb.RemoveResponse()

    # watching: the sync SDK polls a watcher, the async one streams

    async def _watch(self, sandbox: Sandbox, path: str, recursive: bool) -> DirectoryWatch:
        """A watch of the directory ``path``, among the sandbox's live ones (the caller discards it)."""
        directory = await self._directory(sandbox, path)
        if outside_home(directory):
            raise ConnectError(
                Code.INVALID_ARGUMENT,
                f"watching {path!r}: this server watches directories under /home/user only; watch one there",
            )
        watch = DirectoryWatch(sandbox.engine.fs, sandbox.workspace, directory, recursive=recursive)
        sandbox.watches.add(watch)  # before its first look: an upload that ends meanwhile is told to it
        try:
            with rpc_errors(path):
                async with sandbox.share.file_op():
                    await watch.start()
        except BaseException:
            sandbox.watches.discard(watch)
            raise
        return watch

    async def create_watcher(
        self, request: pb.CreateWatcherRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.CreateWatcherResponse:
        sandbox = self.sandbox(ctx)
        with rpc_errors():
            sandbox.share.watchers.take()
        try:
            watch = await self._watch(sandbox, request.path, request.recursive)
        except BaseException:
            sandbox.share.watchers.give_back()
            raise
        watcher_id = secrets.token_hex(8)
        sandbox.watchers[watcher_id] = (watch, request.include_entry)
        return pb.CreateWatcherResponse(watcher_id=watcher_id)

    async def get_watcher_events(
        self, request: pb.GetWatcherEventsRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.GetWatcherEventsResponse:
        sandbox = self.sandbox(ctx)
        found = sandbox.watchers.get(request.watcher_id)
        if found is None:
            raise ConnectError(Code.NOT_FOUND, f"no watcher {request.watcher_id!r} in this sandbox")
        watch, include_entry = found
        with rpc_errors():
            async with sandbox.share.file_op():
                changes = await watch.changes()
                events = await _events(sandbox, changes, include_entry)
        return pb.GetWatcherEventsResponse(events=events)

    async def remove_watcher(
        self, request: pb.RemoveWatcherRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.RemoveWatcherResponse:
        sandbox = self.sandbox(ctx)
        found = sandbox.watchers.pop(request.watcher_id, None)
        if found is None:
            raise ConnectError(Code.NOT_FOUND, f"no watcher {request.watcher_id!r} in this sandbox")
        sandbox.watches.discard(found[0])
        sandbox.share.watchers.give_back()
        return pb.RemoveWatcherResponse()

    async def watch_dir(
        self, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.WatchDirResponse]:
        sandbox = self.sandbox(ctx)
        share = sandbox.share
        with rpc_errors():
            share.watchers.take()
        try:
            with rpc_errors():
                share.streams.take()
            try:
                async for response in self._watching(sandbox, request, ctx):
                    yield response
            finally:
                share.streams.give_back()
        finally:
            share.watchers.give_back()

    async def _watching(
        self, sandbox: Sandbox, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        watch = await self._watch(sandbox, request.path, request.recursive)
        try:
            async for response in self._streamed(sandbox, watch, request, ctx):
                yield response
        finally:
            sandbox.watches.discard(watch)

    async def _streamed(
        self, sandbox: Sandbox, watch: DirectoryWatch, request: pb.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.WatchDirResponse]:
        start: Oneof[Literal["start"], pb.WatchDirResponse.StartEvent] = Oneof(
            "start", pb.WatchDirResponse.StartEvent()
        )
        yield pb.WatchDirResponse(event=start)
        options = self.sandboxes.options
        alive: Oneof[Literal["keepalive"], pb.WatchDirResponse.KeepAlive] = Oneof(
            "keepalive", pb.WatchDirResponse.KeepAlive()
        )
        keepalive = pb.WatchDirResponse(event=alive)
        loop = asyncio.get_running_loop()
        said = loop.time()  # when the client last heard from the stream
        async for _ in until_closed(sandbox.closed, deadline_of(ctx), options.watch_interval):
            began = loop.time()
            with rpc_errors():
                async with sandbox.share.file_op():
                    changes = await watch.changes()
                    events = await _events(sandbox, changes, request.include_entry)
            for one in events:
                event: Oneof[Literal["filesystem"], pb.FilesystemEvent] = Oneof("filesystem", one)
                yield pb.WatchDirResponse(event=event)
                said = loop.time()
            # a directory that takes long to walk is walked less often: the watch's share of the time stays small
            await _pause(sandbox, (loop.time() - began) / _WATCH_DUTY - options.watch_interval)
            if loop.time() - said >= options.keepalive_interval:
                said = loop.time()
                yield keepalive


async def described(sandbox: Sandbox, entries: list[FileEntry]) -> list[pb.EntryInfo]:
    """:func:`entry_info` of each entry, a symbolic link followed, with its metadata where the file system keeps
    it (a link's is its target's)."""
    targets = [await link_target(sandbox, e) if e.kind is FileKind.SYMLINK else None for e in entries]
    if not isinstance(sandbox.engine.fs, SupportsFileMetadata):
        return [entry_info(e, t) for e, t in zip(entries, targets, strict=True)]
    paths = [e.path if t is None else _metadata_path(e, t) for e, t in zip(entries, targets, strict=True)]
    metadata = await SandboxView(sandbox).read_metadata(paths)
    return [entry_info(e, t, m) for e, t, m in zip(entries, targets, metadata, strict=True)]


def _metadata_path(link: FileEntry, target: tuple[str, FileEntry | None]) -> str:
    """Where a link's metadata is read: its target's path, or its own (none) where it cannot be followed."""
    return link.path if target[1] is None else target[1].path


async def _pause(sandbox: Sandbox, seconds: float) -> None:
    """Wait ``seconds`` (if positive), or until the sandbox ends."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sandbox.closed.wait(), seconds)


async def _events(sandbox: Sandbox, changes: list[Change], include_entry: bool) -> list[pb.FilesystemEvent]:
    """envd's events of the changes; with ``include_entry``, each that has an entry carries it (a removal none)."""
    entries = [c.entry for c in changes if c.entry is not None] if include_entry else []
    infos = iter(await described(sandbox, entries) if entries else [])
    return [
        pb.FilesystemEvent(
            name=c.name,
            type=_EVENTS[c.kind],
            entry=next(infos) if include_entry and c.entry is not None else None,
        )
        for c in changes
    ]
