"""The one ASGI application: control plane, every sandbox's envd and code interpreter on a single port.

A request that names a sandbox (headers or host, see :mod:`.routing`), or carries a file-URL signature, is for the
data plane: an unknown or ended sandbox answers 502 "... was not found" (the SDK reads that as "sandbox gone"),
then the caller's credential is checked before anything else is done for it: envd's routes (port 49983) take the
sandbox's access token (``X-Access-Token``) or a file-URL signature, the code interpreter's (49999) the access
token or the sandbox's traffic token (``E2B-Traffic-Access-Token``: the SDK sends it with ``/contexts``, where it
sends no access token). Only ``/health`` goes without one, and it never resumes a paused sandbox: an anonymous
request changes no state and has no body read. Anything else is the control plane, which checks ``X-API-KEY``.

A stream (a command's output, a watch, a cell's lines) whose sandbox is killed or expires while it is answered ends
as it ends on E2B, where the sandbox's microVM dies under it: its connection drops, and the SDK, finding the sandbox
gone (``/health`` answers 502 "... was not found"), raises its "sandbox was killed" exception at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import re
from typing import Any

from connectrpc.code import Code
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .connections import abort_connection
from .control import ControlPlane, error_response
from .envd.filesystem.filesystem_connect import Filesystem, FilesystemASGIApplication
from .envd.process.process_connect import Process, ProcessASGIApplication
from .envd_fs import FilesystemService
from .envd_process import ProcessService
from .files import FilesAPI, SignatureError, signed_sandbox
from .interpreter import CodeInterpreter
from .interpreter_api import InterpreterAPI
from .routing import CODE_INTERPRETER_PORT, ENVD_PORT, Target, target_of
from .rpc import calls_on
from .sandboxes import Sandbox, Sandboxes, SandboxGone
from .shares import BODY_UNIT, SandboxShare, ShareExhausted

__all__ = ["DATA_PATHS", "E2BApp"]

_RPC_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")
#: The RPCs that stream their answer for as long as the client listens.
_SERVER_STREAMS = frozenset({"/process.Process/Start", "/process.Process/Connect", "/filesystem.Filesystem/WatchDir"})
#: The code interpreter's streamed answer.
_CELL_STREAM = "/execute"
#: envd's HTTP routes: those served (``/files``, ``/health``) answer another method with 501, as they answer the
#: others (envd's own, which the SDK does not call), naming the route.
_ENVD_ROUTES = frozenset({"/files", "/health", "/envs", "/metrics", "/init", "/files/compose"})
#: A Connect RPC's path (``/package.Service/Method``): one not served here answers Connect's ``unimplemented`` (501).
_RPC_PATH = re.compile(r"/[A-Za-z_][\w.]*\.[A-Za-z_]\w*/[A-Za-z_]\w*")


def _rpc_paths(service: str, methods: type) -> frozenset[str]:
    """The paths of a service's RPCs, from its generated protocol (``close_stdin`` is ``CloseStdin``)."""
    names = (n for n, member in vars(methods).items() if callable(member) and not n.startswith("_"))
    return frozenset(f"/{service}/{''.join(part.title() for part in name.split('_'))}" for name in names)


_RPCS = _rpc_paths("process.Process", Process) | _rpc_paths("filesystem.Filesystem", Filesystem)
#: Every path the data plane serves (the rest answer 404 or 501): what a metric names a route by.
DATA_PATHS = _RPCS | _ENVD_ROUTES | frozenset({"/execute", "/contexts"})


