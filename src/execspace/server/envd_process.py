"""envd's ``process.Process`` Connect service over the Engine's process API.

Commands arrive as the SDK sends them (``/bin/bash -l -c <cmd>``) and run in the sandbox's workspace with the
sandbox's ``envVars`` under the call's ``envs``; ``cwd`` is an SDK path under ``/home/user`` (default the home),
which is the workspace's ``work/``. A command outlives its stream: ``Connect`` attaches to it again (from now, as
envd does), killing the sandbox ends it, and the client's ``Connect-Timeout-Ms`` ends only the stream. Each
started program is waited for in the background, so that output nobody reads never holds it back.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import posixpath
import signal
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from protobuf import Oneof

from ..errors import BackendError, CannotExecute, CapabilityError, InvalidSpec, ProgramNotFound
from ..models import OutputChunk, ProgramInfo, PtySize, RunProgramSpec, RunResult, Workspace
from ..protocols import ProgramHandle
from .envd.process import process_pb as pb
from .envd.process.process_connect import Process
from .events import CommandEnded, CommandStarted, EgressAttempted, Events, outcome_of
from .paths import HOME, USER, PathOutsideHome, program_dir, to_sdk
from .routing import user_of
from .rpc import ServiceBase, rpc_errors
from .sandboxes import Sandbox
from .streams import deadline_of

#: The user a machine sandbox's commands may also run as (E2B's `user="root"`).
ROOT = "root"

__all__ = ["ProcessService"]

#: Chunks a stream may have waiting for its client before it stops taking more (the program is never held back:
#: a reader that falls too far behind is cut off by the Engine, and the stream ends with an error).
_STREAM_QUEUE = 64
_SIGNALS = {pb.Signal.SIGKILL: signal.SIGKILL, pb.Signal.SIGTERM: signal.SIGTERM}
#: Seconds a SIGKILL's answer waits for the killed process to be reaped.
_KILL_REAPED = 2.0


def _event(event: Any) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=event)


#: Starts a program in a directory of the sandbox outside the workspace, where a run cannot start: ``$1`` is it.
_CD_THEN_EXEC = 'cd -- "$1" || exit 1; shift; exec "$@"'


def _in_directory(ws: Workspace, cmd: str, args: list[str], cwd: str) -> tuple[str, list[str], str]:
    """The program, its arguments and its run's cwd for an SDK ``cwd`` (the home by default): one under the home
    is the workspace's (:func:`.paths.program_dir`); another (``/``, ``/tmp``: the SDK's clients run set-up
    commands there) is entered by a shell that then execs the program, as envd would start it there (a missing
    directory fails the command, as envd does)."""
    try:
        return cmd, args, program_dir(ws, cwd or HOME)
    except PathOutsideHome:
        shell = ["-c", _CD_THEN_EXEC, "sh", posixpath.normpath(cwd), cmd, *args]
        return "/bin/sh", shell, program_dir(ws, HOME)


def _start_event(pid: int) -> pb.ProcessEvent:
    start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent] = Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))
    return _event(start)


def _data_event(chunk: OutputChunk, pty: bool) -> pb.ProcessEvent:
    stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", chunk.data)
    stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", chunk.data)
    terminal: Oneof[Literal["pty"], bytes] = Oneof("pty", chunk.data)
    output = pb.ProcessEvent.DataEvent(output=terminal if pty else stdout if chunk.stream == "stdout" else stderr)
    data: Oneof[Literal["data"], pb.ProcessEvent.DataEvent] = Oneof("data", output)
    return _event(data)


def _end_event(result: RunResult) -> pb.ProcessEvent:
    """As envd reports a Go ``cmd.Wait()``: the ``ProcessState`` (-1 and ``signal: killed`` for a signal), and its
    error, the same text, unless the command exited 0 (the SDK passes the error on, so a client can tell which
    signal ended a command)."""
    code = result.exit_code
    if code >= 0:
        end = pb.ProcessEvent.EndEvent(exit_code=code, exited=True, status=f"exit status {code}")
    else:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {_signal_text(-code)}")
    if code != 0:
        end.error = end.status
    ended: Oneof[Literal["end"], pb.ProcessEvent.EndEvent] = Oneof("end", end)
    return _event(ended)


def _signal_text(number: int) -> str:
    """Go's name of a signal (``killed``, ``terminated``, ``user defined signal 1``): the C library's, lowercase."""
    text = signal.strsignal(number) if 0 < number < signal.NSIG else None
    return text.lower() if text and not text.startswith("Unknown") else f"signal {number}"


def _started(
    sandbox: Sandbox, spec: RunProgramSpec, handle: ProgramHandle, config: pb.ProcessConfig, user: str | None
) -> CommandStarted:
    return CommandStarted(
        sandbox=sandbox.id,
        key_id=sandbox.owner,
        pid=handle.pid or 0,
        argv=(config.cmd, *config.args),
        user=spec.user or user or USER,
        cwd=config.cwd or HOME,
        env_names=tuple(config.envs),
    )


def _ended(events: Events, sandbox: Sandbox, pid: int, config: pb.ProcessConfig, result: RunResult) -> None:
    """A command's end, and the connections it asked its egress proxy for (its result holds them)."""
    for attempt in result.network_audit:
        events(
            EgressAttempted(sandbox.id, sandbox.owner, pid, attempt.host, attempt.port, attempt.allowed, attempt.reason)
        )
    argv = (config.cmd, *config.args)
    outcome = outcome_of(result)
    events(
        CommandEnded(sandbox.id, sandbox.owner, pid, argv, result.exit_code, outcome, result.duration, result.limit_hit)
    )


