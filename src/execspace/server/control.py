"""The control plane: E2B's REST API for creating, finding, extending and killing sandboxes.

Both route generations are served (e2b <= 2.50 creates with ``POST /sandboxes``, later ones with
``POST /v2/sandboxes``). Every other route answers 501 with a JSON error naming it, never 404/405, so an SDK call
we do not implement fails loudly at once. Errors are E2B's ``{"code": <int>, "message": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ..errors import (
    CapabilityError,
    EnvironmentBuildFailed,
    EnvironmentBuilding,
    EnvironmentNotFound,
    ExecspaceError,
    FreezeFailed,
    InvalidSpec,
    LimitExceeded,
    PathDenied,
    PolicyViolation,
)
from ..models import Snapshot
from ..protocols import SupportsFreezing
from .bodies import CONTROL_BODY_BYTES, BadBody, BodyTooLarge, json_object
from .builds import RETRY_AFTER as BUILD_RETRY_AFTER
from .controlbodies import (
    BadRequest,
    ConnectBody,
    CreateBody,
    ForkBody,
    NetworkBody,
    PauseBody,
    SnapshotBody,
    TimeoutBody,
    Timeouts,
)
from .events import Refused
from .network import SandboxEgress, sandbox_egress, sends_internet_by_default
from .options import ENVD_VERSION, ServerOptions, key_id
from .sandboxes import CreateRequest, Sandbox, Sandboxes, SandboxesFull, SandboxGone

__all__ = ["FORK_HEADER", "ControlPlane", "error_response"]

_ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
_MAX_LIST_LIMIT = 1000
#: The header of ``GET /snapshots`` answers saying how this server forks (``cow`` or ``copy``).
FORK_HEADER = "x-execspace-fork"


_FILES_ONLY_PAUSE = (
    "pausing without memory (mode='filesystem', autoPauseMemory false) is not implemented by execspace serve: "
    "a paused sandbox keeps its processes; pause with the default mode"
)
_FILES_ONLY_RESUME = (
    "resuming without memory (on_resume='reboot') is not implemented by execspace serve: connect with the default "
    "on_resume, or kill the sandbox and create one from a snapshot of its files"
)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a control-plane request: the team of its API key, and whether that key is an admin's."""

    team: str
    admin: bool = False

    def owns(self, sandbox: Sandbox) -> bool:
        return self.admin or sandbox.owner == self.team

    def owns_snapshot(self, snap: Snapshot) -> bool:
        return self.admin or _team_of(snap) == self.team


#: What a snapshot's stored name is made of: its team, then the name its team gave it (or ``:`` and a random tail
#: for an unnamed one). Names are the team's own: two teams may use the same one, and a snapshot made elsewhere
#: (``execspace ws snapshot``: no team) is an admin's only.
_TEAM_SEPARATOR = ":"
#: The longest name the snapshot store takes, and what is left of it for a team's own name.
_MAX_STORED_NAME = 128
_MAX_NAME = _MAX_STORED_NAME - len(key_id("")) - len(_TEAM_SEPARATOR)


def _stored_name(team: str, name: str | None) -> str:
    return f"{team}{_TEAM_SEPARATOR}{name if name is not None else _TEAM_SEPARATOR + secrets.token_hex(6)}"


def _team_of(snap: Snapshot) -> str | None:
    team, separator, _ = (snap.name or "").partition(_TEAM_SEPARATOR)
    return team if separator else None


def _given_name(snap: Snapshot) -> str | None:
    """The name its team gave it (None: unnamed)."""
    if _team_of(snap) is None:
        return snap.name
    given = (snap.name or "").partition(_TEAM_SEPARATOR)[2]
    return None if given.startswith(_TEAM_SEPARATOR) else given


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status, headers=headers)


def _snapshot_info(snap: Snapshot) -> dict[str, Any]:
    name = _given_name(snap)
    return {"snapshotID": snap.id, "names": [name] if name else []}


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


