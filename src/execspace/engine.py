"""The Engine facade and ``open_engine``: the front door to every backend."""

from __future__ import annotations

import contextlib
import enum
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic, TypeVar

from .capabilities import Capabilities
from .errors import UsageError
from .protocols import Kernels, ProgramRunner, WorkspaceFS, WorkspaceManager

if TYPE_CHECKING:
    from .backend import BackendOptions

__all__ = ["BaseEngine", "KernelEngine", "open_engine"]

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


@contextlib.asynccontextmanager
async def open_engine(
    backend: str | None = None, *, options: BackendOptions | None = None, **keywords: object
) -> AsyncIterator[BaseEngine]:
    """Open a backend's Engine for the duration of the ``async with`` block.

    ``backend=None`` picks the safest backend that works on this host; it never
    picks ``local`` (no isolation), which must be asked for by name. Options are
    the backend's own typed options (``LocalOptions``, ``SandboxOptions``,
    ``ContainerOptions``, ``JupyterOptions``…), given as ``options=`` or as
    keywords (over ``options=`` when both are), e.g. ``workspace_root``,
    ``env_policy``, ``host_roots``, ``artifacts``.

    Raises:
        UnsupportedBackend: unknown name.
        InvalidSpec: an option the backend does not take, of the wrong type, or one it needs is missing.
        SetupFailed: the backend cannot work here (the message says how to fix it).
    """
    from .registry import open_backend

    engine = await open_backend(backend, options, keywords)
    try:
        yield engine
    finally:
        await engine.aclose()