def _keepalive() -> pb.ProcessEvent:
    alive: Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive] = Oneof("keepalive", pb.ProcessEvent.KeepAlive())
    return _event(alive)


class ProcessService(ServiceBase, Process):
    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.StartResponse]:
        sandbox = self.sandbox(ctx, runs=True)
        with rpc_errors():
            sandbox.share.streams.take()
        try:
            async for response in self._start(sandbox, request, ctx):
                yield response
        finally:
            sandbox.share.streams.give_back()

    async def _start(
        self, sandbox: Sandbox, request: pb.StartRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.StartResponse]:
        config = request.process or pb.ProcessConfig()
        with rpc_errors(config.cwd or None):
            spec = self._spec(sandbox, request, user_of(ctx.request_headers))
            sandbox.share.programs.take()
            try:
                handle = await sandbox.engine.runner.start_program(sandbox.workspace, spec)
            except BaseException as exc:
                sandbox.share.programs.give_back()
                if isinstance(exc, CapabilityError):
                    raise ConnectError(Code.FAILED_PRECONDITION, str(exc)) from None
                if isinstance(exc, CannotExecute | FileNotFoundError | NotADirectoryError):
                    raise ConnectError(Code.INVALID_ARGUMENT, f"cannot start {config.cmd!r}: {exc}") from None
                raise
        reader = handle.attach(from_start=True)
        events = self.sandboxes.events
        if events.listening:
            events(_started(sandbox, spec, handle, config, user_of(ctx.request_headers)))
            sandbox.keep_waiting(handle, functools.partial(_ended, events, sandbox, handle.pid or 0, config))
        else:
            sandbox.keep_waiting(handle)  # gives its share back when it ends
        await self.sandboxes.keep_paused(sandbox)
        if request.has_field("stdin") and not request.stdin and spec.pty is None:
            await handle.close_stdin()
        yield pb.StartResponse(event=_start_event(handle.pid or 0))
        async for event in self._follow(sandbox, handle, reader, ctx, pty=spec.pty is not None):
            yield pb.StartResponse(event=event)

    def _spec(self, sandbox: Sandbox, request: pb.StartRequest, user: str | None) -> RunProgramSpec:
        config = request.process or pb.ProcessConfig()
        as_root = user == ROOT  # a machine sandbox's (the caller's user was checked): its own name and home
        env = {**sandbox.program_env(), **({"USER": ROOT} if as_root else {}), **config.envs}
        size = request.pty.size if request.pty is not None else None
        cmd, args, cwd = _in_directory(sandbox.workspace, config.cmd, list(config.args), config.cwd)
        try:
            return RunProgramSpec(
                cmd=cmd,
                args=args,
                env=env,
                cwd=cwd,
                timeout=None,  # a command lives until it exits, is killed, or its sandbox ends
                network=sandbox.egress.network,
                tag=request.tag if request.has_field("tag") else None,
                pty=PtySize(rows=size.rows, cols=size.cols) if request.pty is not None and size else None,
                user=ROOT if as_root else None,
            )
        except InvalidSpec as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.ConnectResponse]:
        sandbox = self.sandbox(ctx, runs=True)
        handle = await self._find(sandbox, request.process)
        with rpc_errors():
            sandbox.share.streams.take()
        try:
            reader = handle.attach(from_start=False)
            yield pb.ConnectResponse(event=_start_event(handle.pid or 0))
            async for event in self._follow(sandbox, handle, reader, ctx, pty=handle.info.pty is not None):
                yield pb.ConnectResponse(event=event)
        finally:
            sandbox.share.streams.give_back()

    async def _follow(
        self,
        sandbox: Sandbox,
        handle: ProgramHandle,
        reader: AsyncIterator[OutputChunk],
        ctx: RequestContext[Any, Any],
        *,
        pty: bool,
    ) -> AsyncIterator[pb.ProcessEvent]:
        """The program's output and end (once its end was reported: :meth:`.Sandbox.ended`), keepalives on a quiet
        stream, until the client's deadline."""
        loop = asyncio.get_running_loop()
        deadline = deadline_of(ctx)
        interval = _keepalive_interval(ctx, self.sandboxes.options.keepalive_interval)
        # a task reads the output: a timeout around the reader itself would close it
        queue: asyncio.Queue[OutputChunk | BaseException | None] = asyncio.Queue(_STREAM_QUEUE)
        pump = asyncio.create_task(_pump(reader, queue))
        try:
            while True:
                wait = interval if deadline is None else min(interval, deadline - loop.time())
                if wait <= 0:
                    raise ConnectError(Code.DEADLINE_EXCEEDED, "the command ran past the request's timeout")
                try:
                    item = await asyncio.wait_for(queue.get(), wait)
                except TimeoutError:
                    yield _keepalive()
                    continue
                if isinstance(item, BaseException):
                    raise ConnectError(Code.RESOURCE_EXHAUSTED, str(item))
                if item is None:
                    break
                yield _data_event(item, pty)
            yield _end_event(await sandbox.ended(handle))
        finally:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any], /) -> pb.ListResponse:
        sandbox = self.sandbox(ctx, runs=True)
        programs = await sandbox.engine.runner.list_programs(sandbox.workspace)
        return pb.ListResponse(processes=[_info(p) for p in programs])

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.SendSignalResponse:
        sandbox = self.sandbox(ctx, runs=True)
        handle = await self._find(sandbox, request.process)
        number = _SIGNALS.get(request.signal)
        if number is None:
            raise ConnectError(Code.INVALID_ARGUMENT, f"signal {request.signal!r} is not one envd sends")
        await handle.signal(number)
        if number == signal.SIGKILL:
            # envd's SIGKILL is followed at once by its reaping of the process, so a command run right after it
            # finds no process of that pid (``kill -0`` fails: the SDK's own test of kill); here the reaper is the
            # sandbox's supervisor, so wait for the end, briefly (a process in uninterruptible sleep can take long)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(handle.wait()), _KILL_REAPED)
        return pb.SendSignalResponse()

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any], /) -> pb.SendInputResponse:
        sandbox = self.sandbox(ctx, runs=True)
        await _write(await self._find(sandbox, request.process), request.input)
        return pb.SendInputResponse()

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.CloseStdinResponse:
        sandbox = self.sandbox(ctx, runs=True)
        await (await self._find(sandbox, request.process)).close_stdin()
        return pb.CloseStdinResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any], /
    ) -> pb.StreamInputResponse:
        sandbox = self.sandbox(ctx, runs=True)
        handle: ProgramHandle | None = None
        async for message in request:
            match message.event:
                case Oneof(field="start", value=pb.StreamInputRequest.StartEvent() as start):
                    handle = await self._find(sandbox, start.process)
                case Oneof(field="data", value=pb.StreamInputRequest.DataEvent() as data):
                    if handle is None:
                        raise ConnectError(Code.INVALID_ARGUMENT, "stream input must start with a start event")
                    await _write(handle, data.input)
        return pb.StreamInputResponse()

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any], /) -> pb.UpdateResponse:
        sandbox = self.sandbox(ctx, runs=True)
        handle = await self._find(sandbox, request.process)
        size = request.pty.size if request.pty is not None else None
        if size is None:
            return pb.UpdateResponse()
        with rpc_errors():
            await handle.resize(PtySize(rows=size.rows, cols=size.cols))
        return pb.UpdateResponse()

    async def _find(self, sandbox: Sandbox, selector: pb.ProcessSelector | None) -> ProgramHandle:
        key: int | str
        match selector.selector if selector is not None else None:
            case Oneof(field="pid", value=int() as pid):
                key = pid
            case Oneof(field="tag", value=str() as tag):
                key = tag
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "the process selector names neither a pid nor a tag")
        try:
            return await sandbox.engine.runner.get_program(sandbox.workspace, key)
        except ProgramNotFound as exc:
            raise ConnectError(Code.NOT_FOUND, str(exc)) from None


