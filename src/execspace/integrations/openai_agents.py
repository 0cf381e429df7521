"""OpenAI Agents SDK: a sandbox client whose sessions are execspace workspaces.

::

    async with execspace.open_engine("sandbox") as engine:
        client = ExecspaceSandboxClient(engine)
        run_config = RunConfig(sandbox=SandboxRunConfig(client=client, options=ExecspaceSandboxClientOptions()))
        result = await Runner.run(SandboxAgent(name="dev", model=...), "tidy the CSV", run_config=run_config)

A session is one workspace of the engine: the SDK's manifest root is the workspace's ``work/`` directory as
programs see it (``/workspace/work`` on the sandbox backend), ``exec`` is a program run there with
the engine's policy and a timeout, ``read``/``write`` go through the engine's confined file API, and
``persist_workspace``/``hydrate_workspace`` are a tar stream made and unpacked by ``tar`` *inside* the workspace's
boundary. On the sandbox backend every command the agent runs is in bubblewrap + seccomp, where the SDK's own
UnixLocal client runs it on the host as you.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import io
import json
import posixpath
import tarfile
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from ..errors import CapabilityError, InvalidSpec, PathDenied, UsageError, WorkspaceNotFound
from ..models import DEFAULT_TIMEOUT, PtySize, PutFile, ResourceLimits, RunProgramSpec, Workspace
from ..protocols import Engine, ProgramHandle
from ..tools import Tool
from . import MissingExtra

try:
    from agents import FunctionTool
    from agents.sandbox import Manifest
    from agents.sandbox.errors import (
        ExecTimeoutError,
        WorkspaceArchiveReadError,
        WorkspaceArchiveWriteError,
        WorkspaceReadNotFoundError,
    )
    from agents.sandbox.session import (
        BaseSandboxClient,
        BaseSandboxClientOptions,
        BaseSandboxSession,
        Dependencies,
        Instrumentation,
        SandboxSession,
        SandboxSessionState,
    )
    from agents.sandbox.session.pty_output import collect_pty_output
    from agents.sandbox.session.pty_types import (
        PtyExecUpdate,
        allocate_pty_process_id,
        clamp_pty_yield_time_ms,
        resolve_pty_write_yield_time_ms,
    )
    from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
    from agents.sandbox.types import ExecResult, User
    from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile
    from agents.tool_context import ToolContext
except ImportError as exc:  # pragma: no cover - the extra is installed where the tests run
    raise MissingExtra("openai-agents", "the OpenAI Agents SDK (openai-agents, with agents.sandbox)", exc) from exc

__all__ = [
    "ExecspaceSandboxClient",
    "ExecspaceSandboxClientOptions",
    "ExecspaceSandboxSession",
    "ExecspaceSandboxSessionState",
    "function_tools",
]

BACKEND_ID = "execspace"
#: The workspace directory that is the SDK's manifest root: the programs' working directory, writable under
#: every backend's policy (the workspace root itself is read-only to programs in the sandbox).
_AGENT_DIR = "work"
_DEFAULT_ROOT = Manifest.model_fields["root"].default
#: Largest workspace archive ``persist_workspace`` makes (it is held in memory, as the SDK's own clients do).
DEFAULT_MAX_ARCHIVE_BYTES = 256 * 1024 * 1024


class ExecspaceSandboxClientOptions(BaseSandboxClientOptions):
    """Options of a new session: which workspace, and the policy of its commands."""

    type: Literal["execspace"] = "execspace"
    workspace_id: str | None = None
    """The execspace workspace id (``app/user/session``); a fresh ``openai-agents/<uuid>`` when None. A session
    created with the id of a live workspace works in that workspace."""
    exec_timeout: float | None = DEFAULT_TIMEOUT
    """Deadline of a command the SDK runs without one (None: none; the backend must still enforce it)."""
    network: Literal["off", "on"] | None = None
    """Network of the session's commands; None keeps the engine's default."""
    max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES


class ExecspaceSandboxSessionState(SandboxSessionState):
    """What ``resume`` needs: the workspace id and the session's command policy."""

    type: Literal["execspace"] = "execspace"
    workspace_id: str
    exec_timeout: float | None = DEFAULT_TIMEOUT
    network: Literal["off", "on"] | None = None
    max_archive_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES


