"""Remote mode: one kernel per workspace on a Jupyter Server or Kernel Gateway, over its REST + WebSocket API.

Kernels are started with ``POST /api/kernels``, driven over ``/api/kernels/{id}/channels`` (JSON
messages built by ``jupyter_client``'s :class:`~jupyter_client.session.Session`), interrupted with
``POST …/interrupt`` and stopped with ``DELETE``. Cells behave as with local kernels
(:class:`~execspace.backends.jupyter.kernels.KernelSessions`): rich outputs become ``out/cell-N-K.*``
files, a timeout interrupts and then replaces the kernel, a dead kernel is reported and the next
call states the loss of state.

Files: this version needs a **shared filesystem**: the server's kernels must see the workspace
directories at the same paths as this host (a server on this host, or ``workspace_root`` shared at the
same path). Each kernel proves it when it starts by reading a random nonce that we wrote in its
workspace, then moves into the workspace's ``work/`` with the environment a local run gets. The file
API (put/stage/collect) and programs are the local backend's, on this host. See docs/jupyter-remote.md
for what a server without a shared filesystem would need.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import os
import secrets
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError

from ...capabilities import Capabilities
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...errors import BackendError, CapabilityError, SetupFailed, UnsupportedLanguage, UsageError
from ...languages import resolve_language
from ...models import (
    DEFAULT_OUTPUT_BYTES,
    DEFAULT_TIMEOUT,
    BlockResult,
    CodeBlock,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Workspace,
)
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...protocols import ProgramHandle, ProgramRunner, WorkspaceFS
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root
from ...workspace.layout import workspace_env
from .kernels import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_RESTARTED, CellResult
from .outputs import CellOutputs
from .remote_api import MAX_MESSAGE_BYTES, ServerApi

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # jupyter_core's platformdirs notice
    from jupyter_client.jsonutil import json_default
    from jupyter_client.session import Session

__all__ = ["RemoteKernelSessions", "open_remote_engine", "remote_capabilities"]

DOES_NOT_PROTECT = (
    "no isolation: kernels run as the server's user, with that user's files, network and processes",
    "anything running as the server's user can read its token and drive every kernel on it, including other "
    "workspaces' kernels",
    "the token and all code and outputs cross the network in clear text unless the server URL is https",
    "network cannot be turned off",
    "kernels are not limited in memory, CPU time or processes (cells get timeout and output_bytes only)",
)
#: Added with programs="host".
PROGRAMS_DO_NOT_PROTECT = ("programs run on this host as you, with no isolation (rlimits and timeout only)",)
ProgramsMode = Literal["host", "refuse"]
_SERVER_RESTARTED = ("restarting", "autorestarting", "dead")
_CLOSED = "the WebSocket connection to the server closed"
#: iopub messages kept while nobody reads them (no cell running, or a reader far behind)
_MAX_QUEUED = 10_000


@dataclass(slots=True)
class _RemoteKernel:
    id: str
    conn: WebSocketClientConnection
    session: Session
    iopub: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    """iopub messages in order; None once the kernel is gone."""
    shell: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None
    gone: str | None = None
    """Why this kernel can no longer be used: the server restarted it (it died), or the connection closed."""
    restarted: bool = False
    """The server said it restarted the kernel (so the server itself is alive)."""
    began: str | None = None
    """msg_id of the last cell the kernel said it started (busy status)."""
    dropped: int = 0

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg = self.session.msg(msg_type, content)
        msg["channel"] = channel
        try:
            self.conn.write_message(json.dumps(msg, default=json_default))
        except WebSocketClosedError:
            self._lost(_CLOSED)
        return str(msg["header"]["msg_id"])

    def _lost(self, why: str) -> None:
        if self.gone is None:
            self.gone = why
            self.iopub.put_nowait(None)
            self.shell.put_nowait(None)

    async def read(self) -> None:
        """Route the server's messages to the queues; a restart or dead status means the kernel's state is gone."""
        try:
            await self._route()
        except Exception as exc:  # a cell waiting on the queues must hear of it rather than hang until its timeout
            self._lost(f"the connection to the server failed: {type(exc).__name__}: {exc}")
        self._lost(_CLOSED)

    async def _route(self) -> None:
        while (raw := await self.conn.read_message()) is not None:
            _quick_ack(self.conn)
            if not isinstance(raw, str):
                continue  # binary frames carry buffers (widgets), which cells do not use
            msg = json.loads(raw)
            channel, msg_type = msg.get("channel"), msg.get("header", {}).get("msg_type")
            if channel == "iopub" and msg_type == "status":
                state = msg.get("content", {}).get("execution_state")
                if state in _SERVER_RESTARTED:
                    # the server's restarter saw the kernel die and started a fresh one in its place
                    self.restarted = True
                    self._lost(f"the server reported the kernel {state}")
                    continue
            if channel == "iopub" and msg_type != "status" and self.iopub.qsize() >= _MAX_QUEUED:
                # a background thread printing between calls must not fill our memory; status messages
                # (which end cells) are always kept
                self.dropped += 1
            elif channel == "iopub":
                self.iopub.put_nowait(msg)
            elif channel == "shell":
                self.shell.put_nowait(msg)


@dataclass(slots=True)
class _Session:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kernel: _RemoteKernel | None = None
    cancelled: str | None = None
    lost: str | None = None
    next_cell: int = 0


class _KernelDied(Exception):
    pass


class RemoteKernelSessions:
    """Kernels on a Jupyter Server or Kernel Gateway, one per workspace; the same surface as KernelSessions."""

    def __init__(
        self,
        api: ServerApi,
        fs: WorkspaceFS,
        env_policy: EnvPolicy | None = None,
        *,
        kernel_name: str = "python3",
        language: str = "python",
        server_root: Path | None = None,
        start_timeout: float = 30.0,
        interrupt_grace: float = 2.0,
    ) -> None:
        self.kernel_name = kernel_name
        self.language = language
        self.pool = None
        """Remote mode keeps no warm pool: each workspace's kernel starts on its first cell."""
        self._api = api
        self._fs = fs
        self._env_policy = env_policy or EnvPolicy()
        self._server_root = server_root
        self._start_timeout = start_timeout
        self._interrupt_grace = interrupt_grace
        self._sessions: dict[str, _Session] = {}
        self._deleting: set[asyncio.Task[None]] = set()
        """DELETEs of replaced kernels: the server shuts a kernel down gracefully (seconds for a spinning one),
        which the caller whose cell timed out should not wait for; aclose waits for them."""
        self._closed = False

    def start_pool(self) -> None:
        """No warm pool in remote mode (kept for the same surface as local kernels)."""

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
                f"remote {self.kernel_name} kernels do not enforce {', '.join(unenforced)}; drop these limits "
                "or run the code as a program on the local or sandbox backend"
            )
            return BlockResult(index, block.language, 127, "", "", 0.0, error=why), f"[error: {why}]\n"
        cell = await self.execute(ws, block.code, timeout=timeout, output_bytes=limits.output_bytes)
        result = BlockResult(
            index, block.language, cell.exit_code, cell.stdout, cell.stderr, cell.duration, cell.timed_out
        )
        return result, cell.text

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
            BackendError: the server cannot be reached (it stopped, or the network is down).
            SetupFailed: the server refused the token, or its kernels cannot see the workspace.
        """
        if self._closed:
            raise UsageError("this engine's kernels are shut down; open a new engine")
        session = self._sessions.setdefault(_key(ws), _Session())
        async with session.lock:
            await self._replace_if_gone(session)
            await self._settle_cancelled(session)
            fresh = session.kernel is None
            kernel = session.kernel or await self._start(ws, session)
            out = CellOutputs(session.next_cell, output_bytes)
            session.next_cell += 1
            state_lost = fresh and session.lost is not None
            if session.lost is not None:
                out.note(session.lost)
                session.lost = None
            started = time.monotonic()
            exit_code, timed_out, died = await self._run_cell(session, kernel, code, out, timeout)
            duration = time.monotonic() - started
            if kernel.dropped:
                out.note(f"{kernel.dropped} output messages were dropped: they came faster than they were read")
        if out.files:
            await self._fs.put_files(ws, out.files)
        if out.dropped:
            out.note(f"{out.dropped} more rich outputs of this cell were not saved (at most 50 per cell)")
        return _result(
            out,
            exit_code,
            duration,
            timed_out=timed_out,
            died=died,
            state_lost=state_lost or died or exit_code == EXIT_RESTARTED,
        )

    async def _run_cell(
        self,
        session: _Session,
        kernel: _RemoteKernel,
        code: str,
        out: CellOutputs,
        timeout: float | None,  # noqa: ASYNC109
    ) -> tuple[int, bool, bool]:
        """Return (exit code, timed out, kernel died)."""
        _drain(kernel)
        msg_id = kernel.send("execute_request", _execute_content(code))
        deadline = time.monotonic() + timeout if timeout is not None else math.inf
        try:
            if await self._collect_or_interrupt(session, kernel, msg_id, out, deadline):
                return (EXIT_ERROR if out.error else EXIT_OK), False, False
            await self._api.interrupt(kernel.id)
            if await _collect(kernel, msg_id, out, time.monotonic() + self._interrupt_grace):
                out.note(f"timed out after {timeout:g}s; the kernel was interrupted and keeps its state")
                return EXIT_INTERRUPTED, True, False
        except _KernelDied:
            # the server notices a dead kernel only when its restarter polls: it may have died before this cell
            when = "during this cell" if kernel.began == msg_id else "before this cell showed that it started"
            why = await self._why_gone(session, kernel)
            session.lost = "a fresh kernel was started: the previous one died, its variables and imports are gone"
            out.note(
                f"the kernel died {when} ({why}); its variables and imports are lost, "
                "the next call starts a fresh kernel"
            )
            return EXIT_RESTARTED, False, True
        await self._discard(session)
        session.lost = "a fresh kernel was started: the previous one was restarted, its variables and imports are gone"
        out.note(
            f"timed out after {timeout:g}s and the kernel did not stop on interrupt: it was replaced by a fresh one, "
            "its variables and imports are lost"
        )
        return EXIT_RESTARTED, True, False

    async def _why_gone(self, session: _Session, kernel: _RemoteKernel) -> str:
        """Discard the gone kernel; raise BackendError if the server itself is gone, else say what happened."""
        why = kernel.gone or "it stopped responding"
        if not kernel.restarted:
            try:
                model = await self._api.kernel(kernel.id)
            except BackendError:
                await self._discard(session)
                session.lost = "a fresh kernel was started: the server went away, the previous kernel's state is gone"
                raise
            if model is None:
                why = "the server no longer has it"
            else:  # alive on the server, but our connection is gone (e.g. tornado closes it on an oversized message)
                why = f"{why} while the server still had the kernel (a message over {MAX_MESSAGE_BYTES >> 20} MiB?)"
        await self._discard(session)
        return why

    # -- kernel lifetime ---------------------------------------------------------------

    async def _start(self, ws: Workspace, session: _Session) -> _RemoteKernel:
        if ws.host_path is None:
            raise UsageError("remote jupyter kernels need a host-directory workspace (shared filesystem mode)")
        root = str(ws.host_path)
        if session.next_cell == 0:
            session.next_cell = _next_cell_number(ws.host_path / "out")
        kernel_id = await self._api.start_kernel(self.kernel_name, self._server_path(ws.host_path / "work"))
        kernel: _RemoteKernel | None = None
        try:
            kernel = await self._connect(kernel_id)
            await self._bind(kernel, root)
        except BaseException:
            if kernel is not None:
                await _close(kernel)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._api.delete(kernel_id))
            raise
        session.kernel = kernel
        return kernel

    def _server_path(self, work: Path) -> str | None:
        """``work`` relative to the server's root_dir (the kernel's start cwd), when we know that root."""
        if self._server_root is None:
            return None
        try:
            return work.resolve().relative_to(self._server_root.resolve()).as_posix()
        except ValueError:
            return None

    async def _connect(self, kernel_id: str) -> _RemoteKernel:
        session = Session(username="execspace")
        conn = await self._api.connect_channels(kernel_id, session.session)
        kernel = _RemoteKernel(kernel_id, conn, session)
        kernel.reader = asyncio.get_running_loop().create_task(kernel.read())
        try:
            await self._wait_ready(kernel)
        except BaseException:
            await _close(kernel)
            raise
        return kernel

    async def _wait_ready(self, kernel: _RemoteKernel) -> None:
        """Ask for kernel_info until the kernel answers (the server may connect its channels lazily)."""
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline and kernel.gone is None:
            msg_id = kernel.send("kernel_info_request", {})
            if await _reply(kernel, msg_id, min(1.0, deadline - time.monotonic())) is not None:
                _drain(kernel)
                return
        raise SetupFailed(
            "jupyter",
            f"kernel {self.kernel_name!r} on {self._api.url} did not answer within {self._start_timeout:g}s"
            + (f" ({kernel.gone})" if kernel.gone else ""),
            "see the server's log",
        )

    async def _bind(self, kernel: _RemoteKernel, root: str) -> None:
        """Move the new kernel into the workspace after it proved it sees the workspace's files."""
        run_dir = f"runs/kernel-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
        nonce_path, nonce = _write_nonce(os.path.join(root, run_dir))
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        code = _bind_cell(nonce_path=nonce_path, nonce=nonce, work=os.path.join(root, "work"), env=env)
        try:
            msg_id = kernel.send("execute_request", _execute_content(code, silent=True))
            reply = await _reply(kernel, msg_id, self._start_timeout)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(nonce_path)
        content = (reply or {}).get("content", {})
        if content.get("status") != "ok":
            raise self._bind_error(content, kernel.gone if reply is None else None, root)

    def _bind_error(self, content: dict[str, Any], gone: str | None, root: str) -> SetupFailed:
        """What the failed bind cell says about the server's view of this host's workspace."""
        name, value = content.get("ename"), content.get("evalue")
        if name in ("FileNotFoundError", "_NotShared"):
            return SetupFailed(
                "jupyter",
                f"the kernels of {self._api.url} do not see this host's workspace {root} (no shared filesystem)",
                "run the server on this host, or share workspace_root with the server at the same path "
                "(see docs/jupyter-remote.md)",
            )
        if name == "PermissionError":
            return SetupFailed(
                "jupyter",
                f"the kernels of {self._api.url} may not open this host's workspace {root}: {value}",
                "run the server as the same user as execspace (workspaces are private to their owner)",
            )
        why = f"{name}: {value}" if content else gone or "no reply"
        return SetupFailed("jupyter", f"kernel {self.kernel_name!r} could not be moved into {root}: {why}")

    async def _collect_or_interrupt(
        self, session: _Session, kernel: _RemoteKernel, msg_id: str, out: CellOutputs, deadline: float
    ) -> bool:
        """:func:`_collect`, interrupting the cell if our caller is cancelled, so that the kernel is free again."""
        try:
            return await _collect(kernel, msg_id, out, deadline)
        except asyncio.CancelledError:
            session.cancelled = msg_id
            with contextlib.suppress(Exception):
                await asyncio.shield(self._api.interrupt(kernel.id))
            raise

    async def _settle_cancelled(self, session: _Session) -> None:
        """Wait for a cancelled cell to end before the next one (see KernelSessions._settle_cancelled)."""
        msg_id, session.cancelled = session.cancelled, None
        if msg_id is None or session.kernel is None:
            return
        try:
            if await _collect(session.kernel, msg_id, CellOutputs(0, 0), time.monotonic() + self._interrupt_grace):
                return
            why = "the previous one was replaced because a cancelled cell did not stop on interrupt"
        except _KernelDied:
            why = "the previous one died after a cell was cancelled"
        await self._discard(session)
        session.lost = f"a fresh kernel was started: {why}, its variables and imports are gone"

    async def _replace_if_gone(self, session: _Session) -> None:
        """The server may have restarted a dead kernel between calls (with a fresh state): say so, start afresh."""
        kernel = session.kernel
        if kernel is not None and kernel.gone is not None:
            why = await self._why_gone(session, kernel)
            session.lost = (
                f"a fresh kernel was started: the previous one died between calls ({why}), "
                "its variables and imports are gone"
            )

    async def _discard(self, session: _Session, *, wait: bool = False) -> None:
        """Drop the session's kernel and DELETE it on the server (in the background unless ``wait``)."""
        kernel, session.kernel = session.kernel, None
        if kernel is None:
            return
        await _close(kernel)
        task = asyncio.get_running_loop().create_task(self._delete(kernel.id))
        self._deleting.add(task)
        task.add_done_callback(self._deleting.discard)
        if wait:
            await task

    async def _delete(self, kernel_id: str) -> None:
        with contextlib.suppress(Exception):
            # a hung server must not hold anyone up for the whole HTTP timeout
            await asyncio.wait_for(self._api.delete(kernel_id), 10.0)

    async def shutdown(self, ws: Workspace) -> None:
        """Stop the workspace's kernel on the server (its state is lost). Idempotent."""
        session = self._sessions.pop(_key(ws), None)
        if session is not None:
            async with session.lock:
                await self._discard(session, wait=True)

    async def aclose(self) -> None:
        """Stop every kernel this engine started on the server. Idempotent."""
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await self._discard(session)
        await asyncio.gather(*self._deleting, return_exceptions=True)
        self._api.close()


