"""The ``workspace_exec`` tool: the model runs shell commands in its workspace.

Four tools share one instance (and its sessions):

* ``workspace_exec``: run a command; foreground (wait for the result) or ``background``
  (return a ``session_id`` at once);
* ``workspace_poll``, ``workspace_write_stdin``, ``workspace_kill``: read new output of,
  feed, or stop a background session.

Separate tools rather than one tool with an ``action`` argument: each has only the
arguments that make sense for it, all of them meaningful, so the schema itself tells the
model what to send (no "session_id is required only when action is poll" rules that JSON
schema cannot express to every provider), and a transcript reads as what happened.

Without a command policy the command runs as ``bash --noprofile --norc -c -- <command>``.
With one, the command line is checked first (nothing runs on a violation), the model's
environment passes only through an allow-list (:mod:`.envscrub`: a variable such as ``LESSOPEN``
turns an allowed ``less`` into a shell) and the run starts from a clean environment;
a backend that cannot give a clean environment is refused (fails closed).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Protocol

from ..errors import CapabilityError, ExecspaceError, InvalidSpec, PathDenied, UsageError
from ..models import NetworkAttempt, NetworkPolicy, PtySize, ResourceLimits, RunProgramSpec, RunResult, Workspace
from ..process.capture import HeadTailBuffer
from ..protocols import Engine
from ..workspace import normalize_globs, split_relpath
from .envscrub import DEFAULT_ENV_ALLOW, EnvAllowList, dropped_names, scrub
from .schema import InvalidArguments, Tool, ToolArguments, ToolSpec, check_arguments, error_result
from .sessions import ProgramSession, SessionStore
from .workspace_io import Snapshot, WorkspaceIO

__all__ = [
    "CWD_ROOTS",
    "DEFAULT_SHELL",
    "CommandChecker",
    "WorkspaceExecTool",
    "fit_output",
    "normalize_cwd",
    "split_budget",
]

#: Top-level directories a command may start in.
CWD_ROOTS = ("work", "out", "runs", "skills")
#: How commands are run: no profile, no rc file, the command as one argument.
# "--": a command that starts with "-" must never be read as a bash option
DEFAULT_SHELL = ("bash", "--noprofile", "--norc", "-c", "--")
#: Longest command line accepted.
MAX_COMMAND_CHARS = 64 * 1024
_MAX_WAIT_MS = 30_000
_FILES_LISTED = 50
# the runner keeps more than the budget so that cutting to the budget never reaches its own marker
_CAPTURE_SLACK = 64


class CommandChecker(Protocol):
    """A command policy: the parsed argv of each simple command, or ``PolicyViolation``.

    :class:`execspace.tools.shellpolicy.CommandPolicy` is the one execspace ships.
    """

    def check(self, command: str) -> list[list[str]]: ...


WorkspaceResolver = Callable[[], Awaitable[Workspace]]


# -- pure helpers ------------------------------------------------------------------------


def normalize_cwd(cwd: str | None) -> str:
    """The workspace-relative start directory for ``cwd`` (default ``work``).

    Accepts ``work``, ``out``, ``runs``, ``skills`` and directories below them, also
    written ``./out/x`` or ``$OUTPUT_DIR/x``. Refuses absolute paths, ``..``, globs,
    backslashes and control characters with ``PathDenied``.
    """
    raw = (cwd or "").strip()
    if not raw:
        return "work"
    path = normalize_globs([raw])[0]  # $OUTPUT_DIR/x, ${WORK_DIR}, ./x
    if any(c in path for c in "*?[]{}"):
        raise PathDenied(raw, "globs are not allowed in cwd; name one directory")
    if "\\" in path or any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise PathDenied(raw, "cwd must not contain backslashes or control characters")
    try:
        parts = split_relpath(path)
    except PathDenied as exc:
        raise PathDenied(raw, f"cwd must be a relative path inside the workspace ({exc.reason})") from exc
    if parts[0] not in CWD_ROOTS:
        raise PathDenied(raw, "cwd must be work, out, runs or skills, or a directory below them")
    return "/".join(parts)


def split_budget(budget: int, out_total: int, err_total: int) -> tuple[int, int]:
    """Bytes of stdout and of stderr to show within one budget: a short stream keeps
    all of its bytes and gives the rest to the other one; two long ones get half each."""
    if out_total + err_total <= budget:
        return out_total, err_total
    half = budget // 2
    if err_total <= half:
        return budget - err_total, err_total
    if out_total <= half:
        return out_total, budget - out_total
    return budget - half, half


def fit_output(raw: bytes, total: int, limit: int) -> bytes:
    """Cut captured output to ``limit`` bytes (head + marker + tail, on UTF-8 boundaries).

    ``raw`` is what the capture kept of ``total`` bytes; it must hold at least ``limit``
    bytes on each side of any middle the capture already dropped. The marker counts every
    byte the program wrote and is not shown.
    """
    buf = HeadTailBuffer(limit)
    buf.write(raw)
    # the capture may have dropped a middle already: count those bytes as omitted too
    buf.total = total
    return buf.getvalue()


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class _Request:
    command: str
    cwd: str
    env: dict[str, str]
    stdin: str | None
    timeout: float
    dropped_env: list[str] = field(default_factory=list)
    tty: bool = False


class _BoundTool:
    """One of the session tools: a spec and the method of the exec tool that serves it."""

    def __init__(self, spec: ToolSpec, fn: Callable[[ToolArguments], Awaitable[dict[str, Any]]]) -> None:
        self._spec = spec
        self._fn = fn

    @property
    def spec(self) -> ToolSpec:
        return self._spec

    async def call(self, arguments: ToolArguments) -> dict[str, Any]:
        return await self._fn(arguments)


#: Network attempts listed in one result (the run's network.jsonl has them all).
_MAX_ATTEMPTS_SHOWN = 20


def _attempt_fields(attempt: NetworkAttempt) -> dict[str, Any]:
    return {
        "destination": f"{attempt.host}:{attempt.port}",
        "allowed": attempt.allowed,
        "reason": attempt.reason,
        "bytes_up": attempt.bytes_up,
        "bytes_down": attempt.bytes_down,
    }


class WorkspaceExecTool:
    """Runs the model's shell commands in one workspace; owns its background sessions.

    Args:
        engine: the backend.
        workspace_id: the workspace (created on first use, reused after) — or
        resolver: an async callable returning the workspace of the current call.
        policy: a command policy; ``None`` runs any command line.
        output_budget: bytes of output shown to the model per result (stdout + stderr,
            or a session's new output); the middle of longer output is dropped and counted.
        default_timeout: seconds a command may run when the model does not say.
        max_timeout: the most the model may ask for.
        session_ttl: seconds an exited background session waits to be read before it is dropped.
        max_sessions: background sessions running at once.
        limits: resource limits of every run (``output_bytes`` is set by the tool).
        shell: the shell argv the command is appended to.
        name_prefix: prefix of the four tool names (``workspace_`` gives ``workspace_exec``…).
        env_allow: policy mode only: the names of the model's ``env`` that are passed on (the rest is
            dropped and reported); widen it only with variables that make no allowed program run code.
        network: the network of every run (None: the engine's default); with a :class:`NetworkPolicy` only its
            destinations are reachable and each result lists the connections asked for under ``network``.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        workspace_id: str | None = None,
        resolver: WorkspaceResolver | None = None,
        policy: CommandChecker | None = None,
        output_budget: int = 16_384,
        default_timeout: float = 300,
        max_timeout: float = 3600,
        session_ttl: float = 1800,
        max_sessions: int = 8,
        limits: ResourceLimits | None = None,
        shell: Sequence[str] = DEFAULT_SHELL,
        name_prefix: str = "workspace_",
        env_allow: Iterable[str] = DEFAULT_ENV_ALLOW,
        network: Literal["off", "on"] | NetworkPolicy | None = None,
    ) -> None:
        if (workspace_id is None) == (resolver is None):
            raise InvalidSpec("pass exactly one of workspace_id and resolver")
        if output_budget < 256:
            raise InvalidSpec(f"output_budget must be at least 256 bytes, got {output_budget}")
        if not 0 < default_timeout <= max_timeout:
            raise InvalidSpec("default_timeout must be positive and at most max_timeout")
        if policy is not None and tuple(shell) != DEFAULT_SHELL:
            # the policy's parser is proven against exactly this bash invocation, nothing else
            raise InvalidSpec(f"with a command policy the shell must be {DEFAULT_SHELL}, got {tuple(shell)}")
        self.engine = engine
        self.policy = policy
        self.env_allow = EnvAllowList(env_allow)
        self.output_budget = output_budget
        self.default_timeout = default_timeout
        self.max_timeout = max_timeout
        self.limits = limits or ResourceLimits()
        self.shell = tuple(shell)
        self.network = network
        self._workspace_id = workspace_id
        self._resolver = resolver
        self._sessions = SessionStore(ttl=session_ttl, max_running=max_sessions)
        self._specs = _build_specs(name_prefix, self)

    # -- tool surface ----------------------------------------------------------------

    @property
    def spec(self) -> ToolSpec:
        return self._specs["exec"]

    @property
    def session_tools(self) -> list[Tool]:
        """``workspace_poll``, ``workspace_write_stdin`` and ``workspace_kill``, bound to this instance."""
        return [
            _BoundTool(self._specs["poll"], self.poll),
            _BoundTool(self._specs["write_stdin"], self.write_stdin),
            _BoundTool(self._specs["kill"], self.kill),
        ]

    def tools(self) -> list[Tool]:
        """All four tools, to register with an agent."""
        return [self, *self.session_tools]

    async def dispatch(self, name: str, arguments: ToolArguments) -> dict[str, Any]:
        """Call the tool named ``name`` (for frameworks that route by name); an unknown name is an error result,
        like every other mistake a model makes."""
        for tool in self.tools():
            if tool.spec.name == name:
                return await tool.call(arguments)
        return error_result(UsageError(f"no tool named {name!r} here; known: {[t.spec.name for t in self.tools()]}"))

    @property
    def session_ids(self) -> list[str]:
        return self._sessions.ids()

    async def aclose(self) -> None:
        """Kill every background session of this instance."""
        await self._sessions.aclose()

    async def __aenter__(self) -> WorkspaceExecTool:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    # -- workspace_exec --------------------------------------------------------------

    async def call(self, arguments: ToolArguments) -> dict[str, Any]:
        """Run ``arguments["command"]``; return the LLM-ready result (errors included, never raised)."""
        try:
            args = check_arguments(self.spec.parameters, arguments)
            request = self._request(args)
            self._gate(request.command)
            ws = await self._workspace()
            await self._sessions.reap()
            if args["background"]:
                return await self._start(ws, request)
            return await self._run(ws, request)
        except (ExecspaceError, OSError) as exc:
            return error_result(exc)

    def _request(self, args: Mapping[str, Any]) -> _Request:
        command: str = args["command"]
        if not command.strip():
            raise InvalidArguments("command is empty")
        if "\0" in command:
            raise InvalidArguments("command must not contain NUL bytes")
        env: dict[str, str] = dict(args.get("env") or {})
        dropped: list[str] = []
        if self.policy is not None:
            dropped, env = dropped_names(env, self.env_allow), scrub(env, self.env_allow)
        timeout = float(args.get("timeout_sec") or self.default_timeout)  # the schema bounds it
        cwd = normalize_cwd(args.get("cwd"))
        return _Request(command, cwd, env, args.get("stdin"), timeout, dropped, tty=bool(args.get("tty")))

    def _gate(self, command: str) -> None:
        """Policy mode: the backend must give a clean environment, and the command must pass."""
        if self.policy is None:
            return
        caps = self.engine.describe()
        if not caps.clean_env:
            raise CapabilityError(
                "a clean environment (needed by the command policy)",
                caps.backend,
                "Nothing was run. Use a backend whose capabilities declare clean_env, or drop the policy.",
            )
        self.policy.check(command)

    async def _workspace(self) -> Workspace:
        if self._resolver is not None:
            return await self._resolver()
        assert self._workspace_id is not None
        return await self.engine.manager.create_workspace(self._workspace_id)

    def _program(self, request: _Request, output_bytes: int) -> RunProgramSpec:
        return RunProgramSpec(
            cmd=self.shell[0],
            args=[*self.shell[1:], request.command],
            # the policy parsed the command as UTF-8 text: a multi-byte locale such as GBK could make bash
            # read one of those bytes together with the quote after it
            env={**request.env, "LC_ALL": "C.UTF-8"} if self.policy is not None else request.env,
            clean_env=self.policy is not None,
            cwd=request.cwd,
            stdin=request.stdin,
            timeout=request.timeout,
            limits=replace(self.limits, output_bytes=output_bytes),
            pty=PtySize() if request.tty else None,
            network=self.network,
        )

    async def _run(self, ws: Workspace, request: _Request) -> dict[str, Any]:
        io = WorkspaceIO(self.engine, ws)
        before = await io.snapshot()
        result = await io.run_program(self._program(request, 2 * self.output_budget + _CAPTURE_SLACK))
        out: dict[str, Any] = {"status": "exited", **self._result_fields(result)}
        out.update(_streams(result, self.output_budget))
        out.update(await _files(io, before))
        out.update(self._env_fields(request))
        return out

    def _env_fields(self, request: _Request) -> dict[str, Any]:
        if not request.dropped_env:
            return {}
        return {"env_dropped": request.dropped_env, "env_note": self.env_allow.describe()}

    @staticmethod
    def _result_fields(result: RunResult) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "duration_sec": round(result.duration, 3),
        }
        if result.limit_hit and not result.timed_out:
            fields["limit_hit"] = result.limit_hit
        if result.network_audit:
            fields["network"] = [_attempt_fields(a) for a in result.network_audit[:_MAX_ATTEMPTS_SHOWN]]
            if len(result.network_audit) > _MAX_ATTEMPTS_SHOWN:
                fields["network_attempts_not_shown"] = len(result.network_audit) - _MAX_ATTEMPTS_SHOWN
        return fields

    # -- background sessions ---------------------------------------------------------

    async def _start(self, ws: Workspace, request: _Request) -> dict[str, Any]:
        self._sessions.check_room()
        io = WorkspaceIO(self.engine, ws)
        before = await io.snapshot()
        handle = await self.engine.runner.start_program(ws, self._program(request, self.output_budget))
        session = self._sessions.add(ws, handle, self.output_budget, context=before)
        out: dict[str, Any] = {"status": "running", "session_id": session.id, "output": "", "offset": 0}
        out["next_offset"] = 0
        names = [t.spec.name for t in self.session_tools]
        out["hint"] = f"read output with {names[0]}, send input with {names[1]}, stop with {names[2]}"
        out.update(self._env_fields(request))
        return out

    async def poll(self, arguments: ToolArguments) -> dict[str, Any]:
        """``workspace_poll``: new output since the last look, status, and the exit code once exited."""
        try:
            args = check_arguments(self._specs["poll"].parameters, arguments)
            await self._sessions.reap()
            session = self._sessions.get(args["session_id"])
            await session.settle(args["wait_ms"] / 1000)
            return await self._view(session)
        except ExecspaceError as exc:
            return error_result(exc)

    async def write_stdin(self, arguments: ToolArguments) -> dict[str, Any]:
        """``workspace_write_stdin``: send text (and maybe end of input), then report like poll."""
        try:
            args = check_arguments(self._specs["write_stdin"].parameters, arguments)
            await self._sessions.reap()
            session = self._sessions.get(args["session_id"])
            text = args["input"] + ("\n" if args["append_newline"] else "")
            if session.exited:
                return {**(await self._view(session)), "note": "input not sent: the program has exited"}
            try:
                await session.write(text, close=args["close_stdin"])
            except UsageError:
                return {**(await self._view(session)), "note": "input not sent: stdin is closed"}
            await session.settle(args["wait_ms"] / 1000)
            return await self._view(session)
        except ExecspaceError as exc:
            return error_result(exc)

    async def kill(self, arguments: ToolArguments) -> dict[str, Any]:
        """``workspace_kill``: kill the session's whole process tree, or send it one signal (INT is Ctrl-C);
        report its last output."""
        try:
            args = check_arguments(self._specs["kill"].parameters, arguments)
            session = self._sessions.get(args["session_id"])
            if args["signal"] != "KILL":
                if not session.exited:
                    await session.handle.signal(signal.Signals[f"SIG{args['signal']}"])
                await session.settle(args["wait_ms"] / 1000)
                return await self._view(session)
            was_running = not session.exited
            await session.kill()
            out = await self._view(session)
            if was_running:
                out["status"] = "killed"
            return out
        except ExecspaceError as exc:
            return error_result(exc)

    async def _view(self, session: ProgramSession) -> dict[str, Any]:
        exited = session.exited  # before take(): an exited session's output is all in its buffer
        piece = session.take()
        out: dict[str, Any] = {
            "session_id": session.id,
            "status": "exited" if exited else "running",
            "output": piece.text,
            "offset": piece.offset,
            "next_offset": piece.next_offset,
        }
        if piece.truncated:
            out["output_truncated"] = True
        if exited:
            if session.result is not None:
                out.update(self._result_fields(session.result))
            before: Snapshot = session.context
            with contextlib.suppress(ExecspaceError, OSError):
                out.update(await _files(WorkspaceIO(self.engine, session.ws), before))
            # everything was read: the session is done
            self._sessions.discard(session.id)
            await session.close()
        return out


