"""A blocking facade over the async API, for code that has no event loop.

The objects behind it are the async ones: every call is sent to an event loop that
runs in a thread owned by the facade (started when it is entered, stopped when it
is closed), in the manner of anyio's ``BlockingPortal``. No loop is shared
between facades or kept at module level.

::

    import execspace.sync
    from execspace import PutFile, RunProgramSpec

    with execspace.sync.open_engine("local") as engine:
        ws = engine.manager.create_workspace("demo")
        engine.fs.put_files(ws, [PutFile("work/hi.py", "print('hi')")])
        print(engine.runner.run_program(ws, RunProgramSpec("python3", ["hi.py"])).stdout)

Calling the facade from inside its own loop thread (e.g. from a coroutine given to
:meth:`SyncEngine.call`) would deadlock, so it raises :class:`UsageError` instead.
"""

from __future__ import annotations

import asyncio
import builtins
import collections
import contextlib
import inspect
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, Unpack, overload

from .capabilities import Capabilities
from .engine import open_engine_from as _open_async_engine_from
from .errors import CapabilityError, UsageError
from .executor import CodeExecutor
from .executor import code_executor as _async_code_executor
from .models import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_FILES,
    DEFAULT_MAX_TOTAL_BYTES,
    BlockResult,
    CodeBlock,
    CodeExecutionInput,
    CodeExecutionResult,
    File,
    FileEntry,
    InputSpec,
    OutputChunk,
    OutputManifest,
    OutputSpec,
    ProgramInfo,
    PtySize,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Snapshot,
    Workspace,
    WorkspacePolicy,
)
from .protocols import (
    Engine,
    FileReader,
    Kernels,
    ProgramHandle,
    SupportsFileMetadata,
    SupportsFileStreams,
    SupportsFreezing,
    SupportsKernels,
    SupportsSnapshots,
)

if TYPE_CHECKING:
    from .backend import BackendOptions, HostOptions
    from .backends.container import ContainerOptions
    from .backends.e2b import E2BOptions
    from .backends.jupyter import JupyterOptions
    from .backends.local import LocalOptions
    from .backends.sandbox import SandboxOptions
    from .keywords import (
        ContainerKeywords,
        E2BKeywords,
        HostKeywords,
        JupyterKeywords,
        LocalKeywords,
        SandboxKeywords,
    )

__all__ = [
    "STREAM_BUFFER_BYTES",
    "SyncCodeExecutor",
    "SyncEngine",
    "SyncFileReader",
    "SyncKernels",
    "SyncProgramHandle",
    "SyncProgramRunner",
    "SyncWorkspaceFS",
    "SyncWorkspaceManager",
    "code_executor",
    "open_engine",
    "open_engine_from",
]

#: Unread output a started program may pile up for ``iter_output`` before chunks are dropped.
STREAM_BUFFER_BYTES = 16 * 1024 * 1024

P = ParamSpec("P")
T = TypeVar("T")


