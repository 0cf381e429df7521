"""One Jupyter kernel per workspace: started on first use, kept across calls, replaced when it dies.

:class:`KernelSessions` is the cell logic of every jupyter mode: timeouts (interrupt, then a fresh kernel),
dead kernels, cancelled callers, rich outputs saved as ``out/cell-N-K.*``. Where a kernel runs is its
:class:`KernelLauncher`'s business, which hands back a :class:`KernelConnection`: on this host through
``jupyter_client`` (:mod:`.local`, with the warm pool), inside the OS sandbox over IPC sockets
(:mod:`.sandboxed`), or on a Jupyter Server over its WebSocket (:mod:`.remote`). Every launcher puts the
kernel in the workspace's ``work/`` with an environment built by the engine's :class:`EnvPolicy`, so host
secrets are not inherited.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...audit import AuditSink, cell_executed
from ...errors import UnsupportedLanguage, UsageError
from ...languages import resolve_language
from ...models import (
    DEFAULT_OUTPUT_BYTES,
    DEFAULT_TIMEOUT,
    BlockResult,
    CellResult,
    CodeBlock,
    PutFile,
    ResourceLimits,
    Workspace,
)
from ...process.freezing import Hold, held
from ...protocols import WorkspaceFS
from ...tracing import NO_TRACER, AttributeValue, Tracer
from ...workspace.hostmanager import HostWorkspaceManager
from .outputs import CellOutputs, RichOutputLimits
from .pool import KernelPool

__all__ = [
    "CellResult",
    "KernelConnection",
    "KernelLauncher",
    "KernelSessions",
    "KernelWorkspaceManager",
    "await_reply",
    "bind",
    "new_run_dir",
]

#: Exit codes of a cell, shaped like a program's: 0 ok, 1 exception, -2 interrupted (SIGINT), -9 restarted;
#: a kernel that died gives its own exit status when its launcher knows it.
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_RESTARTED = 0, 1, -2, -9
#: How often a silent cell checks that its kernel is still alive.
_LIVENESS_POLL = 0.25
_CELL_FILE = re.compile(r"^cell-(\d+)-")


class KernelConnection(Protocol):
    """One started kernel, as the cell logic drives it (Jupyter messages as dicts, like ``jupyter_client``'s)."""

    @property
    def dropped(self) -> int:
        """Output messages thrown away since :meth:`drain` because they came faster than they were read."""
        ...

    def execute(self, code: str, *, silent: bool = False) -> str:
        """Send an ``execute_request`` (no stdin, stop on error); its msg_id."""
        ...

    async def next_iopub(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        """The next iopub message, or None if none came in time (or the kernel is gone: ask :meth:`is_alive`)."""
        ...

    async def next_shell(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        """The next shell reply, or None."""
        ...

    async def drain(self) -> None:
        """Drop replies nobody reads, so that they do not pile up over a long session."""
        ...

    async def interrupt(self) -> None: ...

    async def is_alive(self) -> bool: ...

    def hold(self) -> Hold | None:
        """What holds the kernel's processes still for a snapshot or a pause (its sandbox's, for a sandboxed
        kernel: see :mod:`execspace.process.freezing`); None where no process of this host runs it."""
        ...

    async def exit_status(self) -> tuple[int | None, str]:
        """The dead kernel's exit status (``-N`` for signal N, None if unknown) and how to say it."""
        ...

    async def stop(self, *, wait: bool = True) -> None:
        """Stop the kernel; without ``wait`` a slow stop may finish in the background (the launcher's aclose
        waits for it)."""
        ...


class KernelLauncher(Protocol):
    """Starts kernels bound to a workspace: in its ``work/``, with the workspace's environment."""

    @property
    def pool(self) -> KernelPool | None:
        """Kernels started ahead for new workspaces, if this launcher keeps any."""
        ...

    async def start(self, ws: Workspace, *, timeout: float) -> KernelConnection:  # noqa: ASYNC109
        """Start a kernel for ``ws`` (a host-directory workspace) and wait until it answers."""
        ...

    async def aclose(self) -> None:
        """Release what the launcher holds (pool, background stops). Idempotent."""
        ...


@dataclass(slots=True)
class _Session:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kernel: KernelConnection | None = None
    cancelled: str | None = None
    """msg_id of a cell whose caller was cancelled: interrupted, maybe still running."""
    began: str | None = None
    """msg_id of the last cell the kernel said it started (busy status)."""
    lost: str | None = None
    """Why the previous kernel's state is gone, told once with the next call's output."""
    next_cell: int = 0


class _KernelDied(Exception):
    pass


#: Writes a cell's rich outputs into its workspace.
_Save = Callable[[list[PutFile]], Awaitable[None]]


class KernelSessions:
    """Kernels keyed by workspace; the executor path of the ``jupyter`` backend."""

    def __init__(
        self,
        fs: WorkspaceFS,
        launcher: KernelLauncher,
        *,
        kernel_name: str = "python3",
        language: str = "python",
        start_timeout: float = 30.0,
        interrupt_grace: float = 2.0,
        rich_outputs: RichOutputLimits | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self.kernel_name = kernel_name
        self.tracer = tracer
        """A span of each cell's execution (never its code or output)."""
        self.audit = audit
        """Where a ``cell.execute`` line of each cell goes (its language and size, never its code)."""
        self.rich_outputs = rich_outputs or RichOutputLimits()
        self.language = language
        self.launcher = launcher
        self.pool = launcher.pool
        self._fs = fs
        self._start_timeout = start_timeout
        self._interrupt_grace = interrupt_grace
        self._sessions: dict[str, _Session] = {}
        self._closed = False

    def start_pool(self) -> None:
        """Begin filling the warm pool in the background, if there is one (needs a running event loop)."""
        if self.pool is not None:
            self.pool.refill()

    # -- executor path -----------------------------------------------------------------

    def handles(self, tag: str) -> bool:
        """Whether a code block with fence tag ``tag`` runs in the kernel."""
        words = tag.split()
        if not words:
            return False
        try:
            return resolve_language(words[0]).name == self.language
        except UnsupportedLanguage:
            return False

    async def run_block(
        self,
        ws: Workspace,
        block: CodeBlock,
        index: int,
        *,
        timeout: float | None,  # noqa: ASYNC109 - a deadline for the kernel, not for our task
        limits: ResourceLimits,
    ) -> tuple[BlockResult, str]:
        """Run one code block in ``ws``'s kernel, as :class:`~execspace.CodeExecutor` runs a program."""
        unenforced = sorted(limits.requested() - {"output_bytes"})
        if unenforced:
            why = (
                f"the {self.kernel_name} kernel does not enforce {', '.join(unenforced)}; drop these limits "
                "or run the code as a program on the local or sandbox backend"
            )
            return BlockResult(index, block.language, 127, "", "", 0.0, error=why), f"[error: {why}]\n"
        cell = await self.execute(ws, block.code, timeout=timeout, output_bytes=limits.output_bytes)
        return cell.as_block(index, block.language), cell.text

    # -- cells ---------------------------------------------------------------------------

    async def execute(
        self,
        ws: Workspace,
        code: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - interrupts the kernel, not our task
        output_bytes: int | None = DEFAULT_OUTPUT_BYTES,
    ) -> CellResult:
        """Run ``code`` in the workspace's kernel (started on first use); rich outputs go to ``out/``.

        Raises:
            SetupFailed: the kernel did not start, or (remote mode) cannot see the workspace.
            BackendError: (remote mode) the server cannot be reached.
        """
        attributes: dict[str, AttributeValue] = {
            "execspace.workspace.id": ws.id,
            "execspace.kernel.name": self.kernel_name,
            "execspace.kernel.language": self.language,
        }
        if self.audit is not None:
            self.audit.record("cell.execute", cell_executed(ws.id, self.language, code))
        with self.tracer.span("execspace.kernel.execute", attributes) as span:
            cell = await self._execute(ws, code, timeout, output_bytes)
            span.set("execspace.kernel.exit_code", cell.exit_code)
            span.set("execspace.kernel.timed_out", cell.timed_out)
            span.set("execspace.kernel.state_lost", cell.state_lost)
            span.set("execspace.kernel.duration_s", cell.duration)
            return cell

    async def _execute(
        self,
        ws: Workspace,
        code: str,
        timeout: float | None,  # noqa: ASYNC109 - interrupts the kernel, not our task
        output_bytes: int | None,
    ) -> CellResult:
        if self._closed:
            raise UsageError("this engine's kernels are shut down; open a new engine")
        session = self._sessions.setdefault(_key(ws), _Session())
        async with session.lock:
            await self._replace_if_dead(session)
            await self._settle_cancelled(session)
            fresh = session.kernel is None
            kernel = session.kernel or await self._start(ws, session)
            out = CellOutputs(session.next_cell, output_bytes, self.rich_outputs)
            session.next_cell += 1
            state_lost = fresh and session.lost is not None
            if session.lost is not None:
                out.note(session.lost)
                session.lost = None
            started = time.monotonic()
            save = functools.partial(self._fs.put_files, ws)
            exit_code, timed_out, died = await self._run_cell(session, kernel, code, out, timeout, save)
            duration = time.monotonic() - started
            if kernel.dropped:
                out.note(f"{kernel.dropped} output messages were dropped: they came faster than they were read")
        if out.files:
            await self._fs.put_files(ws, out.take_files())
        if (dropped := out.drop_note()) is not None:
            out.note(dropped)
        state_lost = state_lost or died or exit_code == EXIT_RESTARTED
        return _result(out, exit_code, duration, timed_out=timed_out, died=died, state_lost=state_lost)

    async def _run_cell(
        self,
        session: _Session,
        kernel: KernelConnection,
        code: str,
        out: CellOutputs,
        timeout: float | None,  # noqa: ASYNC109
        save: _Save,
    ) -> tuple[int, bool, bool]:
        """Return (exit code, timed out, kernel died)."""
        await kernel.drain()
        msg_id = kernel.execute(code)
        sent = time.monotonic()
        deadline = sent + timeout if timeout is not None else math.inf
        try:
            if await self._collect_or_interrupt(session, kernel, msg_id, out, deadline, save):
                return (EXIT_ERROR if out.error else EXIT_OK), False, False
            await kernel.interrupt()
            if await _collect(session, kernel, msg_id, out, time.monotonic() + self._interrupt_grace, save):
                out.note(f"timed out after {timeout:g}s; the kernel was interrupted and keeps its state")
                return EXIT_INTERRUPTED, True, False
        except _KernelDied:
            # a launcher may learn of a death late (a server's restarter polls): it may predate this cell
            after = f"{time.monotonic() - sent:.1f} s after this cell was sent"
            when = f"during this cell ({after})" if session.began == msg_id else f"{after}, before any of its output"
            status, how = await self._bury(session)
            session.lost = "a fresh kernel was started: the previous one died, its variables and imports are gone"
            out.note(
                f"the kernel died {when} ({how}); its variables and imports are lost, "
                "the next call starts a fresh kernel"
            )
            return (EXIT_RESTARTED if status is None else status), False, True
        await self._discard(session)
        session.lost = "a fresh kernel was started: the previous one was restarted, its variables and imports are gone"
        out.note(
            f"timed out after {timeout:g}s and the kernel did not stop on interrupt: it was restarted (replaced "
            "by a fresh one), its variables and imports are lost"
        )
        return EXIT_RESTARTED, True, False

    async def _collect_or_interrupt(
        self, session: _Session, kernel: KernelConnection, msg_id: str, out: CellOutputs, deadline: float, save: _Save
    ) -> bool:
        """:func:`_collect`, interrupting the cell if our caller is cancelled, so that the kernel is free again."""
        try:
            return await _collect(session, kernel, msg_id, out, deadline, save)
        except asyncio.CancelledError:
            session.cancelled = msg_id
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.interrupt())
            raise

    # -- kernel lifetime ---------------------------------------------------------------

    async def _start(self, ws: Workspace, session: _Session) -> KernelConnection:
        if session.next_cell == 0:
            session.next_cell = await self.next_cell_number(ws)
        session.kernel = await self.launcher.start(ws, timeout=self._start_timeout)
        return session.kernel

    async def next_cell_number(self, ws: Workspace) -> int:
        """One past the highest ``out/cell-N-*`` already in ``ws``, so a new kernel never overwrites older outputs
        (a workspace without a host directory says it through its own file API)."""
        if ws.host_path is None:
            raise UsageError("the jupyter backend needs a host-directory workspace")
        return _next_cell_number(ws.host_path / "out")

    async def _settle_cancelled(self, session: _Session) -> None:
        """Wait for a cancelled cell to end before the next one: a request sent while the interrupted cell
        still runs would be aborted by the kernel (stop_on_error) and silently do nothing."""
        msg_id, session.cancelled = session.cancelled, None
        if msg_id is None or session.kernel is None:
            return
        try:
            deadline = time.monotonic() + self._interrupt_grace
            if await _collect(session, session.kernel, msg_id, CellOutputs(0, 0), deadline):
                return
            why = "the previous one was restarted because a cancelled cell did not stop on interrupt"
        except _KernelDied:
            why = "the previous one died after a cell was cancelled"
        await self._discard(session)
        session.lost = f"a fresh kernel was started: {why}, its variables and imports are gone"

    async def _replace_if_dead(self, session: _Session) -> None:
        """A kernel can die between calls (OOM killer, a thread calling os._exit): say so, start afresh."""
        if session.kernel is not None and not await session.kernel.is_alive():
            _, how = await self._bury(session)
            session.lost = (
                f"a fresh kernel was started: the previous one died between calls ({how}), "
                "its variables and imports are gone"
            )

    async def _bury(self, session: _Session) -> tuple[int | None, str]:
        """Discard the session's dead kernel; its exit status. Asking may fail (a remote server that is gone):
        the error goes to the caller, and the next call still starts afresh and says so."""
        assert session.kernel is not None
        try:
            return await session.kernel.exit_status()
        except Exception:
            session.lost = "a fresh kernel was started: the previous one could not be reached, its state is gone"
            raise
        finally:
            await self._discard(session)

    async def _discard(self, session: _Session, *, wait: bool = False) -> None:
        kernel, session.kernel = session.kernel, None
        if kernel is not None:
            await kernel.stop(wait=wait)

    def frozen(self, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        """The workspace's kernel (its process tree) held still for the block, as a snapshot holds its programs.

        Raises:
            FreezeFailed: (on entering) it could not be held.
        """
        session = self._sessions.get(_key(ws))
        hold = session.kernel.hold() if session is not None and session.kernel is not None else None
        return held([hold] if hold is not None else [])

    async def shutdown(self, ws: Workspace) -> None:
        """Stop the workspace's kernel (its state is lost). Idempotent."""
        session = self._sessions.pop(_key(ws), None)
        if session is not None:
            async with session.lock:
                await self._discard(session, wait=True)

    async def aclose(self) -> None:
        """Stop every kernel. Idempotent."""
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await self._discard(session)
        await self.launcher.aclose()


Freeze = Callable[[Workspace], contextlib.AbstractAsyncContextManager[None]]


def with_kernel_frozen(kernels: KernelSessions, programs: Freeze) -> Freeze:
    """A manager's ``freeze`` hook: the workspace's programs (``programs``) and its kernel stopped for the block
    (a snapshot copies a state neither changes meanwhile)."""

    @contextlib.asynccontextmanager
    async def frozen(ws: Workspace) -> AsyncIterator[None]:
        async with programs(ws), kernels.frozen(ws):
            yield

    return frozen


class KernelWorkspaceManager(HostWorkspaceManager):
    """Host-directory workspaces whose cleanup also stops their kernel."""

    def __init__(
        self,
        root: Path | None,
        kernels: KernelSessions,
        stop_programs: Callable[[Workspace], Awaitable[None]] | None = None,
        freeze: Freeze | None = None,
        audit: AuditSink | None = None,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        super().__init__("jupyter", root, stop_programs=stop_programs, freeze=freeze, tracer=tracer, audit=audit)
        self._kernels = kernels

    async def cleanup(self, ws: Workspace) -> None:
        await self._kernels.shutdown(ws)
        await super().cleanup(ws)


# -- binding a started kernel to a workspace (pooled kernels, remote kernels) ------------------

#: Runs with its own globals (leaves no names in the user's namespace): optionally proves the kernel sees our
#: nonce in the workspace, then moves it there and replaces its whole environment with a run's; only
#: MPLBACKEND survives, which ipykernel sets at start-up so that figures are displayed (as PNGs for us).
#: tempfile forgets the previous TMPDIR and IPython's directory history restarts.
_BIND_SOURCE = """
import os, tempfile
from IPython import get_ipython
class _NotShared(Exception):
    pass
if {nonce_path!r}:
    with open({nonce_path!r}) as f:
        if f.read() != {nonce!r}:
            raise _NotShared({nonce_path!r})
os.chdir({work!r})
kept = {{name: os.environ[name] for name in ("MPLBACKEND",) if name in os.environ}}
os.environ.clear()
os.environ.update(kept)
os.environ.update({env!r})
tempfile.tempdir = None
ip = get_ipython()
if ip is not None and "_dh" in ip.user_ns:
    ip.user_ns["_dh"][:] = [{work!r}]
"""


async def bind(
    kernel: KernelConnection,
    work: str,
    env: dict[str, str],
    timeout: float,  # noqa: ASYNC109 - a deadline for the kernel's reply
    *,
    nonce_path: str = "",
    nonce: str = "",
) -> dict[str, Any]:
    """Move a started (Python) kernel into ``work`` with ``env``; the bind cell's reply content ({}: no reply)."""
    code = f"exec({_BIND_SOURCE.format(nonce_path=nonce_path, nonce=nonce, work=work, env=env)!r}, {{}})"
    msg_id = kernel.execute(code, silent=True)
    reply = await await_reply(kernel, msg_id, timeout)
    return dict(reply.get("content", {})) if reply is not None else {}


async def await_reply(kernel: KernelConnection, msg_id: str, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
    """The shell reply to ``msg_id``, or None (timeout, or the kernel is gone)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        reply = await kernel.next_shell(remaining)
        if reply is None:
            return None
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return reply
    return None


def new_run_dir(root: str) -> str:
    """A new ``runs/kernel-*`` directory in the workspace at ``root`` for a kernel's log or bind nonce."""
    run_dir = f"runs/kernel-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    os.makedirs(os.path.join(root, run_dir), exist_ok=True)
    return run_dir


# -- cells -------------------------------------------------------------------------------------


async def _collect(
    session: _Session,
    kernel: KernelConnection,
    msg_id: str,
    out: CellOutputs,
    deadline: float,
    save: _Save | None = None,
) -> bool:
    """Feed this cell's messages to ``out`` until the kernel is idle (True) or the deadline (False); its rich
    outputs go to ``save`` as they come (without one they are dropped)."""
    while (remaining := deadline - time.monotonic()) > 0:
        msg = await kernel.next_iopub(min(remaining, _LIVENESS_POLL))
        if msg is None:
            if not await kernel.is_alive():
                raise _KernelDied
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue  # output of an earlier, interrupted cell or of a background thread
        session.began = msg_id  # any message of this cell shows that the kernel took it
        msg_type, content = msg["header"]["msg_type"], msg["content"]
        if msg_type == "status" and content.get("execution_state") == "idle":
            return True
        out.add(msg_type, content)
        if out.files and (files := out.take_files()) and save is not None:
            await save(files)
    return False


def _next_cell_number(out_dir: Path) -> int:
    """One past the highest ``cell-N-*`` already in ``out/``, so a new kernel never overwrites older outputs."""
    try:
        numbers = [int(m.group(1)) for name in os.listdir(out_dir) if (m := _CELL_FILE.match(name))]
    except OSError:
        return 1
    return max(numbers, default=0) + 1


def _key(ws: Workspace) -> str:
    # the path, not the id: one id has several per-turn workspaces
    return str(ws.host_path) if ws.host_path is not None else ws.path


def _result(out: CellOutputs, exit_code: int, duration: float, **flags: bool) -> CellResult:
    def text(buf: Any) -> str:
        return str(buf.getvalue().decode("utf-8", "replace"))

    return CellResult(
        exit_code=exit_code,
        text=text(out.text),
        stdout=text(out.stdout),
        stderr=text(out.stderr),
        files=tuple(out.saved),
        duration=duration,
        error=out.error,
        truncated=out.text.truncated,
        timed_out=flags["timed_out"],
        kernel_died=flags["died"],
        state_lost=flags["state_lost"],
    )