def _streams(result: RunResult, budget: int) -> dict[str, Any]:
    out_limit, err_limit = split_budget(budget, result.stdout_total_bytes, result.stderr_total_bytes)
    streams = (
        ("stdout", result.raw_stdout, result.stdout_total_bytes, out_limit),
        ("stderr", result.raw_stderr, result.stderr_total_bytes, err_limit),
    )
    fields: dict[str, Any] = {name: _decode(fit_output(raw, total, limit)) for name, raw, total, limit in streams}
    for name, _, total, limit in streams:
        if total > limit:
            fields[f"{name}_truncated"] = True
            fields[f"{name}_total_bytes"] = total
    return fields


async def _files(io: WorkspaceIO, before: Snapshot) -> dict[str, Any]:
    changed, count = await io.changes(before, limit=_FILES_LISTED)
    fields: dict[str, Any] = {}
    if changed:
        fields["files"] = [c.as_dict() for c in changed]
    if count > len(changed):
        fields["files_not_listed"] = count - len(changed)
    return fields


# -- schemas -----------------------------------------------------------------------------

_SESSION_ID = {"type": "string", "minLength": 1, "maxLength": 64, "description": "The session_id of a background run."}


def _wait_ms(default: int, what: str) -> dict[str, Any]:
    return {
        "type": "integer",
        "minimum": 0,
        "maximum": _MAX_WAIT_MS,
        "default": default,
        "description": f"Milliseconds to wait for {what} before answering (returns early when output "
        "pauses or the program exits).",
    }