#: Runs with its own globals (leaves no names in the user's namespace): proves the kernel sees our nonce in the
#: workspace, then moves it there and replaces its whole environment (the server's) with a local run's; only
#: MPLBACKEND survives, which ipykernel sets at start-up so that figures are displayed inline (as PNGs for us).
_BIND_SOURCE = """
import os, tempfile
from IPython import get_ipython
class _NotShared(Exception):
    pass
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


def _bind_cell(**values: Any) -> str:
    return f"exec({_BIND_SOURCE.format(**values)!r}, {{}})"


def _quick_ack(conn: WebSocketClientConnection) -> None:
    """Ask Linux to ACK the server's next packets at once (it drops back to delayed ACKs by itself).

    Jupyter Server and Kernel Gateway leave Nagle's algorithm on for their WebSockets (tornado's default), so
    the second of two small messages (busy, then execute_input…) waits for our ACK of the first, which Linux
    delays by 40 ms: a warm cell took about 50 ms instead of a few.
    """
    option = getattr(socket, "TCP_QUICKACK", None)
    stream = getattr(conn.protocol, "stream", None)
    if option is None or stream is None or stream.socket is None:
        return
    with contextlib.suppress(OSError):
        stream.socket.setsockopt(socket.IPPROTO_TCP, option, 1)


def _write_nonce(run_dir: str) -> tuple[str, str]:
    """A random nonce in a new file under ``run_dir``, for a kernel to read back."""
    os.makedirs(run_dir, exist_ok=True)
    path, nonce = os.path.join(run_dir, "bind-nonce"), secrets.token_hex(16)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(nonce)
    return path, nonce


def _execute_content(code: str, *, silent: bool = False) -> dict[str, Any]:
    return {
        "code": code,
        "silent": silent,
        "store_history": not silent,
        "user_expressions": {},
        "allow_stdin": False,
        "stop_on_error": True,
    }


async def _collect(kernel: _RemoteKernel, msg_id: str, out: CellOutputs, deadline: float) -> bool:
    """Feed this cell's messages to ``out`` until the kernel is idle (True) or the deadline (False)."""
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = await asyncio.wait_for(kernel.iopub.get(), min(remaining, 3600.0))
        except TimeoutError:
            return False
        if msg is None:
            kernel.iopub.put_nowait(None)  # stays gone for whoever reads next
            raise _KernelDied
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue  # output of an earlier, interrupted cell or of a background thread
        msg_type, content = msg["header"]["msg_type"], msg["content"]
        if msg_type == "status" and content.get("execution_state") == "idle":
            return True
        if msg_type == "status" and content.get("execution_state") == "busy":
            kernel.began = msg_id
        out.add(msg_type, content)
    return False


