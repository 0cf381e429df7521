"""Remote mode: one kernel per workspace on a Jupyter Server or Kernel Gateway, over its REST + WebSocket API.

Kernels are started with ``POST /api/kernels``, driven over ``/api/kernels/{id}/channels`` (JSON
messages built by ``jupyter_client``'s :class:`~jupyter_client.session.Session`), interrupted with
``POST …/interrupt`` and stopped with ``DELETE``. Cells are run by the same
:class:`~execspace.backends.jupyter.kernels.KernelSessions` as local kernels (rich outputs become
``out/cell-N-K.*`` files, a timeout interrupts and then replaces the kernel, a dead kernel is reported and
the next call states the loss of state); this module is the :class:`RemoteLauncher` and its connection.

Files, with ``shared_filesystem=True`` (default): the server's kernels must see the workspace
directories at the same paths as this host (a server on this host, or ``workspace_root`` shared at the
same path). Each kernel proves it when it starts by reading a random nonce that we wrote in its
workspace, then moves into the workspace's ``work/`` with the environment a local run gets. The file
API (put/stage/collect) and programs are the local backend's, on this host. With
``shared_filesystem=False`` workspaces live on the server and files move through a kernel
(:mod:`.serverworkspaces`); both engines are assembled in :mod:`.server`; see docs/jupyter-remote.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import socket
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tornado.websocket import WebSocketClientConnection, WebSocketClosedError

from ...audit import AuditSink
from ...envpolicy import EnvPolicy
from ...errors import SetupFailed
from ...models import Workspace
from ...process.freezing import Hold
from ...protocols import WorkspaceFS
from ...tracing import NO_TRACER, Tracer
from ...workspace.layout import workspace_env
from .kernels import KernelSessions, await_reply, bind, new_run_dir
from .outputs import RichOutputLimits
from .serverapi import MAX_MESSAGE_BYTES, ServerApi

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # jupyter_core's platformdirs notice
    from jupyter_client.jsonutil import json_default
    from jupyter_client.session import Session

__all__ = ["RemoteConnection", "RemoteKernelSessions", "RemoteLauncher"]

_SERVER_RESTARTED = ("restarting", "autorestarting", "dead")
_CLOSED = "the WebSocket connection to the server closed"
#: iopub messages kept while nobody reads them (no cell running, or a reader far behind)
_MAX_QUEUED = 10_000


@dataclass(slots=True)
class RemoteConnection:
    """A kernel on the server, driven over its channels WebSocket (the ``KernelConnection`` of remote mode)."""

    id: str
    api: ServerApi
    conn: WebSocketClientConnection
    session: Session
    deleting: set[asyncio.Task[None]]
    """The launcher's background DELETEs, which its aclose waits for."""
    iopub: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    """iopub messages in order; None once the kernel is gone."""
    shell: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    reader: asyncio.Task[None] | None = None
    gone: str | None = None
    """Why this kernel can no longer be used: the server restarted it (it died), or the connection closed."""
    restarted: bool = False
    """The server said it restarted the kernel (so the server itself is alive)."""
    dropped: int = 0

    def send(self, msg_type: str, content: dict[str, Any], channel: str = "shell") -> str:
        msg = self.session.msg(msg_type, content)
        msg["channel"] = channel
        try:
            self.conn.write_message(json.dumps(msg, default=json_default))
        except WebSocketClosedError:
            self._lost(_CLOSED)
        return str(msg["header"]["msg_id"])

    def hold(self) -> Hold | None:
        return None  # the kernel runs on the Jupyter server's side: no process of this host to stop

    def execute(self, code: str, *, silent: bool = False) -> str:
        content = {"code": code, "silent": silent, "store_history": not silent, "user_expressions": {}}
        return self.send("execute_request", {**content, "allow_stdin": False, "stop_on_error": True})

    async def next_iopub(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        return await _next(self.iopub, timeout)

    async def next_shell(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        return await _next(self.shell, timeout)

    async def drain(self) -> None:
        """Drop messages nobody will read (replies, output of earlier cells), keeping the 'gone' marker."""
        self.dropped = 0
        for queue in (self.iopub, self.shell):
            while not queue.empty():
                if queue.get_nowait() is None:
                    queue.put_nowait(None)
                    break

    async def interrupt(self) -> None:
        await self.api.interrupt(self.id)

    async def is_alive(self) -> bool:
        # the server's restarter or the closed WebSocket tells us; no request per call
        return self.gone is None

    async def exit_status(self) -> tuple[int | None, str]:
        """The server does not report exit codes; raises BackendError if the server itself is gone."""
        why = self.gone or "it stopped responding"
        if self.restarted:
            return None, why
        if await self.api.kernel(self.id) is None:
            return None, "the server no longer has it"
        # alive on the server, but our connection is gone (e.g. tornado closes it on an oversized message)
        return None, f"{why} while the server still had the kernel (a message over {MAX_MESSAGE_BYTES >> 20} MiB?)"

    async def stop(self, *, wait: bool = True) -> None:
        """Close our channels and DELETE the kernel; the server shuts a kernel down gracefully (seconds for a
        spinning one), which a caller whose cell timed out should not wait for."""
        await self.close()
        task = asyncio.get_running_loop().create_task(_delete(self.api, self.id))
        self.deleting.add(task)
        task.add_done_callback(self.deleting.discard)
        if wait:
            await task

    async def close(self) -> None:
        self.conn.close()
        if self.reader is not None:
            self.reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.reader

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


async def _next(queue: asyncio.Queue[dict[str, Any] | None], timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
    try:
        msg = await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError:
        return None
    if msg is None:
        queue.put_nowait(None)  # stays gone for whoever reads next
    return msg


async def _delete(api: ServerApi, kernel_id: str) -> None:
    with contextlib.suppress(Exception):
        # a hung server must not hold anyone up for the whole HTTP timeout
        await asyncio.wait_for(api.delete(kernel_id), 10.0)


class RemoteLauncher:
    """Starts a workspace's kernel on the server and binds it to the workspace (the ``KernelLauncher``)."""

    pool = None
    """Remote mode keeps no warm pool: each workspace's kernel starts on its first cell."""

    def __init__(
        self, api: ServerApi, env_policy: EnvPolicy | None, *, kernel_name: str, server_root: Path | None
    ) -> None:
        self.api = api
        self.kernel_name = kernel_name
        self._env_policy = env_policy or EnvPolicy()
        self._server_root = server_root
        self._deleting: set[asyncio.Task[None]] = set()

    async def start(self, ws: Workspace, *, timeout: float) -> RemoteConnection:  # noqa: ASYNC109
        assert ws.host_path is not None
        kernel = await self.start_unbound(timeout, self._server_path(ws.host_path / "work"))
        try:
            await self._bind(kernel, str(ws.host_path), timeout)
        except BaseException:
            await kernel.close()
            with contextlib.suppress(Exception):
                await asyncio.shield(self.api.delete(kernel.id))
            raise
        return kernel

    async def start_unbound(self, timeout: float, path: str | None = None) -> RemoteConnection:  # noqa: ASYNC109
        """A new kernel in ``path`` (relative to the server's root; its default cwd otherwise), answering."""
        kernel_id = await self.api.start_kernel(self.kernel_name, path)
        try:
            return await self._connect(kernel_id, timeout)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.shield(self.api.delete(kernel_id))
            raise

    async def aclose(self) -> None:
        await asyncio.gather(*self._deleting, return_exceptions=True)
        self.api.close()

    def _server_path(self, work: Path) -> str | None:
        """``work`` relative to the server's root_dir (the kernel's start cwd), when we know that root."""
        if self._server_root is None:
            return None
        try:
            return work.resolve().relative_to(self._server_root.resolve()).as_posix()
        except ValueError:
            return None

    async def _connect(self, kernel_id: str, timeout: float) -> RemoteConnection:  # noqa: ASYNC109
        session = Session(username="execspace")
        conn = await self.api.connect_channels(kernel_id, session.session)
        kernel = RemoteConnection(kernel_id, self.api, conn, session, self._deleting)
        kernel.reader = asyncio.get_running_loop().create_task(kernel.read())
        try:
            await self._wait_ready(kernel, timeout)
        except BaseException:
            await kernel.close()
            raise
        return kernel

    async def _wait_ready(self, kernel: RemoteConnection, timeout: float) -> None:  # noqa: ASYNC109
        """Ask for kernel_info until the kernel answers (the server may connect its channels lazily)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and kernel.gone is None:
            msg_id = kernel.send("kernel_info_request", {})
            if await await_reply(kernel, msg_id, min(1.0, deadline - time.monotonic())) is not None:
                await kernel.drain()
                return
        raise SetupFailed(
            "jupyter",
            f"kernel {self.kernel_name!r} on {self.api.url} did not answer within {timeout:g}s"
            + (f" ({kernel.gone})" if kernel.gone else ""),
            "see the server's log",
        )

    async def _bind(self, kernel: RemoteConnection, root: str, timeout: float) -> None:  # noqa: ASYNC109
        """Move the new kernel into the workspace after it proved it sees the workspace's files."""
        run_dir = new_run_dir(root)
        nonce_path, nonce = _write_nonce(os.path.join(root, run_dir))
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        try:
            content = await bind(kernel, os.path.join(root, "work"), env, timeout, nonce_path=nonce_path, nonce=nonce)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(nonce_path)
        if content.get("status") != "ok":
            raise self._bind_error(content, kernel.gone, root)

    def _bind_error(self, content: dict[str, Any], gone: str | None, root: str) -> SetupFailed:
        """What the failed bind cell says about the server's view of this host's workspace."""
        name, value = content.get("ename"), content.get("evalue")
        if name in ("FileNotFoundError", "_NotShared"):
            return SetupFailed(
                "jupyter",
                f"the kernels of {self.api.url} do not see this host's workspace {root} (no shared filesystem)",
                "run the server on this host, or share workspace_root with the server at the same path "
                "(see docs/jupyter-remote.md)",
            )
        if name == "PermissionError":
            return SetupFailed(
                "jupyter",
                f"the kernels of {self.api.url} may not open this host's workspace {root}: {value}",
                "run the server as the same user as execspace (workspaces are private to their owner)",
            )
        why = f"{name}: {value}" if content else gone or "no reply"
        return SetupFailed("jupyter", f"kernel {self.kernel_name!r} could not be moved into {root}: {why}")


class RemoteKernelSessions(KernelSessions):
    """Kernels on a Jupyter Server or Kernel Gateway, one per workspace: :class:`KernelSessions` with a
    :class:`RemoteLauncher`; ``execute`` raises BackendError when the server cannot be reached."""

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
        rich_outputs: RichOutputLimits | None = None,
        launcher: RemoteLauncher | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        launcher = launcher or RemoteLauncher(api, env_policy, kernel_name=kernel_name, server_root=server_root)
        super().__init__(
            fs,
            launcher,
            kernel_name=kernel_name,
            language=language,
            start_timeout=start_timeout,
            interrupt_grace=interrupt_grace,
            rich_outputs=rich_outputs,
            tracer=tracer,
            audit=audit,
        )


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