def _exec_description(tool: WorkspaceExecTool, prefix: str) -> str:
    text = (
        "Run a shell command (bash) in your workspace and get its exit code, stdout, stderr and the files it "
        "created or changed under out/. Commands start in work/ (inputs are in work/inputs/); write results to "
        "out/ ($OUTPUT_DIR). The workspace keeps its files between calls. "
        f"Output beyond {tool.output_budget} bytes is cut in the middle (head and tail kept). "
        f"Commands are killed after timeout_sec (default {tool.default_timeout:g}). For servers, watchers or "
        f"interactive programs set background=true, then use {prefix}poll, {prefix}write_stdin and "
        f"{prefix}kill with the returned session_id."
    )
    if tool.policy is not None:
        text += (
            " RESTRICTED: only simple commands joined by |, &&, || or ; with plain quoting are accepted; no $ "
            "expansions, backticks, redirections (< >), globs, subshells, background & or variable assignments; "
            "the environment is reset and env passes only "
            + (", ".join(sorted(tool.env_allow.names)) or "no names")
            + "."
        )
        allowed = list(getattr(tool.policy, "allow", None) or ())
        if allowed:
            shown = ", ".join(allowed[:20]) + (", …" if len(allowed) > 20 else "")
            text += f" Allowed commands: {shown}."
    return text