async def _reply(kernel: _RemoteKernel, msg_id: str, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
    """The shell reply to ``msg_id``, or None (timeout, or the kernel is gone)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg = await asyncio.wait_for(kernel.shell.get(), remaining)
        except TimeoutError:
            return None
        if msg is None:
            kernel.shell.put_nowait(None)
            return None
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg
    return None


def _drain(kernel: _RemoteKernel) -> None:
    """Drop messages nobody will read (replies, output of earlier cells), keeping the 'gone' marker."""
    kernel.dropped = 0
    for queue in (kernel.iopub, kernel.shell):
        while not queue.empty():
            if queue.get_nowait() is None:
                queue.put_nowait(None)
                break


async def _close(kernel: _RemoteKernel) -> None:
    kernel.conn.close()
    if kernel.reader is not None:
        kernel.reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await kernel.reader


def _next_cell_number(out_dir: Path) -> int:
    """One past the highest ``cell-N-*`` already in ``out/``, so a new kernel never overwrites older outputs."""
    numbers = []
    with contextlib.suppress(OSError):
        for name in os.listdir(out_dir):
            head = name.split("-")
            if len(head) >= 3 and head[0] == "cell" and head[1].isdigit():
                numbers.append(int(head[1]))
    return max(numbers, default=0) + 1


def _key(ws: Workspace) -> str:
    return str(ws.host_path) if ws.host_path is not None else ws.id


def _result(out: CellOutputs, exit_code: int, duration: float, **flags: bool) -> CellResult:
    def text(buf: Any) -> str:
        return str(buf.getvalue().decode("utf-8", "replace"))

    return CellResult(
        exit_code=exit_code,
        text=text(out.text),
        stdout=text(out.stdout),
        stderr=text(out.stderr),
        files=tuple(f.path for f in out.files),
        duration=duration,
        error=out.error,
        truncated=out.text.truncated,
        timed_out=flags["timed_out"],
        kernel_died=flags["died"],
        state_lost=flags["state_lost"],
    )


# -- the engine ----------------------------------------------------------------------------


class _RemoteKernelWorkspaceManager(HostWorkspaceManager):
    """Host-directory workspaces whose cleanup also stops their kernel on the server."""

    def __init__(self, root: Path | None, kernels: RemoteKernelSessions) -> None:
        super().__init__("jupyter", root)
        self._kernels = kernels

    async def cleanup(self, ws: Workspace) -> None:
        await self._kernels.shutdown(ws)
        await super().cleanup(ws)


class _NoPrograms:
    """The runner of ``programs="refuse"``: code runs only in the server's kernels."""

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        raise _programs_refused()

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ProgramHandle:
        raise _programs_refused()


def _programs_refused() -> CapabilityError:
    return CapabilityError(
        "programs",
        "jupyter",
        "This remote engine was opened with programs='refuse': run code in the kernel (engine.extra('kernels')), "
        "or open it with programs='host' to run programs on this host without isolation.",
    )


def remote_capabilities(
    env_policy: EnvPolicy | None, server_url: str, language: str = "python", programs: ProgramsMode = "host"
) -> Capabilities:
    """What remote mode enforces: cells in the server's kernels; programs on this host (or none at all)."""
    where = "programs run on this host" if programs == "host" else "no programs"
    base = unisolated_capabilities(
        "jupyter",
        env_policy,
        DOES_NOT_PROTECT + (PROGRAMS_DO_NOT_PROTECT if programs == "host" else ()),
        {
            "mode": f"remote kernels on {server_url} (shared filesystem; {where})",
            "kernel_language": language,
            "kernel_limits": "timeout (interrupt, then a fresh kernel) and output_bytes only",
        },
    )
    if programs == "refuse":
        return dataclasses.replace(
            base,
            persistent_state=True,
            languages=(language,),
            streaming=False,
            clean_env=False,
            # what cells get (CodeExecutor checks these before running anything); there are no programs
            enforced_limits=frozenset({"timeout", "output_bytes"}),
        )
    languages = base.languages if language in base.languages else (language, *base.languages)
    return dataclasses.replace(base, persistent_state=True, languages=languages)


async def open_remote_engine(
    *,
    server_url: str,
    token: str,
    workspace_root: Path | str | None = None,
    env_policy: EnvPolicy | None = None,
    host_roots: Any = (),
    artifacts: Any = None,
    kill_grace: float = 2.0,
    kernel_name: str = "python3",
    interrupt_grace: float = 2.0,
    server_root: Path | str | None = None,
    ca_file: str | None = None,
    shared_filesystem: bool = True,
    programs: ProgramsMode = "host",
    request_timeout: float = 30.0,
    start_timeout: float = 30.0,
) -> BaseEngine:
    """Open a jupyter engine whose kernels run on the Jupyter Server or Kernel Gateway at ``server_url``.

    Args:
        server_url: ``http(s)://host:port[/base_url]`` of the server.
        token: the server's token, sent as ``Authorization: token …``; an empty token is refused.
        workspace_root, env_policy, host_roots, artifacts, kill_grace, kernel_name, interrupt_grace: as for
            the local jupyter backend; ``env_policy`` builds each kernel's environment, which replaces the
            server's in the kernel.
        server_root: the server's root_dir on this host, if known (kernels then also start in ``work/``).
        ca_file: CA bundle that signs an https server's certificate (the system's trust store otherwise).
        shared_filesystem: must be True: a server that cannot see ``workspace_root`` is not supported yet.
        programs: ``"host"``: ``runner.run_program`` runs programs on this host as the caller (no isolation),
            like the local backend; ``"refuse"``: it raises :class:`CapabilityError` and code runs only in the
            server's kernels (Capabilities list only the kernel's language).

    Raises:
        SetupFailed: bad token (HTTP 401/403), unknown or non-Python kernel, no shared filesystem.
        BackendError: the server cannot be reached.
    """
    if not token:
        raise SetupFailed(
            "jupyter", "remote mode needs the server's token", "pass token=...; never run a server without one"
        )
    if not shared_filesystem:
        raise SetupFailed(
            "jupyter",
            "remote kernels without a filesystem shared with this host are not supported yet",
            "run the server on this host, or share workspace_root with it at the same path (docs/jupyter-remote.md)",
        )
    api = ServerApi(server_url, token, ca_file=ca_file, request_timeout=request_timeout)
    try:
        language = await _remote_language(api, kernel_name)
    except BaseException:
        api.close()
        raise
    caps = remote_capabilities(env_policy, api.url, language, programs)
    fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots)
    kernels = RemoteKernelSessions(
        api,
        fs,
        env_policy,
        kernel_name=kernel_name,
        language=language,
        server_root=Path(server_root) if server_root is not None else None,
        start_timeout=start_timeout,
        interrupt_grace=interrupt_grace,
    )
    root = Path(workspace_root) if workspace_root else default_workspace_root()
    manager = _RemoteKernelWorkspaceManager(root, kernels)
    runner: ProgramRunner = (
        HostRunner(lambda: caps, env_policy, kill_grace=kill_grace) if programs == "host" else _NoPrograms()
    )
    return BaseEngine(
        "jupyter",
        manager,
        fs,
        runner,
        caps,
        on_close=kernels.aclose,
        extra={"workspace_root": manager.root, "kernels": kernels, "server_url": api.url},
    )


async def _remote_language(api: ServerApi, kernel_name: str) -> str:
    """The language of the server's kernel spec ``kernel_name``; only Python kernels can be bound to a workspace."""
    specs = (await api.kernelspecs()).get("kernelspecs") or {}
    if kernel_name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise SetupFailed(
            "jupyter",
            f"the server at {api.url} has no kernel spec {kernel_name!r} (it has: {known})",
            "pick one of those with kernel_name=..., or install the kernel on the server",
        )
    language = str((specs[kernel_name].get("spec") or {}).get("language", "")).lower()
    if language != "python":
        raise SetupFailed(
            "jupyter",
            f"kernel {kernel_name!r} is {language or 'of unknown language'}: remote mode moves kernels into their "
            "workspace with a Python cell, so only Python kernels are supported",
            "use a Python kernel spec, or the local jupyter backend for other kernels",
        )
    return language