class ControlPlane:
    """The REST handlers over the sandbox table."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes
        self.options: ServerOptions = sandboxes.options
        self._timeouts = Timeouts(self.options.default_timeout, self.options.max_timeout)

    def routes(self) -> list[BaseRoute]:
        guard = self._authenticated
        return [
            Route("/health", self.health, methods=["GET"]),
            Route("/sandboxes", guard(self.create_v1), methods=["POST"]),
            Route("/v2/sandboxes", guard(self.create_v2), methods=["POST"]),
            Route("/sandboxes", guard(self.list_v1), methods=["GET"]),
            Route("/v2/sandboxes", guard(self.list_v2), methods=["GET"]),
            # the SDK's routes beside a sandbox's that are not built: matched before the sandbox's, which would
            # take "metrics" or "tags" for an id (404) instead of naming them (501)
            Route("/sandboxes/metrics", guard(self.not_implemented), methods=_ALL_METHODS),
            Route("/templates/tags", guard(self.not_implemented), methods=_ALL_METHODS),
            Route("/sandboxes/{sandbox_id}", guard(self.info), methods=["GET"]),
            Route("/sandboxes/{sandbox_id}", guard(self.kill), methods=["DELETE"]),
            Route("/sandboxes/{sandbox_id}/timeout", guard(self.set_timeout), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/connect", guard(self.connect_v1), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/pause", guard(self.pause), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/resume", guard(self.resume), methods=["POST"]),
            Route("/v2/sandboxes/{sandbox_id}/connect", guard(self.connect_v2), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/fork", guard(self.fork), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/snapshots", guard(self.snapshot), methods=["POST"]),
            Route("/sandboxes/{sandbox_id}/network", guard(self.update_network), methods=["PUT"]),
            Route("/snapshots", guard(self.list_snapshots), methods=["GET"]),
            Route("/templates/{template_id}", guard(self.remove_snapshot), methods=["DELETE"]),
            Route("/execspace/pool", guard(self.pool), methods=["GET"]),
            Route("/{path:path}", guard(self.not_implemented), methods=_ALL_METHODS),
        ]

    def _authenticated(
        self, handler: Callable[[Request, Caller], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def checked(request: Request) -> Response:
            caller = self._caller(request.headers.get("x-api-key", ""))
            if caller is None:
                return error_response(401, "Invalid API key: send one the server was started with (--api-key)")
            try:
                return await handler(request, caller)
            except BadRequest as exc:
                return error_response(400, str(exc))
            except BodyTooLarge as exc:
                return error_response(413, str(exc))
            except SandboxGone as exc:
                return error_response(404, f"sandbox {exc.sandbox_id!r} not found")
            except SandboxesFull as exc:
                return error_response(429, str(exc), {"Retry-After": "1"})
            except EnvironmentNotFound as exc:  # a template's environment, not built here: retrying will not help
                return error_response(500, str(exc))
            except EnvironmentBuilding as exc:  # its first build here runs: the SDK's ServiceBusyException says so
                return error_response(503, str(exc), {"Retry-After": str(BUILD_RETRY_AFTER)})
            except EnvironmentBuildFailed as exc:  # the next create builds it again
                return error_response(500, str(exc))
            except CapabilityError as exc:  # a template this backend cannot give its limits or environment
                return error_response(501, str(exc))

        return checked

    def _caller(self, key: str) -> Caller | None:
        """The caller a key makes, or None for a key this server does not take (every key is compared, in
        constant time)."""
        given = key.encode()
        admin = any([hmac.compare_digest(given, k.encode()) for k in self.options.admin_keys])
        team = any([hmac.compare_digest(given, k.encode()) for k in self.options.api_keys])
        return Caller(key_id(key), admin) if admin or team else None

    def _owned(self, sandbox_id: str, caller: Caller) -> Sandbox:
        """The caller's live sandbox of that id: another team's answers as one that does not exist."""
        sandbox = self.sandboxes.get(sandbox_id)
        if not caller.owns(sandbox):
            raise SandboxGone(sandbox_id)
        return sandbox

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def pool(self, request: Request, caller: Caller) -> Response:
        """execspace's own: the warm pool per template (``size`` configured, ``target`` within the room the live
        sandboxes leave, ``ready`` now), so that a benchmark or an operator can wait for it to be full."""
        return JSONResponse(self.sandboxes.pool.status())

    async def not_implemented(self, request: Request, caller: Caller) -> Response:
        return error_response(501, f"{request.method} {request.url.path} is not implemented by execspace serve")

    # creation and connection

    async def create_v1(self, request: Request, caller: Caller) -> Response:
        return await self._create(request, caller, v1=True)

    async def create_v2(self, request: Request, caller: Caller) -> Response:
        return await self._create(request, caller, v1=False)

    async def _create(self, request: Request, caller: Caller, *, v1: bool) -> Response:
        templates = self.options.templates
        body = CreateBody.parse(await _json_object(request), v1=v1, templates=templates, timeouts=self._timeouts)
        template = body.template
        snapshot = await self._snapshot_named(template, caller) if template not in templates else None
        if template not in templates and snapshot is None:
            raise BadRequest(f"templateID must be one of {', '.join(templates)} or a snapshot id, got {template!r}")
        if body.auto_pause and body.files_only_pause:
            return error_response(501, _FILES_ONLY_PAUSE)
        if body.auto_pause and not isinstance(self.sandboxes.engine.runner, SupportsFreezing):
            return error_response(501, f"autoPause: the {self.sandboxes.engine.name} backend cannot pause sandboxes")
        by_default = sends_internet_by_default(request.headers)
        egress = self._egress(body.allow_internet_access, body.network, caller, asked_by_default=by_default)
        if isinstance(egress, Response):
            return egress
        create = CreateRequest(
            template=template,
            timeout=body.timeout,
            metadata=dict(body.metadata),
            env_vars=dict(body.env_vars),
            secure=body.secure,
            egress=egress,
            snapshot=snapshot,
            auto_pause=body.auto_pause,
            auto_resume=body.auto_resume,
            owner=caller.team,
        )
        sandbox = await self.sandboxes.create(create)
        return JSONResponse(self._sandbox(sandbox), status_code=201)

    def _egress(
        self,
        internet: bool | None,
        network: Mapping[str, object] | None,
        caller: Caller,
        *,
        asked_by_default: bool = False,
    ) -> SandboxEgress | Response:
        """The sandbox network the request asks for, or the error response saying why it cannot have it: 400 for a
        malformed rule, 403 for a network the server's flags forbid, 501 for rules it cannot enforce."""
        engine = self.sandboxes.engine
        try:
            return sandbox_egress(internet, network, self.options, engine.describe(), asked_by_default=asked_by_default)
        except InvalidSpec as exc:
            raise BadRequest(str(exc)) from None
        except CapabilityError as exc:
            return error_response(501, str(exc))
        except PolicyViolation as exc:
            if self.sandboxes.events.listening:
                self.sandboxes.events(Refused("network", caller.team, str(exc)))
            return error_response(403, str(exc))

    async def update_network(self, request: Request, caller: Caller) -> Response:
        """E2B's network update: the egress rules of the sandbox's next commands, replaced as a whole (what the
        body leaves out is cleared); commands already running keep the network they started with."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = NetworkBody.parse(await _json_object(request))
        egress = self._egress(body.allow_internet_access, body.network, caller)
        if isinstance(egress, Response):
            return egress
        sandbox.egress = egress
        return Response(status_code=204)

    async def connect_v1(self, request: Request, caller: Caller) -> Response:
        return await self._connect(request, caller)

    async def connect_v2(self, request: Request, caller: Caller) -> Response:
        return await self._connect(request, caller)

    async def _connect(self, request: Request, caller: Caller) -> Response:
        """Connect resumes a paused sandbox (201, as E2B), else extends a running one's lifetime (200)."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = ConnectBody.parse(await _json_object(request), self._timeouts)
        if sandbox.paused is not None:
            if body.files_only:
                return error_response(501, _FILES_ONLY_RESUME)
            if await self.sandboxes.resume(sandbox, body.timeout):
                return JSONResponse(self._sandbox(sandbox), status_code=201)
        if body.timeout is not None:
            self.sandboxes.extend(sandbox, body.timeout)
        return JSONResponse(self._sandbox(sandbox), status_code=200)

    async def pause(self, request: Request, caller: Caller) -> Response:
        """E2B's pause: the sandbox's programs and kernels stopped where they are, in memory (not persisted: see
        docs/server.md), its lifetime clock stopped; 409 when it is paused already."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        if PauseBody.parse(await _json_object(request)).files_only:
            return error_response(501, _FILES_ONLY_PAUSE)
        try:
            paused = await self.sandboxes.pause(sandbox)
        except CapabilityError as exc:
            return error_response(501, str(exc))
        except FreezeFailed as exc:  # not 409: the SDK reads that as "paused already"
            return error_response(500, f"sandbox {sandbox.id!r} was not paused and runs on, its clock too: {exc}")
        if not paused:
            return error_response(409, f"sandbox {sandbox.id!r} is paused already: connect resumes it")
        return Response(status_code=204)

    async def resume(self, request: Request, caller: Caller) -> Response:
        """E2B's older resume (SDKs before connect resumed): 201, or 409 when it is running."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = ConnectBody.parse(await _json_object(request), self._timeouts)
        if not await self.sandboxes.resume(sandbox, body.timeout):
            return error_response(409, f"sandbox {sandbox.id!r} is running, not paused")
        return JSONResponse(self._sandbox(sandbox), status_code=201)

    async def fork(self, request: Request, caller: Caller) -> Response:
        """E2B's fork: ``count`` (default 1) sandboxes with the source's files, template, metadata and envs, one
        result each. Files only: the source's processes keep running (stopped while its files are copied), its
        forks start with none (execspace does not snapshot memory)."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = ForkBody.parse(await _json_object(request), self._timeouts)
        try:
            forks = await self.sandboxes.fork(sandbox, body.count, body.timeout, caller.team)
        except CapabilityError as exc:
            return error_response(501, str(exc))
        except SandboxesFull:
            raise  # 429, as for a creation
        except (LimitExceeded, PathDenied) as exc:  # its files as they are cannot be copied (a tree too deep)
            return error_response(422, f"forking sandbox {sandbox.id!r} failed: {exc}")
        except ExecspaceError as exc:
            return error_response(500, f"forking sandbox {sandbox.id!r} failed: {exc}")
        return JSONResponse([{"sandbox": self._sandbox(f)} for f in forks], status_code=201)

    async def snapshot(self, request: Request, caller: Caller) -> Response:
        """E2B's snapshot of a sandbox: its files (``memory`` is refused: processes are not snapshotted), kept
        on the server until it is removed; ``Sandbox.create(snapshotID)`` starts a sandbox from it."""
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = SnapshotBody.parse(await _json_object(request))
        if body.memory:
            return error_response(501, "memory snapshots are not implemented by execspace serve: only files")
        name = body.name
        try:
            manager = self.sandboxes.snapshots(sandbox.engine)
            if name is not None and len(_stored_name(caller.team, name)) > _MAX_STORED_NAME:
                raise BadRequest(f"snapshot name {name!r} is too long: at most {_MAX_NAME} characters here")
            if name is not None and await self._snapshot_named(name, caller) is not None:
                raise BadRequest(f"a snapshot named {name!r} exists: remove it first or pick another name")
            snap = await manager.snapshot(sandbox.workspace, _stored_name(caller.team, name))
        except CapabilityError as exc:
            return error_response(501, str(exc))
        except InvalidSpec as exc:
            raise BadRequest(str(exc)) from exc
        except (LimitExceeded, PathDenied) as exc:  # its files as they are cannot be copied (a tree too deep)
            return error_response(422, f"snapshotting sandbox {sandbox.id!r} failed: {exc}")
        except FreezeFailed as exc:
            return error_response(500, f"snapshotting sandbox {sandbox.id!r} failed: {exc}")
        return JSONResponse(_snapshot_info(snap), status_code=201)

    async def list_snapshots(self, request: Request, caller: Caller) -> Response:
        query = request.query_params
        try:
            snaps = await self._snapshots(caller)
        except CapabilityError as exc:
            return error_response(501, str(exc))
        source, name = query.get("sandboxID"), query.get("name")
        found = [
            s
            for s in snaps
            if (source is None or s.workspace == f"e2b/{source}") and (name is None or name in (s.id, _given_name(s)))
        ]
        # how this server forks (cow, copy): the e2b backend's probe for execspace serve's file snapshots
        mode = self.sandboxes.engine.describe().fork
        headers = {FORK_HEADER: mode} if mode is not None else None
        return JSONResponse([_snapshot_info(s) for s in found[: _limit(query.get("limit"))]], headers=headers)

    async def remove_snapshot(self, request: Request, caller: Caller) -> Response:
        """E2B deletes a snapshot as the template it is (``Sandbox.delete_snapshot``); templates themselves are
        fixed here. What was created or forked from the snapshot keeps working."""
        key = request.path_params["template_id"]
        snap = await self._snapshot_named(key, caller)
        if snap is None:
            return error_response(404, f"no snapshot {key!r} on this server (templates cannot be deleted)")
        await self.sandboxes.snapshots().remove_snapshot(snap)
        return Response(status_code=204)

    async def _snapshot_named(self, key: object, caller: Caller) -> Snapshot | None:
        """The caller's snapshot of that id or name (its team's name for it)."""
        if not isinstance(key, str) or not key:
            return None
        try:
            return next(s for s in await self._snapshots(caller) if key in (s.id, _given_name(s)))
        except (CapabilityError, StopIteration):
            return None

    async def _snapshots(self, caller: Caller) -> list[Snapshot]:
        return [s for s in await self.sandboxes.snapshots().list_snapshots() if caller.owns_snapshot(s)]

    # lifetime

    async def kill(self, request: Request, caller: Caller) -> Response:
        self._owned(request.path_params["sandbox_id"], caller)
        if await self.sandboxes.kill(request.path_params["sandbox_id"]):
            return Response(status_code=204)
        return error_response(404, f"sandbox {request.path_params['sandbox_id']!r} not found")

    async def set_timeout(self, request: Request, caller: Caller) -> Response:
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        body = TimeoutBody.parse(await _json_object(request), self._timeouts)
        self.sandboxes.set_timeout(sandbox, body.timeout)
        return Response(status_code=204)

    # information

    async def info(self, request: Request, caller: Caller) -> Response:
        sandbox = self._owned(request.path_params["sandbox_id"], caller)
        return JSONResponse(self._detail(sandbox, with_token=True))

    async def list_v1(self, request: Request, caller: Caller) -> Response:
        mine = [s for s in self.sandboxes if caller.owns(s)]
        found = _filtered(mine, request.query_params.get("metadata"), None, None)
        return JSONResponse([self._detail(s, with_token=False) for s in _ordered(found, descending=True)])

    async def list_v2(self, request: Request, caller: Caller) -> Response:
        query = request.query_params
        states = {s for value in query.getlist("state") for s in value.split(",") if s}
        if states - {"running", "paused"}:
            raise BadRequest(f"state must be running or paused, got {','.join(sorted(states))}")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise BadRequest(f"order must be asc or desc, got {order!r}")
        limit = _limit(query.get("limit"))
        after = _started_after(query.get("startedAfter"))
        mine = [s for s in self.sandboxes if caller.owns(s)]
        found = _filtered(mine, query.get("metadata"), query.get("template"), after)
        if states:
            found = [s for s in found if _state(s) in states]
        ordered = _ordered(found, descending=order == "desc")
        token = query.get("nextToken")
        if token:
            ordered = _after_cursor(ordered, token, descending=order == "desc")
        page, rest = ordered[:limit], ordered[limit:]
        headers = {"x-next-token": _cursor(page[-1])} if rest else None
        return JSONResponse([self._detail(s, with_token=False) for s in page], headers=headers)

    def _sandbox(self, sandbox: Sandbox) -> dict[str, Any]:
        return {
            "templateID": sandbox.template,
            "sandboxID": sandbox.id,
            "alias": sandbox.template,
            "clientID": self.options.client_id,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": sandbox.access_token,
            "trafficAccessToken": sandbox.traffic_token,
            "domain": self.options.domain,
        }

    def _detail(self, sandbox: Sandbox, *, with_token: bool) -> dict[str, Any]:
        cpus, memory, disk = self.options.resources(sandbox.template)
        detail = {
            "templateID": sandbox.template,
            "sandboxID": sandbox.id,
            "alias": sandbox.template,
            "clientID": self.options.client_id,
            "startedAt": _iso(sandbox.started_at),
            "endAt": _iso(sandbox.end_at),
            "envdVersion": ENVD_VERSION,
            "cpuCount": cpus,
            "memoryMB": memory,
            "diskSizeMB": disk,
            "state": _state(sandbox),
            "metadata": sandbox.metadata,
            "allowInternetAccess": sandbox.allow_internet_access,
            "domain": self.options.domain,
            "lifecycle": {"autoResume": sandbox.auto_resume, "onTimeout": "pause" if sandbox.auto_pause else "kill"},
        }
        if (network := sandbox.egress.info()) is not None:
            detail["network"] = network
        if with_token:
            detail["envdAccessToken"] = sandbox.access_token
        return detail


def _state(sandbox: Sandbox) -> str:
    return sandbox.state


async def _json_object(request: Request) -> dict[str, object]:
    try:
        return await json_object(request, CONTROL_BODY_BYTES)
    except BodyTooLarge:
        raise  # 413
    except BadBody as exc:
        raise BadRequest(str(exc)) from None


def _metadata_query(raw: str | None) -> dict[str, str]:
    """The SDK sends ``metadata`` as ``urlencode({quote(k): quote(v)})``: each key and value is quoted twice inside
    the (itself encoded) parameter."""
    pairs = urllib.parse.parse_qsl(raw or "", keep_blank_values=True)
    return {urllib.parse.unquote(k): urllib.parse.unquote(v) for k, v in pairs}


def _filtered(
    sandboxes: Iterable[Sandbox],
    metadata: str | None,
    template: str | None,
    started_after: datetime | None,
) -> list[Sandbox]:
    wanted = _metadata_query(metadata)
    return [
        s
        for s in sandboxes
        if all(s.metadata.get(k) == v for k, v in wanted.items())
        and (template is None or s.template == template)
        and (started_after is None or s.started_at >= started_after)
    ]


def _ordered(found: list[Sandbox], *, descending: bool) -> list[Sandbox]:
    return sorted(found, key=lambda s: (s.started_at, s.id), reverse=descending)


def _cursor(sandbox: Sandbox) -> str:
    return base64.urlsafe_b64encode(f"{sandbox.started_at.isoformat()}|{sandbox.id}".encode()).decode()


def _after_cursor(ordered: list[Sandbox], token: str, *, descending: bool) -> list[Sandbox]:
    try:
        started, _, sandbox_id = base64.urlsafe_b64decode(token.encode()).decode().partition("|")
        key = (datetime.fromisoformat(started), sandbox_id)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise BadRequest("nextToken is not one this server gave out") from None
    if descending:
        return [s for s in ordered if (s.started_at, s.id) < key]
    return [s for s in ordered if (s.started_at, s.id) > key]


def _limit(raw: str | None) -> int:
    if raw is None:
        return 100
    try:
        limit = int(raw)
    except ValueError:
        raise BadRequest(f"limit must be an integer, got {raw!r}") from None
    if not 0 < limit <= _MAX_LIST_LIMIT:
        raise BadRequest(f"limit must be between 1 and {_MAX_LIST_LIMIT}, got {limit}")
    return limit


def _started_after(raw: str | None) -> datetime | None:
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(f"startedAfter must be an ISO-8601 time, got {raw!r}") from None
    if moment.tzinfo is None:
        raise BadRequest("startedAfter must carry a time zone")
    return moment
