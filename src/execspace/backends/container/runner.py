"""ProgramRunner that runs each program as an ``exec`` in the workspace's container."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ...audit import AuditSink
from ...capabilities import Capabilities
from ...envpolicy import EnvPolicy
from ...errors import CapabilityError
from ...models import NetworkApprover, NetworkPolicy, ProgramInfo, RunProgramSpec, RunResult, Workspace
from ...process.egress import RunAudit
from ...process.preparation import PreparedRun, RunPreparation, finish_run, lookup_where_it_runs, signal_status
from ...process.programs import ProgramTable, RunLines
from ...process.rlimits import classify_rlimit_exit
from ...process.supervisor import RUN_MARKER_VAR
from ...protocols import ProgramHandle
from ...tracing import NO_TRACER, RUN_SPAN, AttributeValue, Tracer, record_run, run_attributes
from .config import CONTAINER_WORKSPACE
from .daemon import WorkspaceContainers
from .egress import open_egress
from .envimage import environment_misfit
from .execrun import KILL_GRACE, ExecRun
from .handle import ContainerHandle
from .limits import rlimit_argv
from .memory import OomWatch, check_memory, oom_kills

if TYPE_CHECKING:
    from ...environments import Environment

__all__ = ["ContainerRunner"]

#: After each kill, how long the stream may take to close before we kill again (and, after the last,
#: close it ourselves). Short first waits: a program the daemon started only after the kill must be
#: killed again before it can finish.
_KILL_SETTLES = (0.2, 0.5, 1.0, 5.0)

_RUNTIME_FAILURE = b"OCI runtime exec failed"


class ContainerRunner:
    """The host runners' preparation (capabilities, cwd confinement, run dir, env policy); only the start
    differs: an exec in the workspace's long-lived container."""

    def __init__(
        self,
        containers: WorkspaceContainers,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None,
        owner: Callable[[Workspace], tuple[int, int] | None],
        environment: Environment | None = None,
        network_allow: NetworkPolicy | None = None,
        on_network_attempt: NetworkApprover | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self.tracer = tracer
        """The span of each run, from its start to its result."""
        self.audit = audit
        """Where each run's ``command.start`` and ``command.end`` lines go (with the container it execs in)."""
        self._capabilities = capabilities
        self.preparation = RunPreparation(
            capabilities,
            env_policy,
            host_env={},  # the host's environment is not the container's: policy variables start from nothing
            owner=owner,
            program_root=lambda _ws: CONTAINER_WORKSPACE,
            lookup=lookup_where_it_runs,  # on the run's PATH, by the runtime (127 from there)
            # a rootfs environment is the image itself: its PATH is the image's, with no venv to put first
            path_view=None
            if environment is None or environment.root is not None
            else functools.partial(_bin_first, str(environment.bin_dir)),
        )
        self._environment = environment
        # a venv environment runs the host's python on the image's standard library: checked once, at the first run
        self._environment_fits = environment is None or environment.root is not None
        self._containers = containers
        user = containers.config.user
        self._user = f"{user[0]}:{user[1]}"
        self.programs = ProgramTable()
        # the engine's allow-list: the network of every run that does not choose its own
        self.network_allow = network_allow
        self.on_network_attempt = on_network_attempt
        self._egress: dict[str, RunAudit] = {}
        """The open proxies of running allow-list runs, by run directory (closed by :meth:`finish`)."""
        self._watches: dict[str, OomWatch] = {}
        """What each running run's end is judged against for memory, by run directory (taken by :meth:`finish`)."""

    def _prepare(self, ws: Workspace, spec: RunProgramSpec) -> PreparedRun:
        self._check_spec(spec)
        prep = self.preparation.prepare(ws, spec)
        if self._environment is not None:
            # the environment's variables where the run sets none of its own (its bin is first on PATH already)
            prep.env.update({k: v for k, v in self._environment.program_env().items() if k not in spec.env})
        return prep

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        if not self.tracer.enabled:
            return await self._run_program(ws, spec)
        with self.tracer.span(RUN_SPAN, self._run_attributes(ws, spec)) as span:
            result = await self._run_program(ws, spec)
            record_run(span, result)
            return result

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ContainerHandle:
        if not self.tracer.enabled:
            return await self._start_program(ws, spec)
        span = self.tracer.start(RUN_SPAN, self._run_attributes(ws, spec))
        try:
            handle = await self._start_program(ws, spec)
        except BaseException as exc:
            span.failed(exc)
            span.end()
            raise
        handle.ends(span)
        return handle

    def _run_attributes(self, ws: Workspace, spec: RunProgramSpec) -> dict[str, AttributeValue]:
        caps = self._capabilities()
        return run_attributes(spec.cmd, ws.id, caps.backend, str(caps.isolation))

    async def _run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        prep = self._prepare(ws, spec)  # never CommandNotFound: the runtime looks the program up (a 127 of its own)
        try:
            cid = await self._place(ws, prep)
            lines = self._lines(ws, spec, cid)
            if lines is None:
                return (await self._exec(prep, cid, with_pid=False))[1]
            lines.started()
            try:
                pid, result = await self._exec(prep, cid, with_pid=True)
            except BaseException as exc:
                lines.lost(None, exc)
                raise
            lines.ended(pid, result)
            return result
        finally:
            self._unplace(prep)  # unless finish took it: a failed start, a cancelled run

    async def _exec(self, prep: PreparedRun, cid: str, *, with_pid: bool) -> tuple[int | None, RunResult]:
        """Run the exec to its result; ``with_pid``: with its process id (a call to the daemon: for the audit)."""
        run = ExecRun(self._containers.client.api, cid, prep.spec.limits.output_bytes)
        workdir = self._container_path(prep)
        try:
            await asyncio.to_thread(run.start, self._argv(prep), prep.env, workdir, self._user)
        except Exception:
            await self._containers.forget(cid)  # a dead container is replaced on the next run
            raise
        pid = (await asyncio.to_thread(run.pid) or None) if with_pid else None
        timed_out = await self._drive(run, prep)
        return pid, await self.finish(run, prep, timed_out)

    def _lines(self, ws: Workspace, spec: RunProgramSpec, cid: str) -> RunLines | None:
        return None if self.audit is None else RunLines(self.audit, ws.id, spec, {"container": cid[:12]})

    async def _start_program(self, ws: Workspace, spec: RunProgramSpec) -> ContainerHandle:
        prep = self._prepare(ws, spec)
        cid = await self._place(ws, prep)
        lines = self._lines(ws, spec, cid)
        if lines is not None:
            lines.started()
        handle = ContainerHandle(self, prep)
        run = ExecRun(self._containers.client.api, cid, spec.limits.output_bytes, handle.on_chunk)
        try:
            await asyncio.to_thread(run.start, self._argv(prep), prep.env, self._container_path(prep), self._user)
            pid = await asyncio.to_thread(run.pid)
        except Exception as exc:
            if lines is not None:
                lines.lost(None, exc)
            self._unplace(prep)
            await self._containers.forget(cid)
            raise
        handle.begin(run, pid)
        if lines is not None:
            handle.audited(lines)
        forget = self.programs.add(ws, handle)
        handle.when_done(forget)
        return handle

    async def _place(self, ws: Workspace, prep: PreparedRun) -> str:
        """The container the run execs in (the workspace's, or its member for the run's ``memory_bytes``), with
        its proxy open when it has an allow-list and its memory watch taken; returns the container's id."""
        own = await self._containers.ensure(ws)
        if not self._environment_fits:
            await self._check_environment(own)
        memory = prep.spec.limits.memory_bytes
        cid = own if memory is None else await self._containers.member(ws, memory)
        await self._open_egress(prep, own)  # a member shares its network namespace
        if memory is None:
            self._watches[prep.run_dir] = OomWatch(cid, self._containers.oom_seen(cid), asked=False)
        else:
            api = self._containers.client.api
            self._watches[prep.run_dir] = OomWatch(cid, await asyncio.to_thread(oom_kills, api, cid, self._user), True)
        return cid

    async def _check_environment(self, cid: str) -> None:
        assert self._environment is not None
        api, image = self._containers.client.api, self._containers.config.image
        misfit = await asyncio.to_thread(environment_misfit, api, cid, self._environment, image, self._user)
        if misfit is not None:
            raise misfit
        self._environment_fits = True

    def _unplace(self, prep: PreparedRun) -> None:
        self._close_egress(prep)
        self._watches.pop(prep.run_dir, None)

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        return self.programs.list(ws)

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        return self.programs.get(ws, key)

    async def signal_run(self, run: ExecRun, prep: PreparedRun, signame: str) -> None:
        with contextlib.suppress(Exception):  # the exec may have ended meanwhile
            await asyncio.to_thread(run.signal, RUN_MARKER_VAR, prep.marker, self._user, signame)

    async def finish(self, run: ExecRun, prep: PreparedRun, timed_out: bool, killed: bool = False) -> RunResult:
        """The result of an exec whose stream has ended, after the shared post-run checks (and its proxy's
        audit, closing the proxy: what the program left running loses the network with the run's end)."""
        result = await self._result(run, prep, timed_out, killed)
        watch = self._watches.pop(prep.run_dir, None)
        if watch is not None and result.limit_hit is None and not killed and await self._out_of_memory(watch, result):
            result = replace(result, limit_hit="memory_bytes")
        audit = self._egress.pop(prep.run_dir, None)
        if audit is not None:
            result = audit.annotate(result)
            audit.close()
        return await finish_run(prep, result)

    async def _out_of_memory(self, watch: OomWatch, result: RunResult) -> bool:
        """Whether the kernel killed a process of the run's container for memory while it ran (see
        :mod:`.memory`)."""
        if not watch.worth_reading(result.exit_code):
            return False
        after = await asyncio.to_thread(oom_kills, self._containers.client.api, watch.container, self._user)
        if after is None:
            state = await asyncio.to_thread(self._containers.state, watch.container)
            if state.get("Running"):
                return False  # a counter it cannot read: no evidence
            # stopped: the OOM killer may have taken its first process too, which the daemon then says
            await self._containers.forget(watch.container)
            return bool(state.get("OOMKilled"))
        self._containers.saw_ooms(watch.container, after)
        return watch.breached(after)

    def _allow_list(self, spec: RunProgramSpec) -> NetworkPolicy | None:
        wanted = self.network_allow if spec.network is None else spec.network
        return wanted if isinstance(wanted, NetworkPolicy) else None

    async def _open_egress(self, prep: PreparedRun, cid: str) -> None:
        """With an allow-list, the run's proxy on a port of the container's loopback, named in its environment."""
        policy = self._allow_list(prep.spec)
        if policy is None:
            return
        api = self._containers.client.api
        audit, env = await open_egress(api, cid, prep.root, policy, prep.run_dir, self.on_network_attempt)
        self._egress[prep.run_dir] = audit
        prep.env.update(env)

    def _close_egress(self, prep: PreparedRun) -> None:
        audit = self._egress.pop(prep.run_dir, None)
        if audit is not None:
            audit.close()

    def _argv(self, prep: PreparedRun) -> list[str]:
        return [*rlimit_argv(prep.spec.limits), *prep.argv]

    def _check_spec(self, spec: RunProgramSpec) -> None:
        config = self._containers.config
        check_memory(spec.limits.memory_bytes)
        if self._allow_list(spec) is not None and config.networked:
            raise CapabilityError(
                f"a network allow-list (NetworkPolicy) on a container on the daemon network {config.network!r}",
                "container",
                "its programs have a route out that bypasses the proxy: open the engine with network='none' "
                "(or network=NetworkPolicy.allow([...]))",
            )
        if spec.network == "on" and not config.networked:
            raise CapabilityError(
                "network on", "container", "open the engine with network='<daemon network>' (e.g. 'bridge')"
            )
        if spec.limits.pids is not None and spec.limits.pids < config.pids:
            raise CapabilityError(
                f"pids below the container's {config.pids}", "container", "open the engine with pids= at most that"
            )

    def _container_path(self, prep: PreparedRun) -> str:
        return prep.program_cwd(CONTAINER_WORKSPACE)

    async def _drive(self, run: ExecRun, prep: PreparedRun) -> bool:
        """Feed stdin and read output until the end or the deadline; kill on expiry or cancellation."""
        stdin = prep.spec.stdin.encode() if isinstance(prep.spec.stdin, str) else prep.spec.stdin
        feeder = asyncio.ensure_future(asyncio.to_thread(run.feed_stdin, stdin))
        pump = asyncio.ensure_future(asyncio.to_thread(run.pump))
        timed_out = False
        try:
            await asyncio.wait_for(asyncio.shield(pump), prep.spec.timeout)
        except TimeoutError:
            timed_out = True
            await self.kill_run(run, prep, pump, grace=KILL_GRACE)
        except BaseException:
            await asyncio.shield(self.kill_run(run, prep, pump))
            raise
        finally:
            run.close()  # unblocks a stdin feeder the program never read from
            with contextlib.suppress(Exception):
                await feeder
            if pump.done():
                run.release()
        return timed_out

    async def kill_run(
        self, run: ExecRun, prep: PreparedRun, pump: asyncio.Future[None], *, grace: float = 0.0
    ) -> None:
        """Kill what the run started and wait (bounded) for its stream to end.

        With a ``grace``, SIGTERM first and up to ``grace`` seconds for the stream to end; then SIGKILL to whatever
        of the run is left either way (a child that ignored the TERM and let go of the stream too). A kill can land
        before the daemon has started the exec's process; the stream then goes on, so the kill is repeated until
        it ends, a bounded number of times.
        """
        if grace:
            await self.signal_run(run, prep, "TERM")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pump), grace)
        for settle in _KILL_SETTLES:
            with contextlib.suppress(Exception):  # the exec may have ended on its own meanwhile
                await asyncio.to_thread(run.kill, RUN_MARKER_VAR, prep.marker, self._user)
            try:
                await asyncio.wait_for(asyncio.shield(pump), settle)
                return
            except TimeoutError:
                continue
        run.close()
        await pump

    def _exec_failure(self, prep: PreparedRun, runtime: bytes) -> tuple[int, bytes]:
        """The exit code and message of a program the runtime could not start, in the program's terms, with the
        runtime's own line after it."""
        missing = b"not found" in runtime or b"no such file" in runtime
        image = self._containers.config.image
        why = (
            f"not found in image {image} (on its PATH, for a bare name): use an image that has it, or install it "
            "in the image"
            if missing
            else "not executable (is it a program, with a valid #! line?)"
        )
        line = f"execspace: cannot execute {prep.spec.cmd!r} in the container: {why}\n".encode()
        return (127 if missing else 126), line + runtime

    async def _result(self, run: ExecRun, prep: PreparedRun, timed_out: bool, killed: bool) -> RunResult:
        status = await asyncio.to_thread(run.exit_code)
        # the runtime reports a program killed by signal N as 128 + N; the library's convention is -N
        code = -signal.SIGKILL if status is None else signal_status(status)
        out, err = run.stdout, run.stderr
        raw_out, raw_err = out.getvalue(), err.getvalue()
        if code in (126, 127) and raw_out.startswith(_RUNTIME_FAILURE) and not raw_err:
            # the runtime could not start the program and says so on stdout: report it as a shell would
            code, raw_err = self._exec_failure(prep, raw_out)
            raw_out = b""
        return RunResult(
            exit_code=code,
            stdout=raw_out.decode("utf-8", "replace"),
            stderr=raw_err.decode("utf-8", "replace"),
            duration=max(run.ended - run.started, 0.0),
            timed_out=timed_out,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            stdout_total_bytes=out.total,
            stderr_total_bytes=err.total,
            limit_hit="timeout" if timed_out else classify_rlimit_exit(code),
            raw_stdout=raw_out,
            raw_stderr=raw_err,
            run_dir=prep.run_dir,
        )


def _bin_first(bin_dir: str, path: str) -> str:
    """The run's PATH with a runtime environment's ``bin`` first (bound at its own path in the container)."""
    return ":".join(dict.fromkeys([bin_dir, *path.split(":")]))