class E2BApp:
    """The server's ASGI callable over a sandbox table."""

    def __init__(self, sandboxes: Sandboxes, interpreter: CodeInterpreter) -> None:
        self.sandboxes = sandboxes
        self._interpreter = InterpreterAPI(interpreter, sandboxes.events)
        self._control = Router(routes=ControlPlane(sandboxes).routes())
        self._files = FilesAPI(sandboxes)
        self._process = ProcessASGIApplication(ProcessService(sandboxes), read_max_bytes=16 * 1024 * 1024)
        self._filesystem = FilesystemASGIApplication(FilesystemService(sandboxes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # lifespan: the server's owner opens and closes what it serves
        headers = Headers(scope=scope)
        target = target_of(headers, self.sandboxes.options.domain)
        signed = scope["path"] == "/files" and b"signature=" in scope.get("query_string", b"")
        if target is None and not signed:
            await self._control(scope, receive, send)
            return
        try:
            sandbox, entitled = self._sandbox(scope, headers, target, signed)
        except _Refused as refused:
            await refused.respond(scope, receive, send)
            return
        if not entitled:
            await self._data_plane(scope, receive, send, sandbox, target, entitled=False)
            return
        with sandbox.activity.request():  # counted before anything is awaited: an idle pause now waits for it
            await self._data_plane(scope, receive, send, sandbox, target, entitled=True)

    async def _data_plane(
        self, scope: Scope, receive: Receive, send: Send, sandbox: Sandbox, target: Target | None, *, entitled: bool
    ) -> None:
        try:
            await self._awake(sandbox, scope["path"], entitled)
            if entitled:
                await self._paced(sandbox, scope["path"])
                receive = _paced_body(receive, sandbox.share)
        except _Refused as refused:
            await refused.respond(scope, receive, send)
            return
        if scope["path"] in _SERVER_STREAMS or scope["path"] == _CELL_STREAM:
            send = _dropped_once_ended(scope, send, sandbox.closed)
        if target is not None and target.port == CODE_INTERPRETER_PORT:
            request = Request(scope, receive)
            await (await self._interpreter.respond(request, sandbox))(scope, receive, send)
            return
        with calls_on(sandbox):
            await self._envd(scope, receive, send, sandbox)

    def _sandbox(self, scope: Scope, headers: Headers, target: Target | None, signed: bool) -> tuple[Sandbox, bool]:
        """The sandbox of a data-plane request, once it is known to exist and the port served, and whether the
        caller proved it may act on it (an anonymous ``/health`` may only look); else raise :class:`_Refused`."""
        path: str = scope["path"]
        if target is None:  # a signed URL without headers: its signature names the sandbox
            try:
                return signed_sandbox(Request(scope), self.sandboxes.by_token()), True
            except SignatureError as exc:
                raise _Refused(path, 401, Code.UNAUTHENTICATED, str(exc)) from None
        try:
            sandbox = self.sandboxes.get(target.sandbox_id)
        except SandboxGone as exc:
            raise _Refused(path, 502, Code.UNAVAILABLE, str(exc)) from None
        if target.port not in (ENVD_PORT, CODE_INTERPRETER_PORT):
            message = (
                f"port {target.port} is not open in sandbox {sandbox.id}: only envd ({ENVD_PORT}) and the code "
                f"interpreter ({CODE_INTERPRETER_PORT}) are served"
            )
            raise _Refused(path, 502, Code.UNAVAILABLE, message)
        if sandbox.access_token is None or _holds(headers, "x-access-token", sandbox.access_token):
            return sandbox, True
        if target.port == CODE_INTERPRETER_PORT and _holds(headers, "e2b-traffic-access-token", sandbox.traffic_token):
            return sandbox, True
        if path == "/health":
            return sandbox, False
        if signed and target.port == ENVD_PORT:
            try:
                return signed_sandbox(Request(scope), [sandbox]), True
            except SignatureError as exc:
                raise _Refused(path, 401, Code.UNAUTHENTICATED, str(exc)) from None
        if target.port == CODE_INTERPRETER_PORT:
            message = (
                "missing or wrong E2B-Traffic-Access-Token (or X-Access-Token): send the trafficAccessToken (or "
                "envdAccessToken) that create/connect returned"
            )
        else:
            message = "missing or wrong X-Access-Token: send the envdAccessToken that create/connect returned"
        raise _Refused(path, 401, Code.UNAUTHENTICATED, message)

    async def _awake(self, sandbox: Sandbox, path: str, entitled: bool) -> None:
        """A paused sandbox is resumed by its traffic when it was created with ``autoResume``, or paused by the
        server for its idleness (being so included: the request waits for that pause), and the caller is entitled
        to it, else refused as E2B's proxy refuses it: 502 "... was not found" (the SDK's
        ``SandboxNotRunningException``)."""
        if entitled and sandbox.idle_paused:
            await self.sandboxes.wake(sandbox)
        if sandbox.paused is None:
            return
        if not (sandbox.auto_resume and entitled):
            message = f"The sandbox {sandbox.id} was not found running: it is paused; Sandbox.connect resumes it"
            raise _Refused(path, 502, Code.UNAVAILABLE, message)
        await self.sandboxes.resume(sandbox)

    async def _paced(self, sandbox: Sandbox, path: str) -> None:
        """Wait for the request's turn in its sandbox's pace (:meth:`.SandboxShare.pace`)."""
        try:
            await sandbox.share.pace()
        except ShareExhausted as exc:
            raise _Refused(path, 429, Code.RESOURCE_EXHAUSTED, str(exc)) from None

    async def _envd(self, scope: Scope, receive: Receive, send: Send, sandbox: Sandbox) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        served = method == "POST" and path in _RPCS
        if served and path in _SERVER_STREAMS:
            service = self._process if path.startswith("/process.") else self._filesystem
            await _until_disconnected(service, scope, receive, send)
        elif served:
            await (self._process if path.startswith("/process.") else self._filesystem)(scope, receive, send)
        elif path == "/health" and method == "GET":
            await Response(status_code=204)(scope, receive, send)
        elif path == "/files" and method == "GET":
            await (await self._files.download(Request(scope, receive), sandbox))(scope, receive, send)
        elif path == "/files" and method == "POST":
            await (await self._files.upload(Request(scope, receive), sandbox))(scope, receive, send)
        elif _RPC_PATH.fullmatch(path):
            message = f"{method} {path} is not implemented by execspace serve"
            body = {"code": Code.UNIMPLEMENTED.value, "message": message}
            await JSONResponse(body, status_code=501)(scope, receive, send)
        elif path in _ENVD_ROUTES:
            await error_response(501, f"{method} {path} is not implemented by execspace serve")(scope, receive, send)
        else:
            await error_response(404, f"{method} {path} is not an envd route")(scope, receive, send)


async def _until_disconnected(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    """Run ``app`` until it is done or its client is gone, whichever comes first. A Connect stream (a command's
    output, a watch) notices a client that left only when it next has something to send, which can be a keepalive
    half a minute away; until then it would hold its sandbox's share of streams and the program's reader."""
    gone = asyncio.Event()

    async def watched() -> Message:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
        return message

    serving = asyncio.ensure_future(app(scope, watched, send))
    left = asyncio.ensure_future(gone.wait())
    try:
        await asyncio.wait({serving, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        if not serving.done():  # the client left (or this request is cancelled): nobody is left to tell
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await serving
    if not gone.is_set():
        serving.result()


def _dropped_once_ended(scope: Scope, send: Send, ended: asyncio.Event) -> Send:
    """``send``, until ``ended`` (the sandbox's end): from then on the connection is dropped instead of anything
    sent (the end of a command killed with its sandbox, a watch's or a cell's last lines).

    Over HTTP/1.1 each SDK line knows a vanished peer by another sign (over HTTP/2 both see a reset stream): the
    connectrpc clients (e2b 2.3x on, their ``User-Agent`` is ``connectrpc/...``) by a reset connection, and take a
    body that ended early for an answer of the sandbox; e2b 2.29's own Connect client (over httpcore) and the code
    interpreter's httpx by a body that ended early (a FIN). Each is given its own."""
    reset = Headers(scope=scope).get("user-agent", "").startswith("connectrpc/")

    async def guarded(message: Message) -> None:
        if ended.is_set():
            await abort_connection(scope, reset=reset)
            return
        await send(message)

    return guarded


def _paced_body(receive: Receive, share: SandboxShare) -> Receive:
    """``receive``, each piece of the body taken in its sandbox's pace (a body that comes faster waits: its bytes
    stay in the socket's buffers, and the sender is held back by TCP)."""

    async def paced() -> Message:
        message = await receive()
        if message["type"] == "http.request" and message.get("body"):
            await share.pace(len(message["body"]) / BODY_UNIT, queued=False)
        return message

    return paced


def _holds(headers: Headers, name: str, secret: str | None) -> bool:
    """Whether the header ``name`` carries ``secret`` (compared in constant time)."""
    given = headers.get(name)
    return secret is not None and given is not None and hmac.compare_digest(given.encode(), secret.encode())


class _Refused(Exception):
    """A data-plane request answered with an error, in the caller's protocol: Connect's JSON for RPCs, E2B's
    ``{"code","message"}`` otherwise."""

    def __init__(self, path: str, status: int, code: Code, message: str) -> None:
        super().__init__(message)
        self.path, self.status, self.code, self.message = path, status, code, message

    async def respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        response: Response
        if self.path.startswith(_RPC_PREFIXES):
            body: dict[str, Any] = {"code": self.code.value, "message": self.message}
            response = JSONResponse(body, status_code=self.status)
        else:
            response = error_response(self.status, self.message)
        await response(scope, receive, send)