async def _pump(reader: AsyncIterator[OutputChunk], queue: asyncio.Queue[OutputChunk | BaseException | None]) -> None:
    try:
        async for chunk in reader:
            await queue.put(chunk)
    except BackendError as exc:  # this reader fell too far behind and was cut off
        await queue.put(exc)
        return
    await queue.put(None)


async def _write(handle: ProgramHandle, given: pb.ProcessInput | None) -> None:
    """stdin and pty input both go to the program's stdin, which is its terminal when it has one."""
    match given.input if given is not None else None:
        case Oneof(field="stdin" | "pty", value=bytes() as data):
            with rpc_errors():
                await handle.write_stdin(data)
        case _:
            raise ConnectError(Code.INVALID_ARGUMENT, "the input names neither stdin nor pty")


def _info(program: ProgramInfo) -> pb.ProcessInfo:
    config = pb.ProcessConfig(cmd=program.cmd, args=list(program.args), envs=dict(program.env), cwd=to_sdk(program.cwd))
    return pb.ProcessInfo(config=config, pid=program.pid, tag=program.tag)


def _keepalive_interval(ctx: RequestContext[Any, Any], most: float) -> float:
    """The client's ``Keepalive-Ping-Interval`` (seconds), at most ``most``."""
    asked = ctx.request_headers.get("keepalive-ping-interval", "")
    try:
        return min(most, max(1.0, float(asked))) if asked else most
    except ValueError:
        return most
