"""ProgramRunner for programs started as host processes (local, and wrapped by the sandbox).

Composed of the shared steps: :class:`~.preparation.RunPreparation` decides what the program gets, the runner's
wrappers turn that into the finished :class:`~.supervisor.Launch` (the bubblewrap sandbox, Seatbelt), a spawner
starts it (a direct spawn, or what the runner's :class:`Spawning` chooses: a sandbox session's supervisor), and the
supervision, per-workspace bookkeeping and post-run checks are the same for every host process. A backend
configures one; it never subclasses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, final

from ..audit import AuditSink, run_ended, run_lost, run_started
from ..capabilities import Capabilities, Isolation
from ..envpolicy import EnvPolicy
from ..errors import CannotExecute
from ..models import ProgramInfo, RunProgramSpec, RunResult, Workspace
from ..tracing import NO_TRACER, RUN_SPAN, Span, Tracer, record_run, run_attributes
from ..workspace.branches import overlay_supported
from .freezing import held
from .pacing import OutputPace
from .preparation import (
    PreparedRun,
    ProgramLookup,
    RunPreparation,
    exec_error,
    finish_run,
    lookup_on_path,
    not_started,
)
from .programs import ProgramTable, program_info
from .rlimits import classify_rlimit_exit, rlimit_preexec
from .supervisor import Launch, MarkerSweeper, Spawner, SupervisedProcess, spawn

if TYPE_CHECKING:
    from ..protocols import ProgramHandle

__all__ = ["DISK_BYTES_DETAIL", "HostRunner", "Spawning", "Wrapper", "unisolated_capabilities"]

#: A wrapper step of a runner: a prepared run's launch plan made into a new one to start (another argv around the
#: program, another environment…); what it opens for the run it registers on the run's exit stack (:class:`.RunStack`).
Wrapper = Callable[[PreparedRun, Launch], Launch]

#: Which configuration of a runner a run takes (e.g. the sandbox's for the runtime environment the run names): the
#: runner itself, or one sharing its bookkeeping (:meth:`HostRunner.sharing`).
Chooser = Callable[["HostRunner", RunProgramSpec], "HostRunner"]


class Spawning(Protocol):
    """A runner's choice of spawner per run, and what comes with it: whether the run's directory is made while it
    is prepared, what else stops and holds a workspace's programs (a sandbox session's supervisor and its runs)."""

    def defers_run_dir(self, ws: Workspace, spec: RunProgramSpec) -> bool:
        """Whether what starts ``spec``'s program makes its run directory (the preparation only names it)."""
        ...

    async def spawner(self, runner: HostRunner, prep: PreparedRun, launch: Launch) -> tuple[Launch, Spawner | None]:
        """The spawner of this run (None: a direct spawn), and its plan with what that spawner adds."""
        ...

    async def stop(self, ws: Workspace) -> None:
        """End what the workspace's programs run in (before the runner kills those it started)."""
        ...

    def frozen(self, runner: HostRunner, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        """The workspace's programs held still (:meth:`HostRunner.frozen`)."""
        ...

    def holds(self, ws: Workspace) -> bool:
        """Whether something of it (a session) has the workspace's tree open now (:meth:`HostRunner.holds`)."""
        ...

    def cpu_seconds(self, runner: HostRunner, ws: Workspace) -> float:
        """How much CPU the workspace's programs have used (:meth:`HostRunner.cpu_seconds`)."""
        ...


#: How ``max_disk_bytes`` is enforced by every host-directory backend (no quota stops the writes themselves).
DISK_BYTES_DETAIL = (
    "allocated blocks of the whole tree (fallocate reservations included, hard links once), measured after "
    "each run: a run can go over while it writes, then gets limit_hit=disk_bytes"
)


@final
class HostRunner:
    """Runs programs as supervised host processes in host-directory workspaces."""

    def __init__(
        self,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None = None,
        *,
        host_env: Mapping[str, str] | None = None,
        kill_grace: float = 2.0,
        owner: Callable[[Workspace], tuple[int, int] | None] | None = None,
        program_root: Callable[[Workspace], str] | None = None,
        lookup: ProgramLookup = lookup_on_path,
        path_view: Callable[[str], str] | None = None,
        output_rate: int | None = None,
        wrappers: Sequence[Wrapper] = (),
        choose: Chooser | None = None,
        spawning: Spawning | None = None,
        user_exists: Callable[[str], bool] | None = None,
        tracer: Tracer = NO_TRACER,
        audit: AuditSink | None = None,
    ) -> None:
        self.wrappers = tuple(wrappers)
        """What each prepared run is wrapped in, in turn (:data:`Wrapper`)."""
        self.choose = choose
        self.spawning = spawning
        self.preparation = RunPreparation(
            capabilities,
            env_policy,
            host_env=host_env,
            owner=owner,
            program_root=program_root,
            lookup=lookup,
            path_view=path_view,
            user_exists=user_exists,
        )
        self.kill_grace = kill_grace
        self.tracer = tracer
        """The span of each run (:data:`~execspace.tracing.RUN_SPAN`): from its start to its result."""
        self.audit = audit
        """Where each run's ``command.start`` and ``command.end`` lines go (the end's before its result returns)."""
        self._capabilities = capabilities
        self.output_rate = output_rate
        """Bytes a second the host reads of one workspace's programs' output, all of them together (None: as fast
        as they write): one that writes faster is held back by its full pipe."""
        # one pace per workspace, for as long as a program of it holds it
        self._paces: weakref.WeakValueDictionary[str, OutputPace] = weakref.WeakValueDictionary()
        self._sweeper = MarkerSweeper()
        # programs still running, by workspace directory: cleanup kills them before removing the tree
        self._live: dict[Path, set[asyncio.Future[SupervisedProcess]]] = {}
        self.programs = ProgramTable()

    def sharing(
        self,
        *,
        preparation: RunPreparation | None = None,
        wrappers: Sequence[Wrapper] | None = None,
        choose: Chooser | None = None,
        spawning: Spawning | None = None,
    ) -> HostRunner:
        """This runner with other parts (None: the same; ``spawning`` None: direct spawns), sharing its bookkeeping:
        the programs it runs, their sweeps and output paces, which :meth:`stop_programs` and :meth:`frozen` see."""
        other = copy.copy(self)
        if preparation is not None:
            other.preparation = preparation
        if wrappers is not None:
            other.wrappers = tuple(wrappers)
        other.choose = choose if choose is not None else self.choose
        other.spawning = spawning
        return other

    # -- the preparation and wrapper steps ---------------------------------------------------

    def prepare(self, ws: Workspace, spec: RunProgramSpec) -> PreparedRun:
        """The run's preparation (:meth:`.RunPreparation.prepare`), for :meth:`run_program` and
        :meth:`start_program`.

        Raises:
            CommandNotFound: the command does not exist.
        """
        if self.spawning is not None and self.spawning.defers_run_dir(ws, spec):
            return self.preparation.prepare(ws, spec, make_run_dir=False)
        return self.preparation.prepare(ws, spec)

    def wrap(self, prep: PreparedRun, *, interactive: bool = False) -> Launch:
        """Turn a prepared run into the finished launch: the program as is (the local backend), then each of the
        runner's wrappers in turn (Seatbelt's ``sandbox-exec``)."""
        launch = self.launch(prep, prep.argv, prep.env, prep.host_cwd, interactive=interactive)
        try:
            for wrapper in self.wrappers:
                launch = wrapper(prep, launch)
        except BaseException:
            launch.stack.abandon()  # what the wrappers before the failed one opened
            raise
        return launch

    def launch(
        self,
        prep: PreparedRun,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        *,
        interactive: bool = False,
        rlimits: bool = True,
    ) -> Launch:
        """The launch of ``argv`` for ``prep``: its stdin, deadline, output cap, rlimits and supervision.
        ``rlimits=False``: what starts the program sets its rlimits (a sandbox session's supervisor)."""
        spec = prep.spec
        return Launch(
            argv=argv,
            env=env,
            cwd=cwd,
            marker=prep.marker,
            stdin=spec.stdin.encode() if isinstance(spec.stdin, str) else spec.stdin,
            interactive=interactive,
            timeout=spec.timeout,
            output_limit=spec.limits.output_bytes,
            kill_grace=self.kill_grace,
            preexec_fn=rlimit_preexec(spec.limits) if rlimits else None,
            run_dir=prep.run_dir,
            classify_exit=classify_rlimit_exit,
            sweeper=self._sweeper,
            info=program_info(spec, 0) if interactive else None,
            pty=spec.pty,
            output_pace=self._pace(str(prep.root)),
        )

    def _pace(self, workspace: str) -> OutputPace | None:
        if self.output_rate is None:
            return None
        pace = self._paces.get(workspace)
        if pace is None:
            pace = self._paces[workspace] = OutputPace(self.output_rate)
        return pace

    # -- ProgramRunner -----------------------------------------------------------------

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        if self.choose is not None and (runner := self.choose(self, spec)) is not self:
            return await runner.run_program(ws, spec)
        if not self.tracer.enabled:
            return await self._run_program(ws, spec)
        with self.tracer.span(RUN_SPAN, self._run_attributes(ws, spec)) as span:
            result = await self._run_program(ws, spec)
            record_run(span, result)
            return result

    async def _run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        if self.audit is None:
            return (await self._run_prepared(ws, spec))[1]
        self.audit.record("command.start", run_started(ws.id, spec))
        try:
            pid, result = await self._run_prepared(ws, spec)
        except BaseException as exc:  # cancelled, or its supervision failed: every start has its end
            self.audit.record("command.end", run_lost(ws.id, spec, None, exc))
            raise
        self.audit.record("command.end", run_ended(ws.id, spec, pid, result))
        return result

    async def _run_prepared(self, ws: Workspace, spec: RunProgramSpec) -> tuple[int | None, RunResult]:
        try:
            prep = self.prepare(ws, spec)
        except CannotExecute as exc:
            return None, not_started(exc)
        try:
            proc = await self.spawn_prepared(prep, self.wrap(prep))
        except OSError as exc:
            failed = exec_error(prep, exc)
            if failed is None:
                raise
            return None, not_started(failed)
        async with proc:
            result = await proc.wait()
        return proc.pid, await finish_run(prep, result)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> SupervisedProcess:
        if self.choose is not None and (runner := self.choose(self, spec)) is not self:
            return await runner.start_program(ws, spec)
        if not self.tracer.enabled:
            return await self._start_program(ws, spec, None)
        # not the current span: the program outlives this call, and what the caller does next is not part of it
        span = self.tracer.start(RUN_SPAN, self._run_attributes(ws, spec))
        try:
            return await self._start_program(ws, spec, span)
        except BaseException as exc:
            span.failed(exc)
            span.end()
            raise

    async def _start_program(self, ws: Workspace, spec: RunProgramSpec, span: Span | None) -> SupervisedProcess:
        if self.audit is None:
            return await self._start_prepared(ws, spec, span)
        self.audit.record("command.start", run_started(ws.id, spec))
        try:
            return await self._start_prepared(ws, spec, span)
        except CannotExecute as exc:  # its end is the start's failure, as run_program's result says it
            self.audit.record("command.end", run_ended(ws.id, spec, None, not_started(exc)))
            raise
        except BaseException as exc:
            self.audit.record("command.end", run_lost(ws.id, spec, None, exc))
            raise

    async def _start_prepared(self, ws: Workspace, spec: RunProgramSpec, span: Span | None) -> SupervisedProcess:
        prep = self.prepare(ws, spec)
        launch = self.wrap(prep, interactive=True)
        if span is not None:
            launch.stack.annotate(_ends(span))  # before the spawn: a program can be over by the end of it
        end = _EndLine(self.audit, ws.id, spec) if self.audit is not None else None
        if end is not None:
            launch.stack.annotate(end.note)
        try:
            proc = await self.spawn_prepared(prep, launch)
        except OSError as exc:
            failed = exec_error(prep, exc)
            if failed is None:
                raise
            raise failed from exc
        if end is not None:
            end.started(proc.pid)
        forget = self.programs.add(ws, proc)
        if proc.finished:  # supervision ended before it was listed: its exit stack is closed
            forget()
        else:
            launch.stack.callback(forget)
        return proc

    def _run_attributes(self, ws: Workspace, spec: RunProgramSpec) -> dict[str, str | bool | int | float]:
        caps = self._capabilities()
        return run_attributes(spec.cmd, ws.id, caps.backend, str(caps.isolation))

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        return self.programs.list(ws)

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        return self.programs.get(ws, key)

    async def stop_programs(self, ws: Workspace) -> None:
        """Kill every program this runner started in ``ws`` that still runs (or is being started), and wait
        for them to end: for ``HostWorkspaceManager(stop_programs=...)``, as nothing may change a tree while
        it is removed."""
        if self.spawning is not None:
            await self.spawning.stop(ws)
        if ws.host_path is None:
            return
        live = self._live.pop(ws.host_path, set())
        await asyncio.gather(*(_kill_started(started) for started in live))

    def frozen(self, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        """Every program this runner runs in ``ws`` (and its descendants) held still for the block, each the way
        its launch says (:mod:`.freezing`): for ``HostWorkspaceManager(freeze=...)``, so that a snapshot copies a
        state nobody changes meanwhile, and for a pause.

        Raises:
            FreezeFailed: (on entering) they could not all be held; none is.
        """
        if self.spawning is not None:
            return self.spawning.frozen(self, ws)
        return held(proc.freezer([pid], ()) for proc in self.live_processes(ws) if (pid := proc.pid) is not None)

    def cpu_seconds(self, ws: Workspace) -> float:
        """How much CPU the programs this runner runs in ``ws`` (and their descendants) have used so far, each
        counted the way its launch says (:attr:`.Launch.cpu_clock`): what ``execspace serve`` compares between two
        readings to tell an idle sandbox from a busy one (:class:`~execspace.protocols.SupportsCpuUsage`)."""
        if self.spawning is not None:
            return self.spawning.cpu_seconds(self, ws)
        return sum(proc.cpu_seconds() for proc in self.live_processes(ws))

    def holds(self, ws: Workspace) -> bool:
        """Whether a program of this runner (or one being started, or what its spawning keeps, such as a session)
        has the workspace's tree open now: for ``HostWorkspaceManager(holds=...)``."""
        if ws.host_path is not None and self._live.get(ws.host_path):
            return True
        return self.spawning is not None and self.spawning.holds(ws)

    def live_processes(self, ws: Workspace) -> list[SupervisedProcess]:
        """The processes of the programs this runner runs in ``ws`` (started, not over yet)."""
        live = self._live.get(ws.host_path, set()) if ws.host_path is not None else set()
        return [f.result() for f in live if f.done() and not f.cancelled() and f.exception() is None]

    async def spawn_prepared(
        self, prep: PreparedRun, launch: Launch, spawner: Spawner | None = None
    ) -> SupervisedProcess:
        """Start ``launch`` (made by :meth:`wrap` for ``prep``), known to :meth:`stop_programs` before it exists.
        ``spawner`` makes its transport (see :func:`~.supervisor.spawn`).

        Raises:
            OSError: it could not be started (``exec_error`` says whether that is a 127/126).
        """
        if spawner is None and self.spawning is not None:
            launch, spawner = await self.spawning.spawner(self, prep, launch)
        root = prep.root
        # known before it exists: a program already running may not have been handed back to us yet. Spawned in
        # this task, not one of its own: a run that exits at once is not a loop turn later for it
        started: asyncio.Future[SupervisedProcess] = asyncio.get_running_loop().create_future()
        live = self._live.setdefault(root, set())
        live.add(started)

        def forget() -> None:
            live.discard(started)
            if not live and self._live.get(root) is live:
                del self._live[root]

        launch.stack.callback(forget)
        try:
            proc = await spawn(launch, spawner)
        except BaseException:
            forget()
            started.cancel()  # nothing was started: nothing for stop_programs to kill
            raise
        started.set_result(proc)
        return proc


async def _kill_started(started: asyncio.Future[SupervisedProcess]) -> None:
    await asyncio.wait([started])
    if not started.cancelled() and started.exception() is None:
        await started.result().kill_now()


def unisolated_capabilities(
    backend: str,
    env_policy: EnvPolicy | None,
    does_not_protect: tuple[str, ...],
    details: dict[str, str] | None = None,
) -> Capabilities:
    """What a :class:`HostRunner` enforces when it runs programs as plain host processes (no boundary)."""
    from ..languages import available_languages
    from .rlimits import RLIMIT_ENFORCED

    path = (env_policy or EnvPolicy()).program_path(os.environ)
    return Capabilities(
        backend=backend,
        isolation=Isolation.NONE,
        network_control=False,
        network_default=True,
        clean_env=True,
        read_only_mounts=False,
        streaming=True,
        pty=True,
        host_paths=True,
        enforced_limits=frozenset({"timeout", "output_bytes", "disk_bytes"} | RLIMIT_ENFORCED),
        languages=available_languages(path),
        does_not_protect=does_not_protect,
        fork="cow" if overlay_supported() else "copy",
        absolute_paths="cwd",  # a program of the host: any directory of it is a cwd, as in a shell
        details={"memory_bytes": "RLIMIT_AS per process", "disk_bytes": DISK_BYTES_DETAIL, **(details or {})},
    )


class _EndLine:
    """A started program's ``command.end`` line, written by a note on its exit stack (before its result is
    anyone's) once its pid is known: a program over before its spawn returned has it written then."""

    def __init__(self, audit: AuditSink, workspace: str, spec: RunProgramSpec) -> None:
        self._audit, self._workspace, self._spec = audit, workspace, spec
        self._pid: int | None = None
        self._spawned = False
        self._result: RunResult | None = None

    def note(self, result: RunResult) -> RunResult:
        if self._spawned:
            self._write(result)
        else:
            self._result = result
        return result

    def started(self, pid: int | None) -> None:
        self._pid, self._spawned = pid, True
        if self._result is not None:
            self._write(self._result)

    def _write(self, result: RunResult) -> None:
        self._audit.record("command.end", run_ended(self._workspace, self._spec, self._pid, result))


def _ends(span: Span) -> Callable[[RunResult], RunResult]:
    """The note on a started program's exit stack that ends its span with its result."""

    def note(result: RunResult) -> RunResult:
        record_run(span, result)
        span.end()
        return result

    return note