#: Signals a model may send to a session (``workspace_kill``'s ``signal``).
_SIGNALS = ("KILL", "INT", "TERM", "HUP", "QUIT", "USR1", "USR2")


def _build_specs(prefix: str, tool: WorkspaceExecTool) -> dict[str, ToolSpec]:
    exec_params = {
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_COMMAND_CHARS,
                "description": "The command line, run with bash -c.",
            },
            "cwd": {
                "type": "string",
                "description": "Directory to start in, relative to the workspace: work (default), out, runs, "
                "skills, or a directory below them. No absolute paths, '..' or globs.",
            },
            "env": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Extra environment variables (names are identifiers, values strings).",
            },
            "stdin": {"type": "string", "description": "Text for standard input (closed after it, unless background)."},
            "timeout_sec": {
                "type": "number",
                "minimum": 1,
                "maximum": tool.max_timeout,
                "description": f"Kill the command after this many seconds (default {tool.default_timeout:g}).",
            },
            "background": {
                "type": "boolean",
                "default": False,
                "description": "Start the command and return at once with a session_id instead of waiting.",
            },
            "tty": {
                "type": "boolean",
                "default": False,
                "description": "Run on a terminal (24x80) for programs that need one (REPLs, prompts, curses): "
                "output is what the terminal shows (input echoed, CR LF line ends), stderr is part of it.",
            },
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    poll_params = {
        "type": "object",
        "properties": {"session_id": _SESSION_ID, "wait_ms": _wait_ms(1000, "new output")},
        "required": ["session_id"],
        "additionalProperties": False,
    }
    write_params = {
        "type": "object",
        "properties": {
            "session_id": _SESSION_ID,
            "input": {"type": "string", "maxLength": MAX_COMMAND_CHARS, "description": "Text to send to stdin."},
            "append_newline": {
                "type": "boolean",
                "default": False,
                "description": "Send a newline after input (to submit a line).",
            },
            "close_stdin": {
                "type": "boolean",
                "default": False,
                "description": "Close stdin after input (end of input, like Ctrl-D).",
            },
            "wait_ms": _wait_ms(500, "the program's reply"),
        },
        "required": ["session_id", "input"],
        "additionalProperties": False,
    }
    kill_params = {
        "type": "object",
        "properties": {
            "session_id": _SESSION_ID,
            "signal": {
                "type": "string",
                "enum": list(_SIGNALS),
                "default": "KILL",
                "description": "KILL (default) ends the session and everything it started. Any other is sent to "
                "the program and the session goes on: INT is Ctrl-C, TERM asks it to stop, HUP, QUIT, USR1, USR2.",
            },
            "wait_ms": _wait_ms(500, "the program's reaction to a signal other than KILL"),
        },
        "required": ["session_id"],
        "additionalProperties": False,
    }
    return {
        "exec": ToolSpec(f"{prefix}exec", _exec_description(tool, prefix), exec_params),
        "poll": ToolSpec(
            f"{prefix}poll",
            f"Read the new output of a background session started by {prefix}exec, its status "
            "(running/exited) and, once exited, its exit code and changed files.",
            poll_params,
        ),
        "write_stdin": ToolSpec(
            f"{prefix}write_stdin",
            "Send text to the standard input of a running background session, then return its new output.",
            write_params,
        ),
        "kill": ToolSpec(
            f"{prefix}kill",
            "Stop a background session and everything it started, or send it a signal (INT = Ctrl-C); "
            "returns its last output.",
            kill_params,
        ),
    }
