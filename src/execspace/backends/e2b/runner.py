"""Programs in E2B sandboxes over the SDK's commands API.

Each run is one background command and one exec chain: ``bash -l -c`` (what envd always starts) makes the cwd and
run directory, then ``exec``s ``env -i`` with exactly the environment the policy built (the run's marker among it)
over what it inherits of the login shell's own (the template's ``PATH`` and ``VIRTUAL_ENV``, see :mod:`.loginenv`),
which ``exec``s the program: nothing is forked, the program is the process envd started and its end is the process
API's: an exit code, or for a signal envd's -1 and ``signal: <name>`` (what Go's ``cmd.Wait()`` says), reported
as ``-N`` like every backend does, once the sandbox is known to be still there (its end ends its commands so).
Nothing is written down or read back. Timeouts are ours (the SDK's stream deadline is only a backstop): SIGTERM to
the program (the marked process whose parent is not marked, found in the sandbox's ``/proc``), then after the grace
SIGKILL to every process that carries the run's marker. A timeout is ``timed_out``, never exit 0.

A run with a pty starts through the SDK's public ``sandbox.pty.create``, which always starts an interactive login
``bash``: the same exec chain goes in its ``PROMPT_COMMAND`` (given in the call's ``envs``), which bash runs after
its login files and before it prints a prompt or reads a key, so the program takes over bash's process, session
and terminal with nothing typed, echoed or printed before it. The SDK's own process RPC (``StartRequest`` with any
``cmd``) would say the same more directly, but it is private and changed shape between the SDK versions serve is
tested with (``e2b_connect``/``process_pb2`` in 2.29.5, ``connectrpc``/``process_pb`` in 2.45.1 and 2.63), where
``pty.create``'s signature stayed the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import secrets
import shlex
import signal
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from ...audit import AuditSink
from ...capabilities import Capabilities
from ...envpolicy import EnvPolicy
from ...errors import BackendError, CapabilityError, UsageError
from ...models import NetworkPolicy, OutputChunk, ProgramInfo, PtySize, RunProgramSpec, RunResult, Workspace
from ...process.capture import HeadTailBuffer
from ...process.egress import proxy_env
from ...process.programs import OutputLog, ProgramTable, RunLines, StartedProgram, program_info
from ...process.supervisor import RUN_MARKER_VAR
from ...protocols import ProgramHandle
from ...tracing import NO_TRACER, RUN_SPAN, AttributeValue, Tracer, record_run, run_attributes
from ...workspace.confine import split_relpath
from ...workspace.layout import new_run_name, workspace_env
from ...workspace.programpaths import workspace_relative
from .loginenv import FORGET_BASHS_OWN, LIST_NAMES, inherited_words, needs_login_names
from .sandboxes import Box, Sandboxes, sdk_call, workspace_key

if TYPE_CHECKING:
    from e2b import AsyncCommandHandle

__all__ = ["E2BProgram", "E2BRunner"]

#: Sends ``$2`` to the run's program: the process whose environment holds ``$1`` (the run's marker) and whose
#: parent's does not (its own children inherit the marker). It may not have exec'd yet: looked for again briefly.
#: ``/proc/[0-9]*`` sorts as text, so a child can come before its program; one that ends while it is read has no
#: parent to read and is not taken for the program, and only a kill that landed ends the search.
_SIGNAL = (
    'for i in $(seq 100); do for d in /proc/[0-9]*; do grep -qzx -- "$1" "$d/environ" 2>/dev/null || continue;'
    ' p=$(sed -n \'s/^PPid:[[:space:]]*//p\' "$d/status" 2>/dev/null); [ -n "$p" ] || continue;'
    ' grep -qzx -- "$1" "/proc/$p/environ" 2>/dev/null || { kill -s "$2" "${d#/proc/}" 2>/dev/null && exit 0; };'
    " done; sleep 0.02; done; :"
)
#: A signal's number by the names envd's ``signal: <name>`` may use: Go's (the C library's text, lowercase:
#: ``killed``, ``user defined signal 1``) and the short ones (``kill``, ``usr1``).
_SIGNALS = {
    **{s.name.removeprefix("SIG").lower(): s.value for s in signal.Signals},
    **{text.lower(): s.value for s in signal.Signals if (text := signal.strsignal(s))},
}
#: SIGKILLs every process of the sandbox whose environment holds ``$1`` (the run's marker), twice for forks.
_KILL = (
    'for pass in 1 2; do for d in /proc/[0-9]*; do grep -qzx -- "$1" "$d/environ" 2>/dev/null'
    ' && kill -9 "${d#/proc/}" 2>/dev/null; done; done; :'
)
#: Run directories one ``mkdir`` makes: the run's own and the next runs' of the workspace.
_AHEAD = 8
_MAX_WORKSPACES_AHEAD = 1024
#: After the last kill, how long the command's stream may take to end before we stop waiting for it.
_SETTLE = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Prepared:
    ws: Workspace
    spec: RunProgramSpec
    box: Box
    command: str
    run_dir: str
    marker: str


class E2BRunner:
    """Runs programs in the workspace's sandbox; the same checks and environment as every runner."""

    def __init__(
        self,
        boxes: Sandboxes,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None,
        kill_grace: float,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self._boxes = boxes
        self._caps = capabilities
        self.tracer = tracer
        """The span of each run, from its start to its result."""
        self.audit = audit
        """Where each run's ``command.start`` and ``command.end`` lines go (with the sandbox it runs in)."""
        self.env_policy = env_policy or EnvPolicy()
        self.kill_grace = kill_grace
        self.programs = ProgramTable()
        # run directories made ahead, per workspace: a run that finds its own there starts no mkdir
        self._made_ahead: dict[str, list[str]] = {}

    def prepare(self, ws: Workspace, spec: RunProgramSpec, login_names: tuple[str, ...] | None = None) -> _Prepared:
        """The run of ``spec`` in ``ws``: its command line; ``login_names``: the names the sandbox's login shell
        exports, where the policy inherits them all (:func:`.loginenv.needs_login_names`)."""
        self._caps().require(spec)
        options = self._boxes.options
        _check_network(spec.network, options.allow_internet_access, options.network)
        box = self._boxes.box(workspace_key(ws.id))
        rel = workspace_relative(ws, spec.cwd)
        cwd = "/".join(split_relpath(rel)) if rel not in ("", ".", "./") else ""
        run_dir, ahead = self._run_dirs(ws)
        marker_value = secrets.token_hex(8)
        given = {**options.env_vars, **spec.env}
        env = self.env_policy.build({}, given, workspace_env(ws.path, run_dir), clean=spec.clean_env)
        if "PATH" not in given and "PATH" not in self.env_policy.set:
            del env["PATH"]  # not the fallback: the login shell's (the template's) is the program's
        root = shlex.quote(ws.path)
        here = shlex.quote(f"{ws.path}/{cwd}" if cwd else ws.path)
        env[RUN_MARKER_VAR] = marker_value
        ours = [*env, "PROMPT_COMMAND"] if spec.pty is not None else env  # a pty's is our exec chain, never inherited
        inherited = inherited_words(self.env_policy, spec.clean_env, login_names, ours)
        assignments = " ".join(shlex.quote(f"{k}={v}") for k, v in env.items())
        program = " ".join(shlex.quote(a) for a in (spec.cmd, *spec.args))
        # env, not a shell, execs the program: it says 126 for a path it cannot run (ENOTDIR, EACCES) where dash says
        # 127 for all of them, and adds no variable of its own (bash's exec would export SHLVL)
        kept = _SERVICE_PROXY if options.network is not None else ""
        start = f"exec env -i{inherited} {assignments}{kept} {program}"
        made = " ".join(f"{root}/{d}" for d in (run_dir, *ahead))
        # ``[`` is bash's own: only a missing directory (a run made ahead of time raced, or it was removed) costs
        # a process
        command = (
            f"{{ [ -d {root}/{run_dir} ] && [ -d {here} ]; }} || mkdir -p -- {here} {made} || exit 126\n"
            f"cd -- {here} || exit 126\n{FORGET_BASHS_OWN}\n{start}"
        )
        return _Prepared(ws, spec, box, command, run_dir, f"{RUN_MARKER_VAR}={marker_value}")

    def _run_dirs(self, ws: Workspace) -> tuple[str, list[str]]:
        """This run's directory and those its wrapper makes ahead for the next runs (with its own, in one
        ``mkdir``); up to ``_AHEAD - 1`` of them stay empty when the workspace's runs stop."""
        if len(self._made_ahead) > _MAX_WORKSPACES_AHEAD:  # bounded: forgetting them costs one mkdir each
            self._made_ahead.clear()
        stock = self._made_ahead.setdefault(ws.path, [])
        if stock:
            return stock.pop(0), []
        names = [new_run_name() for _ in range(_AHEAD)]
        stock.extend(names[1:])
        return names[0], names[1:]

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        # supervised in the caller's task: no one else holds this program, and each task between the command's end
        # and the caller costs a turn of the event loop
        if not self.tracer.enabled:
            return await self._run_program(ws, spec)
        with self.tracer.span(RUN_SPAN, self._run_attributes(ws, spec)) as span:
            result = await self._run_program(ws, spec)
            record_run(span, result)
            return result

    async def _run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        prep = self.prepare(ws, spec, await self._login_names(ws, spec))
        program = E2BProgram(self, prep)
        lines = self._lines(prep)
        if lines is None:
            return await program.run()
        lines.started()
        try:
            result = await program.run()
        except BaseException as exc:
            lines.lost(program.pid, exc)
            raise
        lines.ended(program.pid, result)
        return result

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> E2BProgram:
        span = self.tracer.start(RUN_SPAN, self._run_attributes(ws, spec)) if self.tracer.enabled else None
        lines: RunLines | None = None
        try:
            prep = self.prepare(ws, spec, await self._login_names(ws, spec))
            program = E2BProgram(self, prep)
            if (lines := self._lines(prep)) is not None:
                lines.started()
            await program.begin(interactive=True)
        except BaseException as exc:
            if span is not None:
                span.failed(exc)
                span.end()
            if lines is not None:
                lines.lost(None, exc)
            raise
        program.when_done(self.programs.add(ws, program))
        if span is not None:
            program.ends(span)
        if lines is not None:
            program.audited(lines)
        return program

    def _lines(self, prep: _Prepared) -> RunLines | None:
        """The run's audit lines: what the SDK is asked to run (the spec's argv), in which remote sandbox."""
        if self.audit is None:
            return None
        return RunLines(self.audit, prep.ws.id, prep.spec, {"sandbox": prep.box.id})

    def _run_attributes(self, ws: Workspace, spec: RunProgramSpec) -> dict[str, AttributeValue]:
        caps = self._caps()
        return run_attributes(spec.cmd, ws.id, caps.backend, str(caps.isolation))

    async def _login_names(self, ws: Workspace, spec: RunProgramSpec) -> tuple[str, ...] | None:
        """The names the workspace's sandbox's login shell exports, read once per sandbox, where the run inherits
        them all; None where the core set is all it may inherit."""
        if not needs_login_names(self.env_policy, spec.clean_env):
            return None
        box = self._boxes.box(workspace_key(ws.id))
        if box.login_names is None:
            listed = await box.call("reading the sandbox's login environment", box.sandbox.commands.run(LIST_NAMES))
            box.login_names = tuple(listed.stdout.split())
        return box.login_names

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        return self.programs.list(ws)

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        return self.programs.get(ws, key)

    async def send_signal(self, prep: _Prepared, sig: int) -> None:
        name = signal.Signals(sig).name.removeprefix("SIG")
        await self._sh(prep, _SIGNAL, prep.marker, name)

    async def kill_marked(self, prep: _Prepared) -> None:
        await self._sh(prep, _KILL, prep.marker)

    async def _sh(self, prep: _Prepared, script: str, *args: str) -> None:
        line = f"sh -c {shlex.quote(script)} sh " + " ".join(shlex.quote(a) for a in args)
        with contextlib.suppress(Exception):  # the program (or its sandbox) may be gone meanwhile
            await sdk_call("signalling a program", prep.box.sandbox.commands.run(line))


class E2BProgram(StartedProgram):
    """One background command as a ``ProgramHandle``."""

    def __init__(self, runner: E2BRunner, prep: _Prepared) -> None:
        self._runner = runner
        self._prep = prep
        limit = prep.spec.limits.output_bytes
        self._out = HeadTailBuffer(limit)
        self._err = HeadTailBuffer(limit)
        self._queue: asyncio.Queue[OutputChunk | None] = asyncio.Queue()
        self._log = OutputLog()
        self._info = program_info(prep.spec, 0)
        self._handle: AsyncCommandHandle[None] | None = None
        self._done: asyncio.Future[RunResult] | None = None
        self._stdin_open = False
        self._killing: asyncio.Task[None] | None = None
        self._started = 0.0

    def _take(self, stream: Literal["stdout", "stderr"], data: bytes) -> None:
        (self._out if stream == "stdout" else self._err).write(data)
        chunk = OutputChunk(stream, data)
        self._queue.put_nowait(chunk)
        self._log.append(chunk)

    def _on(self, stream: Literal["stdout", "stderr"]) -> Callable[[str], None]:
        return lambda text: self._take(stream, text.encode())  # the SDK decoded it (binary_output=False)

    async def begin(self, interactive: bool) -> None:
        """Start it, supervised by a task of its own (for a handle others hold)."""
        handle = await self._open(interactive)
        self._done = asyncio.ensure_future(self._supervise(handle))
        await self._feed()

    async def run(self) -> RunResult:
        """Start it and supervise it to its end in this task."""
        handle = await self._open(False)
        try:
            await self._feed()
            return await self._supervise(handle)
        except asyncio.CancelledError:
            # as on every backend, a run whose caller stopped waiting for it does not go on
            await asyncio.shield(self._runner.kill_marked(self._prep))
            raise

    async def _open(self, interactive: bool) -> AsyncCommandHandle[None]:
        spec = self._prep.spec
        # no stdin at all saves a round trip per run: envd closes it at the start; a terminal is always there
        self._stdin_open = interactive or bool(spec.stdin) or spec.pty is not None
        backstop = 0 if spec.timeout is None else spec.timeout + self._runner.kill_grace + 2 * _SETTLE
        self._started = time.monotonic()
        handle = await self._prep.box.call(f"starting {spec.cmd!r}", self._launch(backstop))
        self._handle = handle
        self._info = dataclasses.replace(self._info, pid=handle.pid)
        return handle

    async def _feed(self) -> None:
        stdin = self._prep.spec.stdin
        if stdin:  # the spec's stdin is all the program reads
            await self.write_stdin(stdin.encode() if isinstance(stdin, str) else stdin)
            await self.close_stdin()

    async def _launch(self, backstop: float) -> AsyncCommandHandle[None]:
        """The SDK call that starts the exec chain: a background command, or a terminal's bash that runs it."""
        sandbox, size = self._prep.box.sandbox, self._prep.spec.pty
        handle: AsyncCommandHandle[None]
        if size is None:
            handle = await sandbox.commands.run(
                self._prep.command,
                background=True,
                stdin=self._stdin_open,
                timeout=backstop,
                on_stdout=self._on("stdout"),
                on_stderr=self._on("stderr"),
                retain_output=False,
            )
            return handle
        from e2b import PtySize as SdkPtySize

        handle = await sandbox.pty.create(
            SdkPtySize(rows=size.rows, cols=size.cols),
            on_data=lambda data: self._take("stdout", data),
            envs={"PROMPT_COMMAND": self._prep.command},
            timeout=backstop,
        )
        return handle

    async def _end(self, handle: AsyncCommandHandle[None]) -> tuple[int, str | None]:
        """The command's exit code and envd's error text (``signal: killed`` with -1)."""
        from e2b import CommandExitException

        try:
            result = await handle.wait()
        except CommandExitException as exc:
            return int(exc.exit_code), exc.error
        return int(result.exit_code), result.error

    async def _supervise(self, handle: AsyncCommandHandle[None]) -> RunResult:
        spec = self._prep.spec
        ending = asyncio.ensure_future(self._end(handle))
        timed_out = False
        try:
            try:
                code, error = await asyncio.wait_for(asyncio.shield(ending), spec.timeout)
            except TimeoutError:
                timed_out = True
                code, error = await self._stop(ending)
        except Exception as exc:
            box = self._prep.box  # which of the two it was, said by the service: gone, unreachable or neither
            await box.call(f"the run of {spec.cmd!r}", box.sandbox.get_info())
            raise BackendError(
                f"the run of {spec.cmd!r} in workspace {self._prep.ws.id!r} was lost ({exc}); its sandbox is "
                "still there: run it again"
            ) from exc
        finally:
            self._queue.put_nowait(None)
            self._log.close()
        if code == -1:
            code = await self._signalled(error)
        return self._result(code, timed_out)

    async def _stop(self, ending: asyncio.Future[tuple[int, str | None]]) -> tuple[int, str | None]:
        """TERM to the program, then (after the grace) KILL to everything of the run; how it ended."""
        await self._runner.send_signal(self._prep, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(ending), self._runner.kill_grace)
        await self._runner.kill_marked(self._prep)
        assert self._handle is not None
        with contextlib.suppress(Exception):
            await self._handle.kill()
        try:
            return await asyncio.wait_for(asyncio.shield(ending), _SETTLE)
        except TimeoutError:
            ending.cancel()
            with contextlib.suppress(Exception):
                await self._handle.disconnect()
            return -signal.SIGKILL, None

    async def _signalled(self, error: str | None) -> int:
        """``-N`` for envd's -1 ("ended by a signal") and its ``signal: <name>``: SIGKILL when the name is missing or
        unknown. The end of its sandbox kills a command too: then that is why the run ended, and said."""
        box = self._prep.box
        await box.call(f"the run of {self._prep.spec.cmd!r}", box.sandbox.get_info())
        name = (error or "").removeprefix("signal: ").removesuffix(" (core dumped)").strip().lower()
        return -_SIGNALS.get(name, signal.SIGKILL)

    def _result(self, code: int, timed_out: bool) -> RunResult:
        raw_out, raw_err = self._out.getvalue(), self._err.getvalue()
        return RunResult(
            exit_code=code,
            stdout=raw_out.decode("utf-8", "replace"),
            stderr=raw_err.decode("utf-8", "replace"),
            duration=time.monotonic() - self._started,
            timed_out=timed_out,
            stdout_truncated=self._out.truncated,
            stderr_truncated=self._err.truncated,
            stdout_total_bytes=self._out.total,
            stderr_total_bytes=self._err.total,
            limit_hit="timeout" if timed_out else None,
            raw_stdout=raw_out,
            raw_stderr=raw_err,
            run_dir=self._prep.run_dir,
        )

    async def stream(self) -> AsyncIterator[OutputChunk]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk
        self._queue.put_nowait(None)

    def attach(self, *, from_start: bool = True) -> AsyncIterator[OutputChunk]:
        return self._log.attach(from_start=from_start)

    async def write_stdin(self, data: bytes | str) -> None:
        if not self._stdin_open or self._handle is None:
            raise UsageError("stdin is closed")
        payload = data.encode() if isinstance(data, str) else data
        for at in range(0, len(payload), 64 * 1024):  # bounded requests
            with contextlib.suppress(Exception):  # the program ended or closed its stdin
                await self._send(payload[at : at + 64 * 1024])

    async def _send(self, data: bytes) -> None:
        assert self._handle is not None
        if self._prep.spec.pty is None:
            await self._handle.send_stdin(data)
        else:
            await self._prep.box.sandbox.pty.send_stdin(self._handle.pid, data)

    async def close_stdin(self) -> None:
        if self._stdin_open and self._handle is not None:
            self._stdin_open = False
            with contextlib.suppress(Exception):
                if self._prep.spec.pty is None:
                    await self._handle.close_stdin()
                else:  # the terminal stays: EOF is its end-of-file character (VEOF)
                    await self._send(b"\x04")

    async def signal(self, sig: int) -> None:
        if not self.finished:
            await self._runner.send_signal(self._prep, sig)

    async def resize(self, size: PtySize) -> None:
        if self._prep.spec.pty is None:
            raise UsageError("this program has no terminal to resize: start it with pty=PtySize(...)")
        if self._handle is not None and not self.finished:
            box = self._prep.box
            await box.call(f"resizing the terminal of {self._prep.spec.cmd!r}", self._resize(self._handle.pid, size))

    async def _resize(self, pid: int, size: PtySize) -> None:
        from e2b import NotFoundException, SandboxNotFoundException
        from e2b import PtySize as SdkPtySize

        try:
            await self._prep.box.sandbox.pty.resize(pid, SdkPtySize(rows=size.rows, cols=size.cols))
        except NotFoundException as exc:  # the program ended meanwhile: nothing to resize; its sandbox's end is said
            if isinstance(exc, SandboxNotFoundException):
                raise

    async def kill(self) -> None:
        assert self._done is not None
        if self._done.done():
            return
        await self._runner.send_signal(self._prep, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._done), self._runner.kill_grace)
            return
        await self._runner.kill_marked(self._prep)
        assert self._handle is not None
        with contextlib.suppress(Exception):
            await self._handle.kill()

    async def wait(self) -> RunResult:
        assert self._done is not None
        return await asyncio.shield(self._done)

    async def __aenter__(self) -> E2BProgram:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._done is not None and not self._done.done():
            await self.kill()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._done), _SETTLE)


#: With an allow-list, the proxy settings the service gives its sandbox's processes (``execspace serve`` has an
#: egress proxy; E2B's own rules need none) pass the clean environment: ``${V+"V=$V"}`` is nothing when unset.
_SERVICE_PROXY = "".join(f' ${{{name}+"{name}=${name}"}}' for name in proxy_env(1))


def _check_network(
    wanted: Literal["on", "off"] | NetworkPolicy | None, internet: bool, policy: NetworkPolicy | None
) -> None:
    """A run gets the network its sandbox was created with (rules the service enforces for the whole sandbox; a run
    asking for an allow-list on an engine without one was refused by its Capabilities)."""
    if wanted is None or wanted == policy:
        return
    if policy is not None:
        raise CapabilityError(
            f"network {wanted!r}", "e2b", "its sandboxes were created with the engine's allow-list: every run has it"
        )
    if wanted == "on" and not internet:
        raise CapabilityError("network on", "e2b", "open the engine with allow_internet_access=True")
    if wanted == "off" and internet:
        raise CapabilityError("network off", "e2b", "its sandboxes were created with allow_internet_access=True")
