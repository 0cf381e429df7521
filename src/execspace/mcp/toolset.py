"""The tools the MCP server offers, over the tools floor, each reaching a workspace by its handle or by session.

Every tool that works in a workspace takes ``workspace_id``, the handle ``workspace_create`` returns. A client of
a 2025 revision may leave it out: the call goes to its MCP session's default workspace (:mod:`.workspaces`). A
client of the stateless 2026-07-28 revision has no session, so there the handle is required (its schema says so)
and must name a workspace that exists. Every result names the workspace it ran in. Background sessions
(``workspace_poll``, ``workspace_write_stdin``, ``workspace_kill``) are found by their own ``session_id``. Results
are the tools' JSON, as text and as structured content (``outputSchema`` on the tools that return data); images a
call produced come back as MCP image content too.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..artifacts import ArtifactService
from ..errors import ExecspaceError, InvalidSpec, UsageError
from ..executor import CodeExecutor
from ..models import Workspace
from ..protocols import Engine
from ..tools import (
    CommandPolicy,
    ExecuteCodeTool,
    SkillLibrary,
    SkillListTool,
    SkillRunTool,
    Tool,
    ToolSpec,
    WorkspaceExecTool,
    WorkspaceIO,
    check_arguments,
    error_result,
)
from .calls import Caller
from .config import McpConfig
from .content import render
from .files import FileTools
from .observe import CallListener, ToolCall
from .outputs import output_schema
from .paths import BASE_RULE, in_workspace
from .workspaces import Workspaces

__all__ = ["McpTools"]

Handler = Callable[[Workspace | None, Mapping[str, Any]], Awaitable[dict[str, Any]]]
InWorkspace = Callable[[Workspace, Mapping[str, Any]], Awaitable[dict[str, Any]]]
Plain = Callable[[Mapping[str, Any]], Awaitable[dict[str, Any]]]

_WORKSPACE_ID = {
    "type": "string",
    "minLength": 1,
    "maxLength": 194,
    "description": "The workspace to use (from workspace_create or an earlier result). Omit it to use this "
    "session's default workspace. Give it whenever you know it: sessions may be reset between calls.",
}
_HANDLE = {
    **_WORKSPACE_ID,
    "description": "The workspace to use: the workspace_id workspace_create returned (or an earlier result named). "
    "Required: this connection has no session, so the handle is what keeps your files between calls.",
}
_LANGUAGES = ("python", "bash", "javascript")


@dataclass(frozen=True, slots=True)
class _Entry:
    spec: ToolSpec
    handler: Handler
    in_workspace: bool


class McpTools:
    """The server's tool set on one engine: specs to list and a ``call`` that never raises for a model's mistake."""

    def __init__(
        self,
        engine: Engine,
        config: McpConfig,
        workspaces: Workspaces,
        artifacts: ArtifactService,
        listeners: Sequence[CallListener] = (),
        key_id: str | None = None,
    ) -> None:
        """``listeners``: told of each call before its result goes back (:mod:`.observe`); ``key_id``: the caller's
        name in what they record (the bearer token's, over HTTP)."""
        self.engine = engine
        self._listeners = tuple(listeners)
        self._key_id = key_id
        self.config = config
        self.workspaces = workspaces
        self.artifacts = artifacts
        self._current: contextvars.ContextVar[Workspace] = contextvars.ContextVar("workspace")
        policy = config.policy
        checker = CommandPolicy(allow=policy.allow_commands) if policy.allow_commands is not None else None
        self.exec = WorkspaceExecTool(
            engine,
            resolver=self._workspace_of_call,
            policy=checker,
            default_timeout=policy.timeout,
            max_timeout=policy.max_timeout,
            limits=policy.limits(),
        )
        self.executor = CodeExecutor(engine, timeout=policy.timeout, limits=policy.limits())
        offered = [name for name in _LANGUAGES if name in engine.describe().languages]
        self.run_code = ExecuteCodeTool(self.executor, languages=offered or None, name="run_code")
        self.files = FileTools(engine, max_file_bytes=config.max_file_bytes, upload_roots=config.upload_roots)
        self.skills = SkillLibrary(config.skill_roots) if config.skill_roots else None
        self._entries = {e.spec.name: e for e in self._build()}

    async def _workspace_of_call(self) -> Workspace:
        return self._current.get()

    # -- the tool list ---------------------------------------------------------------------

    def _build(self) -> list[_Entry]:
        files = self.files
        entries = [
            _plain(_CREATE, self._create),
            _plain(_LIST, self._list),
            _plain(_CLOSE, self._close),
            _Entry(_in_workspace(self.exec.spec), _calling(self.exec), True),
            *(_Entry(t.spec, _calling(t), False) for t in self.exec.session_tools),
            _Entry(_in_workspace(self.run_code.spec), self._run_code, True),
        ]
        handlers = {
            "write_file": files.write_file,
            "read_file": files.read_file,
            "list_files": files.list_files,
            "remove_file": files.remove_file,
            "upload_file": files.upload_file,
        }
        entries.extend(_in(spec, handlers[spec.name]) for spec in files.specs())
        entries.append(_in(_SAVE_ARTIFACT, self._save_artifact))
        if self.skills is not None:
            entries.extend(self._skill_tools(self.skills))
        return entries

    def _skill_tools(self, library: SkillLibrary) -> list[_Entry]:
        listing = SkillListTool(library)

        max_timeout = self.config.policy.max_timeout

        async def run(ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
            assert ws is not None
            return await SkillRunTool(library, self.engine, ws, max_timeout=max_timeout).call(args)

        # the spec names the library's skills, not the workspace: any workspace handle gives it
        spec = SkillRunTool(library, self.engine, _NO_WORKSPACE, max_timeout=max_timeout).spec
        return [_Entry(listing.spec, _calling(listing), False), _Entry(_in_workspace(spec), run, True)]

    def names(self) -> list[str]:
        return list(self._entries)

    def list(self, caller: Caller) -> list[dict[str, Any]]:
        """The tools as ``tools/list`` gives them to ``caller`` (a stateless one must name its workspace)."""
        return [self._listed(e, caller.stateless) for e in self._entries.values()]

    @staticmethod
    def _listed(entry: _Entry, stateless: bool) -> dict[str, Any]:
        schema = entry.spec.json_schema()
        if entry.in_workspace and stateless:
            schema["properties"] = {**schema["properties"], "workspace_id": _HANDLE}
            schema["required"] = [*schema.get("required", ()), "workspace_id"]
        tool = {"name": entry.spec.name, "description": entry.spec.description, "inputSchema": schema}
        output = output_schema(entry.spec.name)
        return tool if output is None else {**tool, "outputSchema": output}

    # -- calls -----------------------------------------------------------------------------

    async def call(self, name: str, arguments: Mapping[str, Any] | None, caller: Caller) -> dict[str, Any]:
        """Run tool ``name`` for ``caller``: its ``CallToolResult`` (wire form); every mistake is an error result
        the model reads."""
        args = dict(arguments or {})
        given = dict(args)
        started = time.monotonic()
        entry = self._entries.get(name)
        ws: Workspace | None = None
        try:
            if entry is None:
                raise UsageError(f"no tool named {name!r}; known: {', '.join(self._entries)}")
            if entry.in_workspace:
                workspace_id = args.pop("workspace_id", None)
                if workspace_id is not None and not isinstance(workspace_id, str):
                    raise InvalidSpec("workspace_id must be a string")
                ws = await self.workspaces.resolve(workspace_id, caller.session)
            result = await self._run(entry, ws, args)
        except FileNotFoundError as exc:
            result = error_result(exc, hint=f"no such file or directory ({BASE_RULE}): list_files shows what is there")
        except (ExecspaceError, OSError) as exc:
            result = error_result(exc)
        if ws is not None:
            result["workspace_id"] = ws.id
        if self._listeners:
            self._tell(name, given, result, time.monotonic() - started)
        return await render(self.engine, ws, result, max_image_bytes=self.config.max_file_bytes)

    def _tell(self, name: str, args: Mapping[str, Any], result: Mapping[str, Any], duration: float) -> None:
        workspace = result.get("workspace_id") or args.get("workspace_id")
        known = name if name in self._entries else "unknown"  # a client's made-up name is no label of its own
        call = ToolCall(known, workspace if isinstance(workspace, str) else None, args, result, duration, self._key_id)
        for listener in self._listeners:
            listener(call)

    async def _run(self, entry: _Entry, ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
        if ws is None:
            return await entry.handler(None, args)
        token = self._current.set(ws)
        try:
            with self.workspaces.in_use(ws):
                return await entry.handler(ws, args)
        finally:
            self._current.reset(token)

    # -- handlers of the server's own tools --------------------------------------------------

    async def _create(self, args: Mapping[str, Any]) -> dict[str, Any]:
        created, new = await self.workspaces.create(args.get("workspace_id"))
        return {"status": "ok", "workspace_id": created.id, "created": new}

    async def _list(self, args: Mapping[str, Any]) -> dict[str, Any]:
        isolation = self.engine.describe().isolation
        return {
            "status": "ok",
            "backend": self.engine.name,
            "isolation": isolation,
            "workspaces": self.workspaces.listing(),
        }

    async def _close(self, args: Mapping[str, Any]) -> dict[str, Any]:
        await self.workspaces.close(args["workspace_id"])
        return {"status": "ok", "closed": args["workspace_id"]}

    async def _run_code(self, ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
        assert ws is not None
        return await self.run_code.call(args, execution_id=ws.id)

    async def _save_artifact(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        path = in_workspace(ws, args["path"])
        ref = await WorkspaceIO(self.engine, ws, artifacts=self.artifacts).save_artifact(path)
        return {"status": "ok", "artifact": ref}

    async def aclose(self) -> None:
        await self.exec.aclose()


def _in_workspace(spec: ToolSpec) -> ToolSpec:
    """``spec`` with the optional ``workspace_id`` argument."""
    params = spec.json_schema()
    params["properties"] = {**params.get("properties", {}), "workspace_id": _WORKSPACE_ID}
    return ToolSpec(spec.name, spec.description, params)


def _calling(tool: Tool) -> Handler:
    async def handler(ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
        return await tool.call(args)

    return handler


def _in(spec: ToolSpec, fn: InWorkspace) -> _Entry:
    """A tool of the server's own working in a workspace, its arguments checked against ``spec``."""

    async def handler(ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
        assert ws is not None
        return await fn(ws, check_arguments(spec.parameters, args))

    return _Entry(_in_workspace(spec), handler, True)


def _plain(spec: ToolSpec, fn: Plain) -> _Entry:
    async def handler(ws: Workspace | None, args: Mapping[str, Any]) -> dict[str, Any]:
        return await fn(check_arguments(spec.parameters, args))

    return _Entry(spec, handler, False)


_NO_WORKSPACE = Workspace("-", "/", "-")
_ID_ARG = {**_WORKSPACE_ID, "description": "The workspace's id."}
_CREATE = ToolSpec(
    "workspace_create",
    "Create a workspace (or get an existing one by its id) and return its workspace_id. A workspace is a "
    "directory with work/ (inputs in work/inputs/) and out/ (results); files and installed packages persist "
    "between calls until workspace_close or until it has been idle too long. Pass the workspace_id to the other "
    "tools.",
    {
        "type": "object",
        "properties": {
            "workspace_id": {
                **_WORKSPACE_ID,
                "description": "An id of your choice (letters, digits, . _ - and up to two '/'); default: a new one.",
            }
        },
        "additionalProperties": False,
    },
)
_LIST = ToolSpec(
    "workspace_list",
    "List this server's workspaces (their ids and how long each has been idle) and the backend they run on.",
    {"type": "object", "properties": {}, "additionalProperties": False},
)
_CLOSE = ToolSpec(
    "workspace_close",
    "Close a workspace: stop its programs and delete it with all its files.",
    {
        "type": "object",
        "properties": {"workspace_id": _ID_ARG},
        "required": ["workspace_id"],
        "additionalProperties": False,
    },
)
_SAVE_ARTIFACT = ToolSpec(
    "save_artifact",
    "Save a workspace file (relative to work/, e.g. ../out/report.csv) as the next version of the artifact named "
    "by its workspace path (out/report.csv); returns its artifact:// reference.",
    {
        "type": "object",
        "properties": {"path": {"type": "string", "minLength": 1, "description": "The file, e.g. ../out/report.csv."}},
        "required": ["path"],
        "additionalProperties": False,
    },
)
