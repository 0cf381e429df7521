"""The Engine facade and ``open_engine``: the front door to every backend."""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Generic, Literal, TypeVar, Unpack, overload

from .capabilities import Capabilities
from .errors import UsageError
from .protocols import Kernels, ProgramRunner, WorkspaceFS, WorkspaceManager
from .tracing import from_environment

if TYPE_CHECKING:
    from .backend import BackendOptions, HostOptions
    from .backends.container import ContainerEngine, ContainerOptions
    from .backends.e2b import E2BOptions
    from .backends.jupyter import JupyterOptions, KernelSessions
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

__all__ = ["BaseEngine", "KernelEngine", "open_engine", "open_engine_from"]

K = TypeVar("K", bound=Kernels)


class _State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


class BaseEngine:
    """A backend assembled from its three parts and its capability statement.

    Backends build one of these; callers use it through the ``Engine`` protocol.
    Use after :meth:`aclose` raises :class:`UsageError`.
    """

    def __init__(
        self,
        name: str,
        manager: WorkspaceManager,
        fs: WorkspaceFS,
        runner: ProgramRunner,
        capabilities: Capabilities,
        *,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._name = name
        self._manager = manager
        self._fs = fs
        self._runner = runner
        self._caps = capabilities
        self._on_close = on_close
        self._state = _State.OPEN

    def _check_open(self) -> None:
        if self._state is _State.CLOSED:
            raise UsageError(f"engine {self._name!r} is closed; open a new one with open_engine()")

    @property
    def name(self) -> str:
        return self._name

    @property
    def manager(self) -> WorkspaceManager:
        self._check_open()
        return self._manager

    @property
    def fs(self) -> WorkspaceFS:
        self._check_open()
        return self._fs

    @property
    def runner(self) -> ProgramRunner:
        self._check_open()
        return self._runner

    def describe(self) -> Capabilities:
        return self._caps

    async def aclose(self) -> None:
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        if self._on_close is not None:
            await self._on_close()

    async def __aenter__(self) -> BaseEngine:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<Engine {self._name} {self._caps.isolation} {self._state.value}>"


class KernelEngine(BaseEngine, Generic[K]):
    """An engine whose workspaces also have stateful kernels (:class:`~execspace.protocols.SupportsKernels`);
    ``describe().kernels`` says what they offer."""

    def __init__(
        self,
        name: str,
        manager: WorkspaceManager,
        fs: WorkspaceFS,
        runner: ProgramRunner,
        capabilities: Capabilities,
        kernels: K,
        *,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(name, manager, fs, runner, capabilities, on_close=on_close)
        self._kernels = kernels

    @property
    def kernels(self) -> K:
        # no open check: isinstance(engine, SupportsKernels) reads this on Python 3.11, and the kernels
        # themselves refuse work once the engine has closed them
        return self._kernels


# One overload per built-in backend: its options as typed keywords (keywords.py), so that a misspelled option or
# a value of the wrong type is a type error naming it. ``options=`` may also be a base of the backend's own class
# (``HostOptions``). A backend registered by entry point takes its options as ``options=``: a ``str`` overload that
# took any keyword would also match a built-in's name and hide every mistake the ones above catch.
@overload
def open_engine(
    backend: Literal["sandbox"],
    *,
    options: SandboxOptions | HostOptions | None = None,
    **keywords: Unpack[SandboxKeywords],
) -> AbstractAsyncContextManager[BaseEngine]: ...
@overload
def open_engine(
    backend: Literal["local"], *, options: LocalOptions | HostOptions | None = None, **keywords: Unpack[LocalKeywords]
) -> AbstractAsyncContextManager[BaseEngine]: ...
@overload
def open_engine(
    backend: Literal["container"],
    *,
    options: ContainerOptions | HostOptions | None = None,
    **keywords: Unpack[ContainerKeywords],
) -> AbstractAsyncContextManager[ContainerEngine]: ...
@overload
def open_engine(
    backend: Literal["jupyter"],
    *,
    options: JupyterOptions | HostOptions | None = None,
    **keywords: Unpack[JupyterKeywords],
) -> AbstractAsyncContextManager[KernelEngine[KernelSessions]]: ...
@overload
def open_engine(
    backend: Literal["e2b"], *, options: E2BOptions | None = None, **keywords: Unpack[E2BKeywords]
) -> AbstractAsyncContextManager[KernelEngine[Kernels]]: ...
@overload
def open_engine(
    backend: Literal["auto"] | None = None, *, options: HostOptions | None = None, **keywords: Unpack[HostKeywords]
) -> AbstractAsyncContextManager[BaseEngine]: ...
@overload
def open_engine(backend: str, *, options: BackendOptions | None = None) -> AbstractAsyncContextManager[BaseEngine]: ...
def open_engine(
    backend: str | None = None, *, options: BackendOptions | None = None, **keywords: object
) -> AbstractAsyncContextManager[BaseEngine]:
    """Open a backend's Engine for the duration of the ``async with`` block.

    ``backend=None`` picks the safest backend that works on this host; it never
    picks ``local`` (no isolation), which must be asked for by name. Options are
    the backend's own typed options (``LocalOptions``, ``SandboxOptions``,
    ``ContainerOptions``, ``JupyterOptions``…), given as ``options=`` or as
    keywords (over ``options=`` when both are), e.g. ``workspace_root``,
    ``env_policy``, ``host_roots``, ``artifacts``. A type checker checks the
    keywords of a built-in backend against its options (``SandboxKeywords``…
    in :mod:`execspace.keywords`).

    Raises:
        UnsupportedBackend: unknown name.
        InvalidSpec: an option the backend does not take, of the wrong type, or one it needs is missing.
        SetupFailed: the backend cannot work here (the message says how to fix it).
    """
    return open_engine_from(backend, keywords, options)


@contextlib.asynccontextmanager
async def open_engine_from(
    backend: str | None, keywords: Mapping[str, object], options: BackendOptions | None = None
) -> AsyncIterator[BaseEngine]:
    """:func:`open_engine` for options known only at run time (a config file's table, a test kit's parameters):
    ``keywords`` are checked when the backend opens (``InvalidSpec`` naming a wrong one), not by a type checker.

    With no ``tracer`` given, the ``OTEL_*`` variables may ask for one (:func:`execspace.tracing.from_environment`):
    the engine is then traced by a tracer of its own, whose spans are exported when it closes."""
    from .registry import open_backend

    own = None  # the tracer the OTEL_* variables ask for, when the caller gave none: this engine's to close
    if keywords.get("tracer") is None and (options is None or options.tracer is None):
        own = from_environment("execspace")
        if own is not None:
            keywords = {**keywords, "tracer": own}
    try:
        engine = await open_backend(backend, options, keywords)
        try:
            yield engine
        finally:
            await engine.aclose()
    finally:
        if own is not None:
            await asyncio.to_thread(own.close)  # its last spans exported before the engine's owner goes on
