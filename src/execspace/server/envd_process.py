"""envd's ``process.Process`` Connect service over the Engine's process API.

Commands arrive as the SDK sends them (``/bin/bash -l -c <cmd>``) and run in the sandbox's workspace with the
sandbox's ``envVars`` under the call's ``envs``; ``cwd`` is an SDK path under ``/home/user`` (default the home),
which is the workspace's ``work/``. A command outlives its stream: ``Connect`` follows it again, and killing the
sandbox ends it. Not yet: PTYs (``pty`` in Start, ``Update``, PTY input), and signals other than SIGTERM/SIGKILL,
which both end the program's tree.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any, Literal

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.process import process_pb as pb
from e2b.envd.process.process_connect import Process
from protobuf import Oneof

from ..errors import InvalidSpec
from ..models import OutputChunk, RunProgramSpec, RunResult
from .commands import Command, CommandConfig, CommandNotFound, Follower
from .paths import HOME_DIR, USER, to_workspace
from .rpc import ServiceBase, rpc_errors
from .sandboxes import Sandbox
from .streams import deadline_of

__all__ = ["ProcessService"]

_NO_PTY = "PTYs are not implemented by execspace serve yet; run the command without pty"


def _event(event: Any) -> pb.ProcessEvent:
    return pb.ProcessEvent(event=event)


def _start_event(pid: int) -> pb.ProcessEvent:
    start: Oneof[Literal["start"], pb.ProcessEvent.StartEvent] = Oneof("start", pb.ProcessEvent.StartEvent(pid=pid))
    return _event(start)


def _data_event(chunk: OutputChunk) -> pb.ProcessEvent:
    stdout: Oneof[Literal["stdout"], bytes] = Oneof("stdout", chunk.data)
    stderr: Oneof[Literal["stderr"], bytes] = Oneof("stderr", chunk.data)
    output = pb.ProcessEvent.DataEvent(output=stdout if chunk.stream == "stdout" else stderr)
    data: Oneof[Literal["data"], pb.ProcessEvent.DataEvent] = Oneof("data", output)
    return _event(data)


def _end_event(result: RunResult | None, error: str | None) -> pb.ProcessEvent:
    if result is None:
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status="unknown", error=error or "lost the process")
    elif result.exit_code >= 0:
        end = pb.ProcessEvent.EndEvent(
            exit_code=result.exit_code, exited=True, status=f"exit status {result.exit_code}"
        )
    else:  # like Go's ProcessState: -1 and the signal's name when a signal ended it
        end = pb.ProcessEvent.EndEvent(exit_code=-1, exited=False, status=f"signal: {_signal_name(-result.exit_code)}")
    ended: Oneof[Literal["end"], pb.ProcessEvent.EndEvent] = Oneof("end", end)
    return _event(ended)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name.removeprefix("SIG").lower()
    except ValueError:
        return str(number)


def _keepalive() -> pb.ProcessEvent:
    alive: Oneof[Literal["keepalive"], pb.ProcessEvent.KeepAlive] = Oneof("keepalive", pb.ProcessEvent.KeepAlive())
    return _event(alive)


class ProcessService(ServiceBase, Process):
    async def start(
        self, request: pb.StartRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.StartResponse]:
        sandbox = self.sandbox(ctx)
        if request.has_field("pty"):
            raise ConnectError(Code.UNIMPLEMENTED, _NO_PTY)
        config = request.process or pb.ProcessConfig()
        tag = request.tag if request.has_field("tag") else None
        with rpc_errors(config.cwd or None):
            spec = self._spec(sandbox, config)
            stdin = request.stdin if request.has_field("stdin") else True
            try:
                given = CommandConfig(config.cmd, list(config.args), dict(config.envs), config.cwd or None)
                command, follower = await sandbox.commands.start(spec, given, tag=tag, stdin=stdin)
            except CommandNotFound as exc:
                raise ConnectError(Code.ALREADY_EXISTS, str(exc)) from None
            except (FileNotFoundError, NotADirectoryError) as exc:
                raise ConnectError(Code.INVALID_ARGUMENT, f"cannot start {config.cmd!r}: {exc}") from None
        yield pb.StartResponse(event=_start_event(command.pid))
        async for event in self._follow(sandbox, follower, ctx):
            yield pb.StartResponse(event=event)

    def _spec(self, sandbox: Sandbox, config: pb.ProcessConfig) -> RunProgramSpec:
        env = {
            "USER": USER,
            "E2B_SANDBOX": "true",
            "E2B_SANDBOX_ID": sandbox.id,
            **sandbox.env_vars,
            **dict(config.envs),
        }
        cwd = to_workspace(config.cwd) if config.cwd else HOME_DIR
        try:
            return RunProgramSpec(
                cmd=config.cmd,
                args=list(config.args),
                env=env,
                cwd=cwd,
                timeout=None,
                network="on" if sandbox.allow_internet_access else "off",
            )
        except InvalidSpec as exc:
            raise ConnectError(Code.INVALID_ARGUMENT, str(exc)) from None

    async def connect(
        self, request: pb.ConnectRequest, ctx: RequestContext[Any, Any], /
    ) -> AsyncIterator[pb.ConnectResponse]:
        sandbox = self.sandbox(ctx)
        command = self._find(sandbox, request.process)
        follower = Follower(command)
        yield pb.ConnectResponse(event=_start_event(command.pid))
        async for event in self._follow(sandbox, follower, ctx):
            yield pb.ConnectResponse(event=event)

    async def _follow(
        self, sandbox: Sandbox, follower: Follower, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[pb.ProcessEvent]:
        """The command's output and end, with keepalives on a quiet stream, until the client's deadline."""
        loop = asyncio.get_running_loop()
        deadline = deadline_of(ctx)
        interval = _keepalive_interval(ctx, self.sandboxes.options.keepalive_interval)
        try:
            while True:
                wait = interval if deadline is None else min(interval, deadline - loop.time())
                if wait <= 0:
                    raise ConnectError(Code.DEADLINE_EXCEEDED, "the command ran past the request's timeout")
                try:
                    chunk = await asyncio.wait_for(follower.next(), wait)
                except TimeoutError:
                    if deadline is None or loop.time() < deadline:
                        yield _keepalive()
                    continue
                if chunk is None:
                    yield _end_event(follower.command.result, follower.command.error)
                    return
                yield _data_event(chunk)
        finally:
            follower.close()

    async def list(self, request: pb.ListRequest, ctx: RequestContext[Any, Any], /) -> pb.ListResponse:
        sandbox = self.sandbox(ctx)
        return pb.ListResponse(processes=[_info(c) for c in sandbox.commands.all()])

    async def send_signal(
        self, request: pb.SendSignalRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.SendSignalResponse:
        sandbox = self.sandbox(ctx)
        command = self._find(sandbox, request.process)
        if request.signal not in (pb.Signal.SIGKILL, pb.Signal.SIGTERM):
            raise ConnectError(
                Code.INVALID_ARGUMENT, f"signal {request.signal!r} is not supported: use SIGKILL or SIGTERM"
            )
        await command.handle.kill()
        return pb.SendSignalResponse()

    async def send_input(self, request: pb.SendInputRequest, ctx: RequestContext[Any, Any], /) -> pb.SendInputResponse:
        sandbox = self.sandbox(ctx)
        await self._write(self._find(sandbox, request.process), request.input)
        return pb.SendInputResponse()

    async def _write(self, command: Command, given: pb.ProcessInput | None) -> None:
        match given.input if given is not None else None:
            case Oneof(field="stdin", value=data):
                with rpc_errors():
                    await command.handle.write_stdin(data)
            case Oneof(field="pty"):
                raise ConnectError(Code.UNIMPLEMENTED, _NO_PTY)
            case _:
                raise ConnectError(Code.INVALID_ARGUMENT, "the input names neither stdin nor pty")

    async def close_stdin(
        self, request: pb.CloseStdinRequest, ctx: RequestContext[Any, Any], /
    ) -> pb.CloseStdinResponse:
        sandbox = self.sandbox(ctx)
        await self._find(sandbox, request.process).handle.close_stdin()
        return pb.CloseStdinResponse()

    async def stream_input(
        self, request: AsyncIterator[pb.StreamInputRequest], ctx: RequestContext[Any, Any], /
    ) -> pb.StreamInputResponse:
        sandbox = self.sandbox(ctx)
        command: Command | None = None
        async for message in request:
            match message.event:
                case Oneof(field="start", value=pb.StreamInputRequest.StartEvent() as start):
                    command = self._find(sandbox, start.process)
                case Oneof(field="data", value=pb.StreamInputRequest.DataEvent() as data):
                    if command is None:
                        raise ConnectError(Code.INVALID_ARGUMENT, "stream input must start with a start event")
                    await self._write(command, data.input)
        return pb.StreamInputResponse()

    async def update(self, request: pb.UpdateRequest, ctx: RequestContext[Any, Any], /) -> pb.UpdateResponse:
        raise ConnectError(Code.UNIMPLEMENTED, _NO_PTY)

    def _find(self, sandbox: Sandbox, selector: pb.ProcessSelector | None) -> Command:
        try:
            match selector.selector if selector is not None else None:
                case Oneof(field="pid", value=int() as pid):
                    return sandbox.commands.find(pid=pid)
                case Oneof(field="tag", value=str() as tag):
                    return sandbox.commands.find(tag=tag)
        except CommandNotFound as exc:
            raise ConnectError(Code.NOT_FOUND, str(exc)) from None
        raise ConnectError(Code.INVALID_ARGUMENT, "the process selector names neither a pid nor a tag")


def _info(command: Command) -> pb.ProcessInfo:
    given = command.config
    config = pb.ProcessConfig(cmd=given.cmd, args=list(given.args), envs=dict(given.envs), cwd=given.cwd)
    return pb.ProcessInfo(config=config, pid=command.pid, tag=command.tag)


def _keepalive_interval(ctx: RequestContext[Any, Any], most: float) -> float:
    """The client's ``Keepalive-Ping-Interval`` (seconds), at most ``most``."""
    asked = ctx.request_headers.get("keepalive-ping-interval", "")
    try:
        return min(most, max(1.0, float(asked))) if asked else most
    except ValueError:
        return most