class _LoopThread:
    """An event loop running in a thread of its own; blocking calls are submitted to it."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._finish()

    def _finish(self) -> None:
        loop = self._loop
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        if tasks:
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_thread(self) -> None:
        if threading.get_ident() == self._thread.ident:
            raise UsageError(
                "a blocking execspace.sync call was made from inside its own event loop thread, "
                "where it would deadlock; use the async API (await …) there"
            )

    def call(self, func: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``func(*args, **kwargs)`` on the loop and block until it returns or raises."""
        self._check_thread()
        with self._lock:  # no submission may slip in after close() stopped the loop
            if self._closed:
                raise UsageError("this execspace.sync object is closed; open a new one")
            future = asyncio.run_coroutine_threadsafe(_invoke(func, *args, **kwargs), self._loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # e.g. KeyboardInterrupt in the waiting thread: stop the work too
            raise

    def close(self) -> None:
        """Stop the loop (cancelling what still runs on it) and join its thread. Idempotent."""
        self._check_thread()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()


async def _invoke(func: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
    # calling func here, not in the caller's thread, keeps every async object on its loop
    return await func(*args, **kwargs)


class _Proxy:
    """Blocking versions of one engine part's coroutine methods.

    The typed methods cover the protocol; other coroutine methods a backend adds
    (``disk_usage``…) are proxied by name.
    """

    def __init__(self, owner: SyncEngine) -> None:
        self._owner = owner

    def _part(self, engine: Engine) -> Any:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        method = getattr(self._part(self._owner.async_engine), name)
        if not inspect.iscoroutinefunction(method):
            raise AttributeError(f"{type(self).__name__} proxies coroutine methods only, and {name!r} is not one")
        portal = self._owner._portal

        def blocking(*args: Any, **kwargs: Any) -> Any:
            return portal.call(method, *args, **kwargs)

        return blocking


class SyncWorkspaceManager(_Proxy):
    """Blocking :class:`~execspace.protocols.WorkspaceManager`."""

    def _part(self, engine: Engine) -> Any:
        return engine.manager

    def create_workspace(
        self, exec_id: str, policy: WorkspacePolicy | None = None, *, path: Path | None = None
    ) -> Workspace:
        return self._owner.call(lambda e: e.manager.create_workspace(exec_id, policy, path=path))

    def get_workspace(self, exec_id: str) -> Workspace:
        return self._owner.call(lambda e: e.manager.get_workspace(exec_id))

    def cleanup(self, ws: Workspace) -> None:
        self._owner.call(lambda e: e.manager.cleanup(ws))

    # SupportsSnapshots: CapabilityError where the manager has none

    def snapshot(self, ws: Workspace, name: str | None = None) -> Snapshot:
        return self._owner.call(lambda e: _snapshots(e).snapshot(ws, name))

    def fork(
        self,
        source: Workspace | Snapshot | str,
        count: int = 1,
        ids: Sequence[str] | None = None,
        *,
        policy: WorkspacePolicy | None = None,
    ) -> list[Workspace]:
        return self._owner.call(lambda e: _snapshots(e).fork(source, count, ids, policy=policy))

    def restore(self, ws: Workspace, snapshot: Snapshot | str) -> None:
        self._owner.call(lambda e: _snapshots(e).restore(ws, snapshot))

    def list_snapshots(self) -> list[Snapshot]:
        return self._owner.call(lambda e: _snapshots(e).list_snapshots())

    def remove_snapshot(self, snapshot: Snapshot | str) -> None:
        self._owner.call(lambda e: _snapshots(e).remove_snapshot(snapshot))


def _snapshots(engine: Engine) -> SupportsSnapshots:
    if not isinstance(engine.manager, SupportsSnapshots):
        raise CapabilityError("snapshots and forks", engine.name, "Use the sandbox or local backend.")
    return engine.manager


def _file_streams(engine: Engine) -> SupportsFileStreams:
    if not isinstance(engine.fs, SupportsFileStreams):
        raise CapabilityError("file streams", engine.name, "Use read_file and put_files.")
    return engine.fs


def _file_metadata(engine: Engine) -> SupportsFileMetadata:
    if not isinstance(engine.fs, SupportsFileMetadata):
        raise CapabilityError("file metadata", engine.name, "Use the sandbox or local backend.")
    return engine.fs


def _freezing(engine: Engine) -> SupportsFreezing:
    if not isinstance(engine.runner, SupportsFreezing):
        raise CapabilityError("holding programs still", engine.name, "Use the sandbox or local backend.")
    return engine.runner


class SyncWorkspaceFS(_Proxy):
    """Blocking :class:`~execspace.protocols.WorkspaceFS`."""

    def _part(self, engine: Engine) -> Any:
        return engine.fs

    def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        self._owner.call(lambda e: e.fs.put_files(ws, files))

    def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None:
        self._owner.call(lambda e: e.fs.stage_directory(ws, src, dest, read_only=read_only))

    def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        return self._owner.call(lambda e: e.fs.read_file(ws, path, max_bytes=max_bytes))

    def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = DEFAULT_MAX_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    ) -> list[File]:
        return self._owner.call(
            lambda e: e.fs.collect(
                ws, patterns, max_files=max_files, max_file_bytes=max_file_bytes, max_total_bytes=max_total_bytes
            )
        )

    def list(self, ws: Workspace, patterns: Sequence[str]) -> builtins.list[FileEntry]:
        return self._owner.call(lambda e: e.fs.list(ws, patterns))

    def list_dir(self, ws: Workspace, path: str, *, depth: int = 1) -> builtins.list[FileEntry]:
        return self._owner.call(lambda e: e.fs.list_dir(ws, path, depth=depth))

    def stat(self, ws: Workspace, path: str) -> FileEntry:
        return self._owner.call(lambda e: e.fs.stat(ws, path))

    def exists(self, ws: Workspace, path: str) -> bool:
        return self._owner.call(lambda e: e.fs.exists(ws, path))

    def remove(self, ws: Workspace, path: str) -> None:
        self._owner.call(lambda e: e.fs.remove(ws, path))

    def make_dir(self, ws: Workspace, path: str) -> None:
        self._owner.call(lambda e: e.fs.make_dir(ws, path))

    def rename(self, ws: Workspace, src: str, dst: str) -> None:
        self._owner.call(lambda e: e.fs.rename(ws, src, dst))

    def stage_inputs(self, ws: Workspace, inputs: Sequence[InputSpec]) -> builtins.list[str]:
        return self._owner.call(lambda e: e.fs.stage_inputs(ws, inputs))

    def collect_outputs(self, ws: Workspace, spec: OutputSpec | None = None) -> OutputManifest:
        return self._owner.call(lambda e: e.fs.collect_outputs(ws, spec))

    # SupportsFileStreams: CapabilityError where the fs has none

    def open_reader(self, ws: Workspace, path: str) -> SyncFileReader:
        """Open the file at ``path`` for reading in chunks; a context manager that closes it."""
        return SyncFileReader(self._owner.call(lambda e: _file_streams(e).open_reader(ws, path)), self._owner)

    def write_stream(
        self, ws: Workspace, path: str, chunks: Iterable[bytes], *, max_bytes: int, mode: int = 0o644
    ) -> int:
        """Like the async ``write_stream``; ``chunks`` is iterated in a worker thread, so an iterable that blocks
        (a socket, a large file) does not hold up the facade's loop."""
        return self._owner.call(
            lambda e: _file_streams(e).write_stream(ws, path, _in_thread(chunks), max_bytes=max_bytes, mode=mode)
        )

    # SupportsFileMetadata: CapabilityError where the fs has none

    def read_metadata(self, ws: Workspace, paths: Sequence[str]) -> builtins.list[dict[str, str]]:
        return self._owner.call(lambda e: _file_metadata(e).read_metadata(ws, paths))

    def write_metadata(self, ws: Workspace, path: str, metadata: Mapping[str, str]) -> bool:
        return self._owner.call(lambda e: _file_metadata(e).write_metadata(ws, path, metadata))


async def _in_thread(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    iterator = iter(chunks)
    while (chunk := await asyncio.to_thread(next, iterator, None)) is not None:
        yield chunk


class SyncFileReader:
    """Blocking :class:`~execspace.protocols.FileReader`; a context manager that closes the file."""

    def __init__(self, reader: FileReader, owner: SyncEngine) -> None:
        self._reader = reader
        self._owner = owner

    @property
    def size(self) -> int:
        return self._reader.size

    def chunks(self) -> Iterator[bytes]:
        """The content in bounded chunks, read as they are asked for; call it once."""
        stream = self._reader.chunks()
        while (chunk := self._owner._portal.call(_next_or_none, stream)) is not None:
            yield chunk

    def close(self) -> None:
        """Close the file, read or not. Idempotent."""
        if not self._owner.closed:
            self._owner._portal.call(self._reader.aclose)

    def __enter__(self) -> SyncFileReader:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


async def _next_or_none(stream: AsyncIterator[T]) -> T | None:
    return await anext(stream, None)


class SyncProgramRunner(_Proxy):
    """Blocking :class:`~execspace.protocols.ProgramRunner`."""

    def _part(self, engine: Engine) -> Any:
        return engine.runner

    def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        return self._owner.call(lambda e: e.runner.run_program(ws, spec))

    def start_program(
        self, ws: Workspace, spec: RunProgramSpec, *, buffer_bytes: int | None = STREAM_BUFFER_BYTES
    ) -> SyncProgramHandle:
        """Start a program; its output is gathered from the start for :meth:`SyncProgramHandle.iter_output`,
        keeping up to ``buffer_bytes`` unread (``None``: no cap)."""

        async def start(e: Engine) -> tuple[ProgramHandle, _OutputPump]:
            handle = await e.runner.start_program(ws, spec)
            return handle, _OutputPump(handle.stream(), buffer_bytes)

        return self._adopt(*self._owner.call(start))

    def get_program(
        self, ws: Workspace, key: int | str, *, buffer_bytes: int | None = STREAM_BUFFER_BYTES
    ) -> SyncProgramHandle:
        """Another handle to a running program of ``ws``, by pid or tag (``ProgramNotFound`` if none); its
        :meth:`SyncProgramHandle.iter_output` reads an attached reader from the program's start."""

        async def find(e: Engine) -> tuple[ProgramHandle, _OutputPump]:
            handle = await e.runner.get_program(ws, key)
            return handle, _OutputPump(handle.attach(from_start=True), buffer_bytes)

        return self._adopt(*self._owner.call(find))

    def _adopt(self, handle: ProgramHandle, pump: _OutputPump) -> SyncProgramHandle:
        sync_handle = SyncProgramHandle(handle, pump, self._owner)
        self._owner._handles.add(sync_handle)
        return sync_handle

    def list_programs(self, ws: Workspace) -> builtins.list[ProgramInfo]:
        return self._owner.call(lambda e: e.runner.list_programs(ws))

    def signal_program(self, ws: Workspace, key: int | str, sig: int) -> None:
        """Send ``sig`` to a running program of ``ws`` by pid or tag (``ProgramNotFound`` if none)."""

        async def send(e: Engine) -> None:
            await (await e.runner.get_program(ws, key)).signal(sig)

        self._owner.call(send)

    @contextlib.contextmanager
    def frozen(self, ws: Workspace) -> Iterator[None]:
        """The workspace's programs held still for the block (:class:`~execspace.protocols.SupportsFreezing`;
        ``CapabilityError`` where the runner cannot)."""

        async def enter(e: Engine) -> contextlib.AbstractAsyncContextManager[None]:
            hold = _freezing(e).frozen(ws)
            await hold.__aenter__()
            return hold

        hold = self._owner.call(enter)
        try:
            yield
        except BaseException as error:
            if not self._owner._portal.call(hold.__aexit__, type(error), error, error.__traceback__):
                raise
        else:
            self._owner._portal.call(hold.__aexit__, None, None, None)


class _OutputPump:
    """Reads a handle's output stream from the moment it starts, without ever blocking the program.

    Chunks wait here for the blocking reader. Past ``budget`` unread bytes new
    chunks are dropped (and counted); the final :class:`RunResult` still has the
    output, capped as usual.
    """

    def __init__(self, output: AsyncIterator[OutputChunk], budget: int | None) -> None:
        self._chunks: collections.deque[OutputChunk] = collections.deque()
        self._budget = budget
        self._buffered = 0
        self.dropped_bytes = 0
        self._changed = asyncio.Event()
        self._done = False
        self._error: BaseException | None = None
        # created in the same step as the start, so it subscribes before the next pipe read
        self._task = asyncio.create_task(self._drain(output))

    async def _drain(self, output: AsyncIterator[OutputChunk]) -> None:
        try:
            async for chunk in output:
                size = len(chunk.data)
                if self._budget is not None and self._buffered + size > self._budget:
                    self.dropped_bytes += size
                    continue
                self._chunks.append(chunk)
                self._buffered += size
                self._changed.set()
        except Exception as error:  # e.g. an attached reader cut off: the blocking reader gets it after the rest
            self._error = error
        finally:
            self._done = True
            self._changed.set()

    async def next(self) -> OutputChunk | None:
        """The next chunk, or None when the program's output has ended."""
        while not self._chunks:
            if self._done:
                if self._error is not None:
                    error, self._error = self._error, None
                    raise error
                return None
            self._changed.clear()
            await self._changed.wait()
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk.data)
        return chunk

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class SyncProgramHandle:
    """Blocking :class:`~execspace.protocols.ProgramHandle`; a context manager that kills and
    reaps the program on exit. Output is gathered from the start, so :meth:`iter_output`
    sees it all even when called late."""

    def __init__(self, handle: ProgramHandle, pump: _OutputPump, owner: SyncEngine) -> None:
        self._handle = handle
        self._pump = pump
        self._owner = owner
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._handle.pid

    @property
    def info(self) -> ProgramInfo:
        return self._handle.info

    @property
    def dropped_bytes(self) -> int:
        """Output bytes not kept for :meth:`iter_output` because too much was left unread."""
        return self._pump.dropped_bytes

    def iter_output(self) -> Iterator[OutputChunk]:
        """Yield output chunks as they come, until the program's output ends."""
        while (chunk := self._owner._portal.call(self._pump.next)) is not None:
            yield chunk

    def attach(self, *, from_start: bool = True) -> Iterator[OutputChunk]:
        """Another reader of the output (:meth:`~execspace.protocols.ProgramHandle.attach`), registered by this
        call; it never slows the program, and raises ``BackendError`` once it fell too far behind."""

        async def register() -> AsyncIterator[OutputChunk]:
            return self._handle.attach(from_start=from_start)

        return self._iterate(self._owner._portal.call(register))

    def _iterate(self, stream: AsyncIterator[OutputChunk]) -> Iterator[OutputChunk]:
        while (chunk := self._owner._portal.call(_next_or_none, stream)) is not None:
            yield chunk

    def write_stdin(self, data: bytes | str) -> None:
        self._owner._portal.call(self._handle.write_stdin, data)

    def close_stdin(self) -> None:
        self._owner._portal.call(self._handle.close_stdin)

    def signal(self, sig: int) -> None:
        self._owner._portal.call(self._handle.signal, sig)

    def resize(self, size: PtySize) -> None:
        self._owner._portal.call(self._handle.resize, size)

    def kill(self) -> None:
        self._owner._portal.call(self._handle.kill)

    def wait(self) -> RunResult:
        result = self._owner._portal.call(self._handle.wait)
        self._owner._handles.discard(self)  # finished: the engine need not reap it, nor keep it alive
        return result

    def close(self) -> None:
        """Kill the program if it still runs and reap it. Idempotent."""
        if self._closed or self._owner.closed:  # closing the engine reaped it already
            return
        self._closed = True
        self._owner._handles.discard(self)
        self._owner._portal.call(self._aclose)

    async def _aclose(self) -> None:
        try:
            await self._handle.__aexit__(None, None, None)
        finally:
            await self._pump.aclose()

    def __enter__(self) -> SyncProgramHandle:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class SyncEngine:
    """Blocking view of one Engine, with ``manager``, ``fs`` and ``runner`` proxies.

    Closing it kills programs started through it that still run, closes the
    engine and stops the loop thread.
    """

    manager: SyncWorkspaceManager
    fs: SyncWorkspaceFS
    runner: SyncProgramRunner

    def __init__(self, engine: Engine, portal: _LoopThread, stack: contextlib.AsyncExitStack) -> None:
        self._engine = engine
        self._portal = portal
        self._stack = stack
        self._handles: set[SyncProgramHandle] = set()
        self.manager = SyncWorkspaceManager(self)
        self.fs = SyncWorkspaceFS(self)
        self.runner = SyncProgramRunner(self)

    @property
    def name(self) -> str:
        return self._engine.name

    @property
    def async_engine(self) -> Engine:
        """The async engine behind this facade. Use it only from coroutines run by :meth:`call`."""
        return self._engine

    @property
    def closed(self) -> bool:
        return self._portal.closed

    def describe(self) -> Capabilities:
        return self._engine.describe()

    @property
    def kernels(self) -> SyncKernels:
        """Blocking :class:`~execspace.protocols.Kernels` (``CapabilityError`` where the engine has none)."""
        if not isinstance(self._engine, SupportsKernels):
            raise CapabilityError("stateful kernels", self.name, "Use the jupyter backend.")
        return SyncKernels(self._engine.kernels, self._portal)

    def call(self, func: Callable[[Engine], Awaitable[T]]) -> T:
        """Run ``await func(engine)`` on this facade's loop and return its result."""
        return self._portal.call(func, self._engine)

    def code_executor(self, **options: Any) -> SyncCodeExecutor:
        """A blocking code executor over this engine (``options`` as for :class:`CodeExecutor`)."""
        return SyncCodeExecutor(CodeExecutor(self._engine, **options), self._portal, owns_portal=False)

    def close(self) -> None:
        """Kill leftover programs, close the engine, stop the loop thread. Idempotent."""
        if self._portal.closed:
            return
        try:
            self._portal.call(self._shutdown)
        finally:
            self._portal.close()

    async def _shutdown(self) -> None:
        handles, self._handles = list(self._handles), set()
        try:
            for handle in handles:
                handle._closed = True
                await handle._aclose()
        finally:
            await self._stack.aclose()

    def __enter__(self) -> SyncEngine:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<SyncEngine {self._engine!r}{' closed' if self.closed else ''}>"


# The overloads of execspace.open_engine (engine.py says why there is no keyword-taking str overload).
@overload
def open_engine(
    backend: Literal["sandbox"],
    *,
    options: SandboxOptions | HostOptions | None = None,
    **keywords: Unpack[SandboxKeywords],
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(
    backend: Literal["local"], *, options: LocalOptions | HostOptions | None = None, **keywords: Unpack[LocalKeywords]
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(
    backend: Literal["container"],
    *,
    options: ContainerOptions | HostOptions | None = None,
    **keywords: Unpack[ContainerKeywords],
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(
    backend: Literal["jupyter"],
    *,
    options: JupyterOptions | HostOptions | None = None,
    **keywords: Unpack[JupyterKeywords],
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(
    backend: Literal["e2b"], *, options: E2BOptions | None = None, **keywords: Unpack[E2BKeywords]
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(
    backend: Literal["auto"] | None = None, *, options: HostOptions | None = None, **keywords: Unpack[HostKeywords]
) -> AbstractContextManager[SyncEngine]: ...
@overload
def open_engine(backend: str, *, options: BackendOptions | None = None) -> AbstractContextManager[SyncEngine]: ...
def open_engine(
    backend: str | None = None, *, options: BackendOptions | None = None, **keywords: object
) -> AbstractContextManager[SyncEngine]:
    """Blocking :func:`execspace.open_engine`: same arguments, yields a :class:`SyncEngine`.

    The loop thread starts on entering the ``with`` block and stops on leaving it,
    after the engine is closed.
    """
    return open_engine_from(backend, keywords, options)


@contextlib.contextmanager
def open_engine_from(
    backend: str | None, keywords: Mapping[str, object], options: BackendOptions | None = None
) -> Iterator[SyncEngine]:
    """Blocking :func:`execspace.engine.open_engine_from`: keywords known only at run time."""
    portal = _LoopThread(f"execspace-sync-{backend or 'default'}")
    stack = contextlib.AsyncExitStack()
    try:
        engine = portal.call(stack.enter_async_context, _open_async_engine_from(backend, keywords, options))
    except BaseException:
        portal.close()
        raise
    with SyncEngine(engine, portal, stack) as sync_engine:
        yield sync_engine


class SyncKernels:
    """Blocking :class:`~execspace.protocols.Kernels` (``SyncEngine.kernels``)."""

    def __init__(self, kernels: Kernels, portal: _LoopThread) -> None:
        self._kernels = kernels
        self._portal = portal

    def handles(self, tag: str) -> bool:
        return self._kernels.handles(tag)

    def run_block(
        self, ws: Workspace, block: CodeBlock, index: int, *, timeout: float | None, limits: ResourceLimits
    ) -> tuple[BlockResult, str]:
        return self._portal.call(self._kernels.run_block, ws, block, index, timeout=timeout, limits=limits)


class SyncCodeExecutor:
    """Blocking :class:`~execspace.executor.CodeExecutor`; a context manager."""

    def __init__(self, executor: CodeExecutor, portal: _LoopThread, *, owns_portal: bool) -> None:
        self._executor = executor
        self._portal = portal
        self._owns_portal = owns_portal
        self._closed = False

    def execute_code(self, input: CodeExecutionInput) -> CodeExecutionResult:
        if self._closed:
            raise UsageError("this code executor is closed; create a new one")
        return self._portal.call(self._executor.execute_code, input)

    def close(self) -> None:
        """Close the executor (and its engine and loop thread when it owns them). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._portal.closed:
                self._portal.call(self._executor.close)
        finally:
            if self._owns_portal:
                self._portal.close()

    def __enter__(self) -> SyncCodeExecutor:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def code_executor(backend: str | None = None, **options: Any) -> SyncCodeExecutor:
    """Blocking :func:`execspace.code_executor`: same arguments. Its loop thread starts now
    and stops on :meth:`SyncCodeExecutor.close` (or leaving the ``with`` block)."""
    executor = _async_code_executor(backend, **options)
    return SyncCodeExecutor(executor, _LoopThread(f"execspace-sync-executor-{backend or 'default'}"), owns_portal=True)