@dataclass
class _PtyProcess:
    """A program started for the SDK's interactive exec: its output gathered as it comes, for ``collect``."""

    handle: ProgramHandle
    chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    notify: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    pump: asyncio.Task[None] | None = None


class ExecspaceSandboxSession(BaseSandboxSession):
    """One execspace workspace as an Agents SDK sandbox session."""

    state: ExecspaceSandboxSessionState

    def __init__(self, engine: Engine, state: ExecspaceSandboxSessionState) -> None:
        self.state = state
        self._engine = engine
        self._ws: Workspace | None = None
        self._pty: dict[int, _PtyProcess] = {}

    @property
    def workspace(self) -> Workspace:
        """The workspace this session works in (after ``start``)."""
        if self._ws is None:
            raise UsageError("the session has not started: enter it with `async with session:` first")
        return self._ws

    # -- lifecycle ----------------------------------------------------------------------

    async def _ensure_backend_started(self) -> None:
        try:
            ws = await self._engine.manager.get_workspace(self.state.workspace_id)
            preserved = True
        except WorkspaceNotFound:
            ws = await self._engine.manager.create_workspace(self.state.workspace_id)
            preserved = False
        _check_root(self.state.manifest, ws)
        self._ws = ws
        self._set_start_state_preserved(preserved)

    async def running(self) -> bool:
        return self._ws is not None

    async def _after_shutdown(self) -> None:
        self._ws = None

    def _prepare_exec_command(
        self, *command: str | Path, shell: bool | list[str], user: str | User | None
    ) -> list[str]:
        self._refuse_user(user)
        # plain sh: a login shell (the SDK's default, sh -lc) would read the host's /etc/profile inside the sandbox
        return super()._prepare_exec_command(*command, shell=["sh", "-c"] if shell is True else shell, user=None)

    # -- commands -----------------------------------------------------------------------

    async def _spec(self, command: Sequence[str | Path], deadline: float | None = None) -> RunProgramSpec:
        argv = [str(c) for c in command]
        return RunProgramSpec(
            argv[0],
            argv[1:],
            env=await self.state.manifest.environment.resolve(),
            cwd=_AGENT_DIR,
            timeout=deadline if deadline is not None else self.state.exec_timeout,
            network=self.state.network,
        )

    async def _exec_internal(
        self,
        *command: str | Path,
        timeout: float | None = None,  # noqa: ASYNC109 - the SDK's signature; a deadline for the program
    ) -> ExecResult:
        spec = await self._spec(command, timeout)
        result = await self._engine.runner.run_program(self.workspace, spec)
        if result.timed_out:
            raise ExecTimeoutError(command=command, timeout_s=spec.timeout)
        return ExecResult(stdout=result.raw_stdout, stderr=result.raw_stderr, exit_code=result.exit_code)

    # -- files --------------------------------------------------------------------------

    def _relative(self, path: Path | str, *, for_write: bool = False) -> str:
        """The workspace-relative path the engine's file API takes; the SDK's own check refuses escapes first."""
        absolute = PurePosixPath(self.normalize_path(path, for_write=for_write).as_posix())
        if not absolute.is_relative_to(self.workspace.path):  # a path grant out of the workspace
            raise PathDenied(str(path), f"outside the workspace {self.workspace.path}: this client serves only it")
        return absolute.relative_to(self.workspace.path).as_posix()

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._refuse_user(user)
        rel = self._relative(path)
        try:
            file = await self._engine.fs.read_file(self.workspace, rel)
        except FileNotFoundError as exc:
            raise WorkspaceReadNotFoundError(path=path, cause=exc) from exc
        return io.BytesIO(file.content)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._refuse_user(user)
        payload = data.read()
        content = payload.encode() if isinstance(payload, str) else bytes(payload)
        await self._engine.fs.put_files(self.workspace, [PutFile(self._relative(path, for_write=True), content)])

    def _refuse_user(self, user: str | User | None) -> None:
        if user:
            raise CapabilityError(
                "acting as another user",
                self._engine.name,
                "Leave SandboxAgent.run_as (and user=) unset: everything runs as the workspace's one user.",
            )

    async def _remove_workspace_entry_on_resume(self, path: Path) -> None:
        await self._engine.fs.remove(self.workspace, self._relative(path, for_write=True))

    async def persist_workspace(self) -> io.IOBase:
        """The agent's directory as a tar stream of ``./``-relative members, made by ``tar`` inside the workspace's
        boundary (so that no host-side walk follows what the agent linked)."""
        excludes = [f"--exclude=./{p.as_posix()}" for p in sorted(self._persist_workspace_skip_relpaths())]
        command = ("tar", "-C", self.state.manifest.root, "--anchored", *excludes, "-cf", "-", ".")
        spec = replace(await self._spec(command), limits=ResourceLimits(output_bytes=self.state.max_archive_bytes))
        result = await self._engine.runner.run_program(self.workspace, spec)
        root = Path(self.state.manifest.root)
        if result.stdout_truncated:
            reason = f"the archive is larger than max_archive_bytes ({self.state.max_archive_bytes})"
            raise WorkspaceArchiveReadError(path=root, context={"reason": reason})
        if not result.ok:
            raise WorkspaceArchiveReadError(path=root, context={"reason": "tar failed", "stderr": result.stderr})
        return io.BytesIO(result.raw_stdout)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpack a tar stream into the workspace, inside its boundary, once the SDK's own check passed on it
        (no absolute or climbing member, no link out of the workspace)."""
        payload = data.read()
        archive = payload.encode() if isinstance(payload, str) else bytes(payload)
        root = Path(self.state.manifest.root)
        try:
            with tarfile.open(fileobj=io.BytesIO(archive), mode="r:*") as tar:
                validate_tarfile(tar, allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            context = {"reason": exc.reason, "member": exc.member}
            raise WorkspaceArchiveWriteError(path=root, context=context, cause=exc) from exc
        except tarfile.TarError as exc:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "not a tar archive"}, cause=exc) from exc
        command = ("tar", "-C", self.state.manifest.root, "--no-same-owner", "-xf", "-")
        spec = replace(await self._spec(command), stdin=archive)
        result = await self._engine.runner.run_program(self.workspace, spec)
        if not result.ok:
            raise WorkspaceArchiveWriteError(path=root, context={"reason": "tar failed", "stderr": result.stderr})

    # -- interactive programs -------------------------------------------------------------

    def supports_pty(self) -> bool:
        return self._engine.describe().streaming

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,  # noqa: ASYNC109 - the SDK's signature; a deadline for the program
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        argv = self._prepare_exec_command(*command, shell=shell, user=user)
        # the program lives on between calls (write_stdin), within the same deadline as any command
        spec = replace(await self._spec(argv, timeout), pty=PtySize() if tty else None)
        handle = await self._engine.runner.start_program(self.workspace, spec)
        entry = _PtyProcess(handle)
        entry.pump = asyncio.create_task(_pump(entry))
        process_id = allocate_pty_process_id(set(self._pty))
        self._pty[process_id] = entry
        yield_ms = clamp_pty_yield_time_ms(10_000 if yield_time_s is None else int(yield_time_s * 1000))
        return await self._collect(process_id, entry, yield_ms, max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        entry = self._resolve_pty_session_entry(pty_processes=self._pty, session_id=session_id)
        if chars and not entry.done.is_set():
            await entry.handle.write_stdin(chars)
        yield_ms = resolve_pty_write_yield_time_ms(
            yield_time_ms=250 if yield_time_s is None else int(yield_time_s * 1000), input_empty=chars == ""
        )
        return await self._collect(session_id, entry, yield_ms, max_output_tokens)

    async def _collect(
        self, process_id: int, entry: _PtyProcess, yield_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.chunks,
            output_lock=entry.lock,
            output_notify=entry.notify,
            is_done=entry.done.is_set,
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
        )
        if not closed:
            return PtyExecUpdate(process_id=process_id, output=output, exit_code=None, original_token_count=tokens)
        self._pty.pop(process_id, None)
        return PtyExecUpdate(process_id=None, output=output, exit_code=entry.exit_code, original_token_count=tokens)

    async def pty_terminate_all(self) -> None:
        entries, self._pty = list(self._pty.values()), {}
        for entry in entries:
            await entry.handle.kill()
            if entry.pump is not None:
                with contextlib.suppress(Exception):
                    await entry.pump


async def _pump(entry: _PtyProcess) -> None:
    try:
        async for chunk in entry.handle.stream():
            async with entry.lock:
                entry.chunks.append(chunk.data)
            entry.notify.set()
        entry.exit_code = (await entry.handle.wait()).exit_code
    finally:
        entry.done.set()
        entry.notify.set()


def _agent_root(ws: Workspace) -> str:
    return posixpath.join(ws.path, _AGENT_DIR)


def _check_root(manifest: Manifest, ws: Workspace) -> None:
    if PurePosixPath(manifest.root) != PurePosixPath(_agent_root(ws)):
        raise InvalidSpec(
            f"the manifest's root is {manifest.root!r}, but this workspace's agent directory is "
            f"{_agent_root(ws)!r} on the {ws.backend!r} backend: leave Manifest.root at its default "
            f"({_DEFAULT_ROOT!r}) or set it to {_agent_root(ws)!r}"
        )


class ExecspaceSandboxClient(BaseSandboxClient[ExecspaceSandboxClientOptions | None]):
    """Creates, resumes and deletes sessions on one execspace Engine (opened and closed by the caller)."""

    backend_id = BACKEND_ID
    supports_default_options = True

    def __init__(
        self,
        engine: Engine,
        *,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self.engine = engine
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: ExecspaceSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or ExecspaceSandboxClientOptions()
        manifest = self._validate_manifest_for_create(manifest or Manifest())
        workspace_id = options.workspace_id or f"openai-agents/{uuid.uuid4()}"
        manifest = await self._place(manifest, workspace_id)
        session_id = uuid.uuid4()
        state = ExecspaceSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            workspace_id=workspace_id,
            exec_timeout=options.exec_timeout,
            network=options.network,
            max_archive_bytes=options.max_archive_bytes,
        )
        return self._wrap_session(ExecspaceSandboxSession(self.engine, state), instrumentation=self._instrumentation)

    async def _place(self, manifest: Manifest, workspace_id: str) -> Manifest:
        """Create (or reuse) the workspace and root the manifest in its agent directory; a manifest that cannot
        be rooted there leaves no new workspace behind."""
        manager = self.engine.manager
        try:
            await manager.get_workspace(workspace_id)
            existed = True
        except WorkspaceNotFound:
            existed = False
        ws = await manager.create_workspace(workspace_id)
        if manifest.root == _DEFAULT_ROOT:
            manifest = manifest.model_copy(update={"root": _agent_root(ws)}, deep=True)
        try:
            _check_root(manifest, ws)
        except InvalidSpec:
            if not existed:
                await manager.cleanup(ws)
            raise
        return manifest

    async def delete(self, session: SandboxSession) -> SandboxSession:
        """Remove the session's workspace and everything running in it."""
        state = session.state
        if not isinstance(state, ExecspaceSandboxSessionState):
            raise InvalidSpec("ExecspaceSandboxClient.delete takes a session this client created or resumed")
        with contextlib.suppress(WorkspaceNotFound):
            await self.engine.manager.cleanup(await self.engine.manager.get_workspace(state.workspace_id))
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """A session on the state's workspace when it still exists; else on a new one of the same id, which
        ``start`` fills from the state's snapshot."""
        if not isinstance(state, ExecspaceSandboxSessionState):
            raise InvalidSpec("ExecspaceSandboxClient.resume takes an ExecspaceSandboxSessionState")
        state.assert_path_grants_rebound()
        return self._wrap_session(ExecspaceSandboxSession(self.engine, state), instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, ExecspaceSandboxSessionState)


def function_tools(tools: Sequence[Tool]) -> list[FunctionTool]:
    """execspace's tools as the SDK's function tools, for a plain ``Agent`` (no sandbox session): e.g.
    ``function_tools(WorkspaceExecTool(engine, workspace_id="chat-1").tools())`` or an ``ExecuteCodeTool``. Their
    results are the tools' JSON text; mistakes come back as error results, never as exceptions."""
    return [_function_tool(tool) for tool in tools]


def _function_tool(tool: Tool) -> FunctionTool:
    async def invoke(_context: ToolContext[Any], arguments: str) -> str:
        return json.dumps(await tool.call(arguments))

    spec = tool.spec
    return FunctionTool(
        name=spec.name,
        description=spec.description,
        params_json_schema=spec.json_schema(),
        on_invoke_tool=invoke,
        strict_json_schema=False,  # the tools check their own arguments, with messages a model can act on
    )
