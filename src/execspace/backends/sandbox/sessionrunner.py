"""Session mode of the sandbox backend: a HostRunner whose runs go through the workspace's session
(:func:`session_runner`, configured with a :class:`SessionMode`: its wrapper and its choice of spawner).

One session (:mod:`.session`) per workspace, started on its first run or taken from a warm pool of sessions
started on laid-out slots (:mod:`execspace.workspace.slots`), kept while the workspace lives or until
``idle_timeout`` passes without programs, ended on cleanup and engine close. A run the session cannot give what
it asks runs in a sandbox of its own, exactly as in per-run mode: another network setting than the session's,
``pids``, ``cpus`` or a cgroup-enforced ``memory_bytes`` (a session's processes share one uid and one cgroup), other
seccomp filters (:meth:`.Sandbox.with_seccomp`, e.g. a kernel's), or a policy with no-access globs (judged against the
workspace's files when a sandbox starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import os
import shutil
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ...errors import PathDenied
from ...models import NetworkPolicy, RunProgramSpec, Workspace
from ...process.freezing import held
from ...process.hostrunner import HostRunner
from ...process.preparation import PreparedRun
from ...process.rlimits import rlimit_values
from ...process.supervisor import Launch, Spawner, SupervisedProcess
from ...process.warmpool import WarmPool
from ...workspace.hostmanager import private_dir
from ...workspace.slots import laid_out_slot, sweep_stale_slots, take_slot
from .bwrap import SANDBOX_WORKSPACE, SUPERVISOR_PATH
from .egress import RunAudit, proxy_env
from .machine import runs_as_user, user_argv
from .runner import Sandbox, SandboxRunnerConfig
from .session import Session, start_session
from .sessionconfig import SessionConfig
from .sessionprogram import SessionTransport

__all__ = ["SessionMode", "session_runner"]
#: Output of the session's bwrap kept for its error message (bwrap says why it could not start).
_BWRAP_OUTPUT = 64 * 1024


@dataclass(frozen=True, slots=True)
class _Pooled:
    host_dir: Path
    session: Session


def _inode(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


def session_runner(
    runner: SandboxRunnerConfig,
    *,
    supervisor: Path,
    config: SessionConfig,
    workspace_root: Path,
    root_mode: int,
    prepare_slot: Callable[[Path], None] | None,
    pool: bool,
) -> tuple[HostRunner, SessionMode]:
    """A HostRunner whose runs go through their workspace's session (see the module), and its :class:`SessionMode`
    (the warm pool, ``adopt``, ``refill``, ``aclose`` for the engine)."""
    mode = SessionMode(
        runner,
        supervisor=supervisor,
        config=config,
        workspace_root=workspace_root,
        root_mode=root_mode,
        prepare_slot=prepare_slot,
        pool=pool,
    )
    sandbox = mode.sandbox
    sandbox.runner = HostRunner(
        runner.capabilities,
        runner.env_policy,
        kill_grace=runner.kill_grace,
        output_rate=runner.output_rate,
        owner=mode.run_owner,
        program_root=lambda _ws: SANDBOX_WORKSPACE,
        lookup=sandbox.lookup,
        path_view=sandbox.path_view,
        wrappers=[mode],
        choose=mode.choose,
        spawning=mode,
        user_exists=sandbox.user_exists,
        tracer=runner.tracer,
        audit=runner.audit,
    )
    return sandbox.runner, mode


class SessionMode:
    """The session's part of its runner's run path: the wrapper of a run (the program as is, the session's sandbox
    being around it already; or a sandbox of its own for a run the session cannot give what it asks), and the
    spawner (the session's supervisor), with the sessions, their pool and idle ends (see the module)."""

    def __init__(
        self,
        runner: SandboxRunnerConfig,
        *,
        supervisor: Path,
        config: SessionConfig,
        workspace_root: Path,
        root_mode: int,
        prepare_slot: Callable[[Path], None] | None,
        pool: bool,
    ) -> None:
        self.sandbox = Sandbox(replace(runner, owner=self.run_owner))
        self.sandbox.decisions = {}
        self._owner = runner.owner
        self.supervisor = supervisor
        self.config = config
        self._session_seccomp = self.sandbox.seccomp
        self._session_environment = self.sandbox.environment
        self._ending: set[asyncio.Task[None]] = set()
        self._sessions: dict[Path, asyncio.Future[Session]] = {}
        self._lock = threading.Lock()
        self._adopted: dict[Path, tuple[Session, tuple[int, int]]] = {}
        self._workspace_root = workspace_root
        self._root_mode = root_mode
        self._prepare_slot = prepare_slot
        self._swept = False
        self.pool: WarmPool[_Pooled] | None = (
            WarmPool(config.pool_size, self._make_pooled, self._discard_pooled, idle_timeout=None)
            if pool and config.pool_size > 0
            else None
        )

    def run_owner(self, ws: Workspace) -> tuple[int, int] | None:
        # the uid of a running session is that of every run in it: no lookup (open, xattr, hash) per run
        fut = self._sessions.get(ws.host_path) if ws.host_path is not None else None
        if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
            session = fut.result()
            if session.usable:
                return session.owner
        return self._owner(ws) if self._owner is not None else None

    @property
    def runner(self) -> HostRunner:
        return self.sandbox.runner

    def choose(self, runner: HostRunner, spec: RunProgramSpec) -> HostRunner:
        """The runner of ``spec``: ``runner``, or for another runtime environment one sharing its bookkeeping
        whose runs (which the session's mounts do not fit) are sandboxes of their own."""
        if spec.environment is None:  # most runs: no lookup
            return runner
        sandbox = self.sandbox.in_environment(spec)
        if sandbox is self.sandbox:
            return runner
        mode = copy.copy(self)
        mode.sandbox = sandbox
        preparation = runner.preparation.with_lookup(sandbox.lookup, sandbox.path_view)
        sandbox.runner = runner.sharing(preparation=preparation, wrappers=[mode], choose=mode.choose, spawning=mode)
        return sandbox.runner

    def frozen(self, runner: HostRunner, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        """The workspace's session's programs held still for the block, not its supervisor (it keeps answering:
        a program it starts meanwhile is held by the next pass), and the runs that needed a sandbox of their own
        (see :meth:`fits_session`), each the way its bwrap was started with (the session's cgroup freezer as
        root, else signals).

        Raises:
            FreezeFailed: (on entering) they could not all be held; none is.
        """
        sessions = self._started_sessions(ws)
        holds = [s.bwrap.freezer([pid], [pid]) for s in sessions if s.bwrap is not None and (pid := s.supervisor_pid)]
        own = _own_sandboxes(runner, ws)
        return held([*holds, *(p.freezer([p.pid], ()) for p in own if p.pid is not None)])

    def cpu_seconds(self, runner: HostRunner, ws: Workspace) -> float:
        """How much CPU the workspace's session (its supervisor included: it only answers) and the runs that
        needed a sandbox of their own have used, each counted the way its bwrap was started with (its cgroup's
        count as root, else its processes summed)."""
        sessions = [s.bwrap.cpu_seconds() for s in self._started_sessions(ws) if s.bwrap is not None]
        return sum(sessions) + sum(p.cpu_seconds() for p in _own_sandboxes(runner, ws))

    def _started_sessions(self, ws: Workspace) -> list[Session]:
        """The workspace's session, once started, and the pooled one it adopted, if any."""
        sessions: list[Session] = []
        if ws.host_path is not None:
            fut = self._sessions.get(ws.host_path)
            if fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None:
                sessions.append(fut.result())
            with self._lock:
                adopted = self._adopted.get(ws.host_path)
            if adopted is not None:
                sessions.append(adopted[0])
        return sessions

    # -- which runs go through the session ---------------------------------------------------------

    def fits_session(self, spec: RunProgramSpec) -> bool:
        """Whether the session gives ``spec`` what it asks (else it runs in a sandbox of its own)."""
        sandbox = self.sandbox
        if sandbox.seccomp is not self._session_seccomp or sandbox.policy.no_access_globs:
            # globs are judged against the workspace's files when a sandbox starts: each run gets its own
            return False
        if sandbox.environment is not self._session_environment:
            return False  # another runtime environment (in_environment): the session's mounts have not its tree
        wanted = sandbox.network_allow if spec.network is None else spec.network
        if isinstance(wanted, NetworkPolicy) and wanted.inject:
            return False  # its proxy ends TLS with a CA made for, and installed in, a sandbox of its own
        if sandbox.network_allow is not None:
            # the session's sandbox has the engine's allow-list: only runs that keep it share it
            if spec.network is not None and spec.network != sandbox.network_allow:
                return False
        elif isinstance(spec.network, NetworkPolicy):
            return False  # its channel and proxy are made for a sandbox of its own
        elif spec.network is not None and (spec.network == "on") != sandbox.network_default:
            return False
        limits = spec.limits
        if limits.pids is not None and os.geteuid() == 0:
            return False  # RLIMIT_NPROC would count the whole session's processes
        if limits.cpus is not None:
            return False  # a quota of its own: the session's cgroup holds the session's
        return not (limits.memory_bytes is not None and "memory_bytes" in sandbox.cgroups.enforced)

    def defers_run_dir(self, ws: Workspace, spec: RunProgramSpec) -> bool:
        # the supervisor makes the run directory of a session run (off the host's share of the run, whose
        # largest single cost it was), where its sandbox may write runs/
        # (not with an allow-list: the run's proxy audits into its directory before the program starts)
        return (
            ws.host_path is not None
            # a machine's supervisor is the sandbox's root, not the workspace's uid: the host makes the directory
            and self.sandbox.machine is None
            and self.sandbox.network_allow is None
            and self.fits_session(spec)
            and self.sandbox.access_of(ws.host_path, "runs").can_write
        )

    def __call__(self, prep: PreparedRun, launch: Launch) -> Launch:
        """The wrapper of a run: the program as is in the session's sandbox, its rlimits the supervisor's; or, for
        a run the session does not fit, a sandbox of its own."""
        if not self.fits_session(prep.spec):
            return self.sandbox.wrap(prep, launch)
        if prep.cwd_rel and not self.sandbox.access_of(prep.root, prep.cwd_rel).can_read:
            raise PathDenied(prep.cwd_rel, "the sandbox policy gives no access to the working directory")
        env = self.sandbox.program_env(prep)
        cwd = prep.program_cwd(SANDBOX_WORKSPACE)
        machine = self.sandbox.machine
        # a machine's supervisor is its root: each run starts as user (sudo makes it root again)
        argv = (
            prep.argv if machine is None or not runs_as_user(prep.spec.user) else user_argv(machine.setpriv, prep.argv)
        )
        # the plan made anew from the preparation, not a copy of the runner's (dataclasses.replace of its ~25 fields
        # was a tenth of a session run's calls): the session's wrapper is its runner's only one, nothing is on the
        # runner's plan yet but what the preparation gave it
        return self.runner.launch(prep, argv, env, cwd, interactive=launch.interactive, rlimits=False)

    async def spawner(self, runner: HostRunner, prep: PreparedRun, launch: Launch) -> tuple[Launch, Spawner | None]:
        """The session's supervisor, for a run the session fits; else a direct spawn of its own sandbox."""
        if not self.fits_session(prep.spec):
            if not prep.run_dir_made:
                runner.preparation.make_run_dir(prep)
            return launch, None
        session = await self._session(prep.ws)
        if self.sandbox.network_allow is not None:
            launch = await self._run_proxy(session, prep, launch)
        session.active += 1  # the idle timer, if one is set, finds it busy and lets it be
        launch.stack.callback(functools.partial(self._program_over, prep.root, session))
        make: Spawner = functools.partial(
            SessionTransport,
            session=session,
            rlimits=rlimit_values(prep.spec.limits),
            run_dir=None if prep.run_dir_made else f"{SANDBOX_WORKSPACE}/{prep.run_dir}",
            make_run_dir=functools.partial(runner.preparation.make_run_dir, prep),
        )
        return launch, make

    async def _run_proxy(self, session: Session, prep: PreparedRun, launch: Launch) -> Launch:
        """``launch`` with the run's own proxy, on a listener the session's supervisor makes on its loopback: the
        run's attempts are audited in its own directory and result, as in per-run mode. (The session's own proxy,
        on ``PROXY_PORT``, audits into the session's run directory what other programs of the sandbox send it.)"""
        allow = self.sandbox.network_allow
        assert allow is not None
        listener = await session.listener()
        port = listener.getsockname()[1]
        try:
            audit = RunAudit(allow, prep.root, prep.run_dir, self.sandbox.on_network_attempt)
        except BaseException:
            listener.close()
            raise
        await audit.proxy.serve(listener)
        launch.stack.callback(audit.close)
        launch.stack.annotate(audit.annotate)
        return replace(launch, env={**launch.env, **proxy_env(port)})

    def _program_over(self, root: Path, session: Session) -> None:
        session.active -= 1
        timeout = self.config.idle_timeout
        if session.active == 0 and timeout is not None and session.usable:
            loop = asyncio.get_running_loop()
            session.idle_since = loop.time()
            # one timer per idle spell, not one per run: a run that starts meanwhile leaves it, it looks again
            if session.idle_timer is None:
                session.idle_timer = loop.call_at(session.idle_since + timeout, self._idle_check, root, session)

    def _idle_check(self, root: Path, session: Session) -> None:
        session.idle_timer = None
        timeout = self.config.idle_timeout
        if session.active or timeout is None or not session.usable:
            return  # busy again: the end of its last program sets the timer anew
        loop = asyncio.get_running_loop()
        due = session.idle_since + timeout
        if due > loop.time():  # runs came and went since the timer was set: idle for less than the timeout
            session.idle_timer = loop.call_at(due, self._idle_check, root, session)
            return
        task = loop.create_task(self._end_idle(root, session))
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end_idle(self, root: Path, session: Session) -> None:
        if session.active == 0:
            fut = self._sessions.get(root)
            if fut is not None and fut.done() and not fut.exception() and fut.result() is session:
                del self._sessions[root]
            await session.close()

    # -- sessions --------------------------------------------------------------------------------

    async def _session(self, ws: Workspace) -> Session:
        """The workspace's session: the running one, a pooled one renamed into place, or a new one."""
        assert ws.host_path is not None
        root = ws.host_path
        fut = self._sessions.get(root)
        if fut is not None and (not fut.done() or (fut.exception() is None and fut.result().usable)):
            return await asyncio.shield(fut)
        with self._lock:
            adopted = self._adopted.pop(root, None)
        if adopted is not None:
            session, inode = adopted
            if session.usable and await asyncio.to_thread(_same_inode, root, inode):
                fut = asyncio.get_running_loop().create_future()
                fut.set_result(session)
                self._sessions[root] = fut
                return session
            await session.close()
        fut = asyncio.ensure_future(self._start(ws))
        self._sessions[root] = fut
        try:
            return await asyncio.shield(fut)
        except BaseException:
            if self._sessions.get(root) is fut:
                del self._sessions[root]
            raise

    async def _start(self, ws: Workspace) -> Session:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            binary = os.open(self.supervisor, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        try:
            spec = RunProgramSpec(
                SUPERVISOR_PATH,
                [str(theirs.fileno())],
                cwd="",
                timeout=None,
                limits=self.config.limits(_BWRAP_OUTPUT),
            )
            runner = self.runner
            prep = runner.preparation.prepare(ws, spec)  # a path: never looked up, never CommandNotFound
            if self.sandbox.machine is not None:  # its first start seeds its layers: off the event loop
                await self.sandbox.seed_machine(prep.root)
            launch = self.sandbox.wrap(prep, runner.launch(prep, prep.argv, prep.env, prep.host_cwd), init_fd=binary)
        except BaseException:
            for sock in (ours, theirs):
                sock.close()
            os.close(binary)
            raise
        # bwrap has its own copies once started (or failed to start): ours go then
        launch.stack.after_spawn(functools.partial(os.close, binary))
        launch.stack.after_spawn(theirs.close)
        launch = replace(launch, pass_fds=(*launch.pass_fds, theirs.fileno()))
        owner = self._owner(ws) if self._owner is not None else None
        return await start_session(launch, ours, ws.id, self.config, owner=owner)

    def holds(self, ws: Workspace) -> bool:
        """Whether the workspace has a session (started, starting or adopted from the pool): its sandbox binds the
        workspace's tree for as long as it lives."""
        if ws.host_path is None:
            return False
        with self._lock:
            adopted = ws.host_path in self._adopted
        return adopted or ws.host_path in self._sessions

    async def stop(self, ws: Workspace) -> None:
        """End the workspace's session (everything in it dies with its supervisor), before its runner reaps its
        programs."""
        if ws.host_path is not None:
            fut = self._sessions.pop(ws.host_path, None)
            with self._lock:
                adopted = self._adopted.pop(ws.host_path, None)
            sessions = [adopted[0]] if adopted is not None else []
            if fut is not None:
                with contextlib.suppress(Exception):
                    sessions.append(await asyncio.shield(fut))
            await asyncio.gather(*(s.close() for s in sessions))

    async def aclose(self) -> None:
        """End every session of this engine, the pooled ones too. Idempotent."""
        if self.pool is not None:
            await self.pool.close()
        futures, self._sessions = list(self._sessions.values()), {}
        with self._lock:
            adopted, self._adopted = [s for s, _ in self._adopted.values()], {}
        sessions = list(adopted)
        for fut in futures:
            with contextlib.suppress(Exception):
                sessions.append(await asyncio.shield(fut))
        await asyncio.gather(*(s.close() for s in sessions))

    # -- the warm pool -----------------------------------------------------------------------------

    def adopt(self, ws_dir: Path) -> bool:
        """Make a pooled session's slot the new workspace ``ws_dir`` (from a worker thread)."""
        pooled = take_slot(self.pool, ws_dir) if self.pool is not None else None
        if pooled is None:
            return False
        with self._lock:
            self._adopted[ws_dir] = (pooled.session, _inode(ws_dir))
        return True

    def refill(self) -> None:
        if self.pool is not None:
            self.pool.refill()

    async def _make_pooled(self) -> _Pooled:
        slot = await asyncio.to_thread(self._make_slot)
        ws = Workspace(id=slot.name, path=SANDBOX_WORKSPACE, backend="sandbox", host_path=slot)
        try:
            return _Pooled(slot, await self._start(ws))
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, slot, True)
            raise

    def _make_slot(self) -> Path:
        private_dir(self._workspace_root, self._root_mode)  # same filesystem as the workspaces: atomic rename
        if not self._swept:  # the pool slots of an engine that died on this root (killed, its host crashed)
            sweep_stale_slots(self._workspace_root)
            self._swept = True
        with laid_out_slot(self._workspace_root) as slot:
            if self._prepare_slot is not None:
                self._prepare_slot(slot)
        return slot

    @staticmethod
    async def _discard_pooled(pooled: _Pooled) -> None:
        await pooled.session.close()
        await asyncio.to_thread(shutil.rmtree, pooled.host_dir, True)


def _own_sandboxes(runner: HostRunner, ws: Workspace) -> list[SupervisedProcess]:
    """The workspace's runs that needed a sandbox of their own (a session's runs are the session's)."""
    live = runner.live_processes(ws)
    return [p for p in live if not isinstance(p.transport, SessionTransport) and p.pid is not None]


def _same_inode(path: Path, inode: tuple[int, int]) -> bool:
    try:
        return _inode(path) == inode
    except OSError:
        return False
