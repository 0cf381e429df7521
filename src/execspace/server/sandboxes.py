"""The live sandboxes: one workspace each on the server's Engine, with E2B's lifetime, metadata and token.

Creation reserves a slot before it awaits anything, so ``max_sandboxes`` holds under concurrent creates; it takes
a ready sandbox from the pool (:mod:`.pool`) when there is one, which awaits nothing at all. Kill and
expiry drop the sandbox from the table first (every later request for it answers "not found") and then remove
its workspace with everything in it, its programs included.

A paused sandbox keeps its programs, held still (through the runner's :class:`~execspace.protocols.SupportsFreezing`:
the cgroup freezer as root, else ``SIGSTOP`` sent again to whatever wakes; its kernels and contexts are programs of
its session too), in memory: nothing is persisted, and a server that ends takes it with it. Its lifetime clock
stops with it. A sandbox is never reported paused while a program of it runs: a pause whose programs cannot all be
held fails (:class:`~execspace.errors.FreezeFailed`) and leaves it running, its clock too.

The server pauses an ``autoPause`` sandbox that has been idle for its ``idle_pause`` (:mod:`.idle`, which decides
when): such a pause is the server's, and the sandbox's next request resumes it, ``autoResume`` or not; a request
that comes while it is being made waits for it, then resumes it (:meth:`Sandboxes.wake`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from ..errors import CapabilityError, ExecspaceError, FreezeFailed, ProgramNotFound, WorkspaceNotFound
from ..models import RunProgramSpec, RunResult, Snapshot, Workspace
from ..protocols import Engine, ProgramHandle, SupportsFreezing, SupportsSnapshots
from .activity import Activity
from .events import Events, Refused, SandboxChanged
from .ledger import Ledger
from .network import SandboxEgress
from .options import ServerOptions
from .paths import USER
from .pool import ReadySandbox, SandboxPool, workspace_policy
from .shares import SandboxShare, ShareLimits
from .watch import DirectoryWatch, Watches

__all__ = ["CreateRequest", "Sandbox", "SandboxGone", "Sandboxes", "SandboxesFull"]

_log = logging.getLogger("execspace.server")


class SandboxGone(ExecspaceError, LookupError):
    """No live sandbox has that id (never created, killed, or expired)."""

    def __init__(self, sandbox_id: str) -> None:
        super().__init__(f"The sandbox {sandbox_id} was not found; it was killed, it expired or it never existed")
        self.sandbox_id = sandbox_id


class SandboxesFull(ExecspaceError):
    """The server runs its maximum of sandboxes; retry after one ends."""


@dataclass(frozen=True, slots=True)
class CreateRequest:
    template: str
    timeout: int
    metadata: dict[str, str]
    env_vars: dict[str, str]
    secure: bool = True
    egress: SandboxEgress = field(default_factory=SandboxEgress)
    """Its commands' network (off, on, or an allow-list) and the rules it was asked with."""
    snapshot: Snapshot | None = None
    """The snapshot it starts from (its ``templateID`` named one), else an empty workspace."""
    auto_pause: bool = False
    """Paused instead of killed when its timeout fires (E2B's ``autoPause``)."""
    auto_resume: bool = False
    """Resumed by the first envd or code-interpreter request that reaches it paused (E2B's ``autoResume``)."""
    owner: str = ""
    """The team (the :func:`~.options.key_id` of the API key) it belongs to."""


@dataclass(slots=True)
class Sandbox:
    """One live sandbox. Mutable: its end time moves with set-timeout and connect."""

    id: str
    template: str
    engine: Engine
    """The engine of its template's profile (environment and limits): its workspace, files and programs are there."""
    workspace: Workspace
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: datetime
    end_at: datetime
    access_token: str | None
    """What envd's routes need (``X-Access-Token``); None: an unsecured sandbox, open to whoever knows its id."""
    traffic_token: str | None = None
    """What the code interpreter's routes take instead (``E2B-Traffic-Access-Token``, which the SDK sends with
    ``/contexts``); None exactly when ``access_token`` is."""
    owner: str = ""
    """The team (the :func:`~.options.key_id` of the API key that created it) whose control-plane requests find it;
    another key's get 404, as for a sandbox that does not exist (an admin key's find every one)."""
    egress: SandboxEgress = field(default_factory=SandboxEgress)
    share: SandboxShare = field(default_factory=lambda: SandboxShare(ShareLimits()))
    """What it holds of the server (file operations, commands, streams, watchers) against its caps."""
    watchers: dict[str, tuple[DirectoryWatch, bool]] = field(default_factory=dict)
    """Polling watchers by id, with whether their events carry the entry."""
    watches: Watches = field(default_factory=Watches)
    """Every live watch, polled or streamed: what the file API writes is told to those it concerns."""
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the sandbox is killed or expires: its streams end."""
    waiting: dict[int, asyncio.Task[RunResult]] = field(default_factory=dict)
    """One task per started program, by pid, waiting for its end (which also lets its output flow when nobody
    reads): its result comes once what its end reports (``on_end``) is done."""
    auto_pause: bool = False
    auto_resume: bool = False
    paused: AsyncExitStack | None = None
    """While paused: what holds its programs and kernels stopped (closing it lets them continue)."""
    left: timedelta = timedelta(0)
    """While paused: what was left of its lifetime when it was paused."""
    turning: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while it is being paused or resumed: one turn at a time, a kill waits for it."""
    idle_pause: float | None = None
    """Seconds it may be idle before the server pauses it (an ``autoPause`` sandbox's, :mod:`.idle`); None: never."""
    idle_paused: bool = False
    """Paused by the server for its idleness, or being so: its next request resumes it."""
    activity: Activity = field(default_factory=Activity)
    """Its requests, as its idleness sees them."""

    @classmethod
    def pooled(cls, sandbox_id: str, template: str, engine: Engine, workspace: Workspace) -> Sandbox:
        """A pooled sandbox as its programs started ahead of its create see it: its id, no ``envVars``, the network
        off (the taker compares what the create asked for, see ``CodeInterpreter.adopt``)."""
        now = _now()
        return cls(sandbox_id, template, engine, workspace, {}, {}, now, now, None)

    @property
    def state(self) -> str:
        """``running`` or ``paused`` (by its owner, its timeout or its idleness: :attr:`idle_paused` says which)."""
        return "paused" if self.paused is not None else "running"

    def expired(self) -> bool:
        """Whether its lifetime is over (an auto-pause sandbox's is the reaper's to pause: it is not over)."""
        return not self.auto_pause and self.end_at <= _now()

    @property
    def allow_internet_access(self) -> bool:
        """Whether its commands reach the whole network (its info's ``allowInternetAccess``)."""
        return self.egress.internet

    @property
    def whole_view(self) -> bool:
        """Whether the file API serves paths outside the home too (:mod:`.wholeview`): where one sandbox holds
        every program of it (the sandbox backend's session mode), whose ``/tmp`` and system the file agent sees."""
        engine = self.engine
        return engine.name == "sandbox" and str(engine.describe().details.get("mode", "")).startswith("session")

    def program_env(self) -> dict[str, str]:
        """What every program of the sandbox starts with, as E2B's envd gives it: the user, the sandbox's marks and
        its ``envVars`` (a command's or cell's own go on top)."""
        return {"USER": USER, "E2B_SANDBOX": "true", "E2B_SANDBOX_ID": self.id, **self.env_vars}

    def context_process(self, cmd: str, args: Sequence[str], cwd: str, tag: str) -> RunProgramSpec:
        """A code context's process (a Python kernel, a Node REPL): started like a command, with the commands'
        environment and network, and no deadline (it lives until the context is removed or the sandbox ends)."""
        env = self.program_env()
        return RunProgramSpec(cmd, tuple(args), env=env, cwd=cwd, timeout=None, network=self.egress.network, tag=tag)

    def keep_waiting(self, handle: ProgramHandle, on_end: Callable[[RunResult], None] | None = None) -> None:
        """Wait for a started program in the background; it counts in the sandbox's share until it ends, and
        ``on_end`` is told its result first (:meth:`ended` waits for that)."""
        task = asyncio.ensure_future(_waited(handle, on_end))
        pid = handle.pid or 0
        self.waiting[pid] = task
        task.add_done_callback(lambda t: self.waiting.pop(pid, None) if self.waiting.get(pid) is t else None)
        task.add_done_callback(lambda _: self.share.programs.give_back())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a failure is the followers' to report

    async def ended(self, handle: ProgramHandle) -> RunResult:
        """A program's result, once its end was reported (:meth:`keep_waiting`): what a stream sends last."""
        task = self.waiting.get(handle.pid or 0)
        return await (asyncio.shield(task) if task is not None else handle.wait())


async def _waited(handle: ProgramHandle, on_end: Callable[[RunResult], None] | None) -> RunResult:
    result = await handle.wait()
    if on_end is not None:
        on_end(result)
    return result


def _now() -> datetime:
    return datetime.now(UTC)


def _freezing(sandbox: Sandbox) -> SupportsFreezing:
    runner = sandbox.engine.runner
    if not isinstance(runner, SupportsFreezing):
        raise CapabilityError("pausing sandboxes", sandbox.engine.name, "Serve the sandbox or local backend.")
    return runner


#: The engine that serves a template's sandboxes (see serve.py): opened on first use.
EngineFor = Callable[[str], Awaitable[Engine]]


class Sandboxes:
    """The table of live sandboxes and the reaper that ends expired ones."""

    def __init__(
        self,
        engine: Engine,
        options: ServerOptions,
        ledger: Ledger | None = None,
        engine_for: EngineFor | None = None,
        events: Events | None = None,
    ) -> None:
        """``engine``: the default one (a snapshot's sandboxes, the server's capabilities); ``engine_for``: each
        template's (the default engine for every template without it); ``events``: who is told of what happens
        (:mod:`.events`)."""
        self.engine = engine
        self.events = events or Events()
        self.engine_for = engine_for or self._default_engine
        self.options = options
        self.ledger = ledger or Ledger(None)
        """Where this server records its sandboxes for the next one, should it die (see ledger.py)."""
        self._live: dict[str, Sandbox] = {}
        self._reserved = 0
        self._removing: set[asyncio.Task[None]] = set()
        self._closing = False
        """Set by :meth:`close`: a create still in flight removes what it made instead of adding it."""
        self.on_remove: list[Callable[[Sandbox], Awaitable[None]]] = []
        """Run when a sandbox ends, before its workspace is removed (its kernels stop there)."""
        self.on_take: list[Callable[[Sandbox, ReadySandbox], Awaitable[None]]] = []
        """Run when a create took a pooled sandbox, with what the pool made ahead (its warm kernel is adopted)."""
        self.pool = SandboxPool(self.engine_for, dict(options.pool_sizes), self._room, self.ledger)

    async def _default_engine(self, template: str) -> Engine:
        return self.engine

    def _room(self) -> int:
        return self.options.max_sandboxes - len(self._live) - self._reserved

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(list(self._live.values()))

    def get(self, sandbox_id: str) -> Sandbox:
        sandbox = self._live.get(sandbox_id)
        if sandbox is None or sandbox.expired():
            raise SandboxGone(sandbox_id)
        return sandbox

    def by_token(self) -> Iterator[Sandbox]:
        return (s for s in self._live.values() if s.access_token is not None)

    async def create(self, request: CreateRequest) -> Sandbox:
        if len(self._live) + self._reserved >= self.options.max_sandboxes:
            raise self._full(
                request.owner,
                f"this server already runs its maximum of {self.options.max_sandboxes} sandboxes; "
                "retry when one ends, or start it with a larger --max-sandboxes",
            )
        return await self._create(request)

    def _full(self, key: str, message: str) -> SandboxesFull:
        """The refusal of a sandbox there is no room for, told to the listeners."""
        if self.events.listening:
            self.events(Refused("capacity", key, message))
        return SandboxesFull(message)

    def _tell(self, kind: Literal["create", "kill", "expire", "pause", "resume", "shutdown"], sandbox: Sandbox) -> None:
        if self.events.listening:
            self.events(SandboxChanged(kind, sandbox.id, sandbox.template, sandbox.owner))

    async def _create(self, request: CreateRequest) -> Sandbox:
        ready = self.pool.take(request.template) if request.snapshot is None else None
        if ready is not None:
            sandbox = self._started(request, ready.sandbox_id, ready.engine, ready.workspace)
            self.pool.refill()
            for hook in self.on_take:
                await hook(sandbox, ready)
            return sandbox
        self._reserved += 1
        try:
            engine = self.engine if request.snapshot is not None else await self.engine_for(request.template)
            sandbox_id = self.ledger.new_id()
            policy = workspace_policy()
            try:
                if request.snapshot is not None:
                    (ws,) = await self.snapshots().fork(request.snapshot, ids=[f"e2b/{sandbox_id}"], policy=policy)
                else:
                    ws = await engine.manager.create_workspace(f"e2b/{sandbox_id}", policy)
            except BaseException:
                self.ledger.forget(sandbox_id)  # the manager left nothing of a failed create
                raise
            await self._unless_closing([(sandbox_id, engine, ws)])
            return self._started(request, sandbox_id, engine, ws)
        finally:
            self._reserved -= 1
            self.pool.refill()

    def _started(self, request: CreateRequest, sandbox_id: str, engine: Engine, ws: Workspace) -> Sandbox:
        """The live sandbox over ``ws``, with what the create asked for."""
        started = _now()
        sandbox = Sandbox(
            id=sandbox_id,
            template=request.template,
            engine=engine,
            workspace=ws,
            metadata=request.metadata,
            env_vars=request.env_vars,
            started_at=started,
            end_at=started + timedelta(seconds=request.timeout),
            access_token=secrets.token_urlsafe(24) if request.secure else None,
            traffic_token=secrets.token_urlsafe(24) if request.secure else None,
            owner=request.owner,
            share=SandboxShare(self.options.share),
            egress=request.egress,
            auto_pause=request.auto_pause,
            auto_resume=request.auto_resume,
            idle_pause=self.options.idle_pause_of(request.template) if request.auto_pause else None,
        )
        self._live[sandbox_id] = sandbox
        self._tell("create", sandbox)  # live from here: a list finds it, a kill may end it
        return sandbox

    async def fork(self, source: Sandbox, count: int, lifetime: int, owner: str) -> list[Sandbox]:
        """``count`` new sandboxes of ``owner`` starting with the files of ``source`` (its processes are not forked:
        each fork starts with none). All or none: a failure raises and leaves no fork.

        Raises:
            SandboxesFull: fewer than ``count`` sandboxes fit under the server's maximum.
            CapabilityError: the engine's workspaces cannot be forked.
        """
        manager = self.snapshots(source.engine)
        if len(self._live) + self._reserved + count > self.options.max_sandboxes:
            raise self._full(
                owner,
                f"{count} more sandboxes do not fit this server's maximum of {self.options.max_sandboxes}; "
                "fork fewer, kill some, or start it with a larger --max-sandboxes",
            )
        self._reserved += count
        try:
            new_ids = [self.ledger.new_id() for _ in range(count)]
            try:
                workspaces = await manager.fork(
                    source.workspace, count, [f"e2b/{i}" for i in new_ids], policy=workspace_policy()
                )
            except BaseException:
                for sandbox_id in new_ids:  # all or none: none was left
                    self.ledger.forget(sandbox_id)
                raise
            started = _now()
            forks = [
                Sandbox(
                    id=sandbox_id,
                    template=source.template,
                    engine=source.engine,
                    workspace=ws,
                    metadata=dict(source.metadata),
                    env_vars=dict(source.env_vars),
                    started_at=started,
                    end_at=started + timedelta(seconds=lifetime),
                    access_token=secrets.token_urlsafe(24) if source.access_token is not None else None,
                    traffic_token=secrets.token_urlsafe(24) if source.access_token is not None else None,
                    owner=owner,
                    share=SandboxShare(self.options.share),
                    egress=source.egress,
                )
                for sandbox_id, ws in zip(new_ids, workspaces, strict=True)
            ]
            await self._unless_closing([(i, source.engine, ws) for i, ws in zip(new_ids, workspaces, strict=True)])
            self._live.update((f.id, f) for f in forks)
            for made in forks:
                self._tell("create", made)
            return forks
        finally:
            self._reserved -= count

    def snapshots(self, engine: Engine | None = None) -> SupportsSnapshots:
        """The manager of ``engine`` (a sandbox's: it stops that sandbox's programs while it copies; default: the
        server's), which snapshots and forks workspaces (``CapabilityError`` when it cannot)."""
        engine = engine or self.engine
        manager = engine.manager
        if not isinstance(manager, SupportsSnapshots):
            raise CapabilityError("snapshots and forks", engine.name, "Serve the sandbox or local backend.")
        return manager

    def set_timeout(self, sandbox: Sandbox, seconds: int) -> None:
        if sandbox.paused is not None:  # its clock is stopped: what it will have when it resumes
            sandbox.left = timedelta(seconds=seconds)
        else:
            sandbox.end_at = _now() + timedelta(seconds=seconds)

    def extend(self, sandbox: Sandbox, seconds: int) -> None:
        """Make the sandbox live at least ``seconds`` more (connect never shortens a lifetime)."""
        sandbox.end_at = max(sandbox.end_at, _now() + timedelta(seconds=seconds))

    async def pause(self, sandbox: Sandbox) -> bool:
        """Stop every program and kernel of the sandbox and its lifetime clock; False if it was paused already.
        One the server paused for its idleness becomes the caller's: its traffic no longer resumes it (unless it
        has ``autoResume``).

        Raises:
            CapabilityError: the engine's runner cannot stop a workspace's programs.
            FreezeFailed: its programs could not all be held still: it was not paused, they and its clock run on.
        """
        runner = _freezing(sandbox)
        async with sandbox.turning:
            if sandbox.paused is not None and sandbox.idle_paused:
                sandbox.idle_paused = False
                return True
            if sandbox.paused is not None or sandbox.closed.is_set():
                return False
            await self._hold(sandbox, runner)
        return True

    async def pause_idle(self, sandbox: Sandbox, still_idle: Callable[[], bool]) -> bool:
        """Pause the sandbox for its idleness (:mod:`.idle`) if, once its turn comes, it is running and
        ``still_idle()``; False if not. Its next request resumes it (:meth:`wake`), which waits for the pause first.

        Raises:
            FreezeFailed: its programs could not all be held still: it was not paused, they and its clock run on.
        """
        runner = _freezing(sandbox)
        async with sandbox.turning:
            if sandbox.paused is not None or sandbox.closed.is_set() or not still_idle():
                return False
            sandbox.idle_paused = True  # from here a request wakes it: it waits for this turn, then resumes it
            try:
                await self._hold(sandbox, runner)
            except BaseException:
                sandbox.idle_paused = False
                raise
        return True

    async def wake(self, sandbox: Sandbox) -> None:
        """Resume a sandbox the server paused (or is pausing) for its idleness, for a request of it."""
        async with sandbox.turning:  # a pause in flight is over first; its owner may have made it theirs since
            if sandbox.idle_paused:
                await self._let_go(sandbox)

    async def _hold(self, sandbox: Sandbox, runner: SupportsFreezing) -> None:
        """Hold its programs still and stop its clock (its turn is taken)."""
        held = AsyncExitStack()  # keep_paused adds to it what starts meanwhile
        await held.enter_async_context(runner.frozen(sandbox.workspace))
        sandbox.left = max(sandbox.end_at - _now(), timedelta(0))
        sandbox.paused = held
        self._tell("pause", sandbox)

    async def keep_paused(self, sandbox: Sandbox) -> None:
        """Stop a program that started while the sandbox was being paused (its request came in before): after
        the pause, everything of the workspace is held once more (what is held already stays so). If that
        fails, the sandbox is resumed: it is never reported paused while something of it runs."""
        runner = sandbox.engine.runner
        async with sandbox.turning:
            if sandbox.paused is None or not isinstance(runner, SupportsFreezing):
                return
            try:
                await sandbox.paused.enter_async_context(runner.frozen(sandbox.workspace))
                return
            except FreezeFailed as exc:
                _log.warning("sandbox %s resumed: a program started while it was paused: %s", sandbox.id, exc)
        await self.resume(sandbox)

    async def resume(self, sandbox: Sandbox, lifetime: int | None = None) -> bool:
        """Let a paused sandbox's programs and kernels continue and its clock run again with what was left of
        it, at least ``lifetime`` seconds (the server's default when neither is there, as after an auto-pause);
        False if it was not paused."""
        async with sandbox.turning:
            return await self._let_go(sandbox, lifetime)

    async def _let_go(self, sandbox: Sandbox, lifetime: int | None = None) -> bool:
        """:meth:`resume`, its turn taken."""
        if sandbox.paused is None:
            return False
        held, sandbox.paused = sandbox.paused, None
        sandbox.idle_paused = False
        asked = timedelta(seconds=lifetime or 0)
        left = sandbox.left or asked or timedelta(seconds=self.options.default_timeout)
        sandbox.end_at = _now() + max(left, asked)
        await held.aclose()
        self._tell("resume", sandbox)
        return True

    async def kill(self, sandbox_id: str) -> bool:
        """End the sandbox and remove everything of it; False if there was none."""
        sandbox = self._live.pop(sandbox_id, None)
        if sandbox is None:
            return False
        self._tell("kill", sandbox)  # gone for its clients from here, whatever its removal meets
        try:
            await self._remove(sandbox)
        finally:
            self.pool.refill()  # its room is free again
        return True

    async def _remove(self, sandbox: Sandbox) -> None:
        sandbox.closed.set()
        # a stopped kernel answers no shutdown and a stopped program no SIGTERM: they continue to end
        await self.resume(sandbox)
        for hook in self.on_remove:
            try:
                await hook(sandbox)
            except Exception:
                _log.exception("ending sandbox %s: %s failed", sandbox.id, hook)
        try:
            await self._end_commands(sandbox)
            await sandbox.engine.manager.cleanup(sandbox.workspace)
            self.ledger.forget(sandbox.id)
        except Exception:
            # the sandbox is gone for its clients either way; say loudly that its workspace may be left
            _log.exception("removing the workspace of sandbox %s failed", sandbox.id)
            raise

    async def _end_commands(self, sandbox: Sandbox) -> None:
        """Kill the sandbox's commands and wait until each has ended, its bookkeeping in the workspace included,
        so that nothing writes into the workspace while it is removed."""
        runner, ws = sandbox.engine.runner, sandbox.workspace

        async def kill(pid: int) -> None:
            with contextlib.suppress(ProgramNotFound):
                await (await runner.get_program(ws, pid)).kill()

        await asyncio.gather(*(kill(p.pid) for p in await runner.list_programs(ws)), return_exceptions=True)
        await asyncio.gather(*sandbox.waiting.values(), return_exceptions=True)

    async def reap(self) -> None:
        """End expired sandboxes until cancelled; each removal runs on its own, so a slow one delays no other."""
        while True:
            now = _now()
            for sandbox in [s for s in self._live.values() if s.end_at <= now and s.paused is None]:
                if sandbox.auto_pause:
                    self._pause_expired(sandbox)
                    continue
                self._live.pop(sandbox.id, None)
                self._tell("expire", sandbox)
                task = asyncio.create_task(self._remove(sandbox))
                self._removing.add(task)
                task.add_done_callback(self._removing.discard)
                task.add_done_callback(lambda _: self.pool.refill())
            await asyncio.sleep(self.options.reap_interval)

    def _pause_expired(self, sandbox: Sandbox) -> None:
        """Pause an expired auto-pause sandbox; its end moves out of the reaper's sight at once, and back to
        when it expired once it is paused."""
        expired, sandbox.end_at = sandbox.end_at, datetime.max.replace(tzinfo=UTC)
        task = asyncio.create_task(self._pause_or_remove(sandbox, expired))
        self._removing.add(task)
        task.add_done_callback(self._removing.discard)

    async def _pause_or_remove(self, sandbox: Sandbox, expired: datetime) -> None:
        try:
            await self.pause(sandbox)
        except Exception:
            _log.exception("auto-pausing sandbox %s failed: it is removed", sandbox.id)
            if self._live.pop(sandbox.id, None) is not None:
                await self._remove(sandbox)
                self.pool.refill()
            return
        sandbox.end_at, sandbox.left = expired, timedelta(0)

    async def _unless_closing(self, made: list[tuple[str, Engine, Workspace]]) -> None:
        """Remove what a create made while the server began to stop (its list of sandboxes to end is taken)."""
        if not self._closing:
            return
        for sandbox_id, engine, ws in made:
            await engine.manager.cleanup(ws)
            self.ledger.forget(sandbox_id)
        raise SandboxesFull("the server is stopping: create the sandbox on a running one")

    async def close(self) -> None:
        """Kill every sandbox, the pooled ones too (server shutdown)."""
        self._closing = True
        await self.pool.close()  # first: nothing refills it afterwards
        sandboxes = list(self._live.values())
        self._live.clear()
        for sandbox in sandboxes:
            self._tell("shutdown", sandbox)
        await asyncio.gather(*(self._remove(s) for s in sandboxes), return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._removing, return_exceptions=True)
        self.ledger.close()

    async def remove_abandoned(self) -> int:
        """Remove the workspaces of dead servers on this root (see ledger.py); how many there were."""
        removed = 0
        for sandbox_ids, record in self.ledger.abandoned():
            for sandbox_id in sandbox_ids:
                try:
                    ws = await self.engine.manager.get_workspace(f"e2b/{sandbox_id}")
                    await self.engine.manager.cleanup(ws)
                    removed += 1
                    self.ledger.settled(record, sandbox_id)
                except WorkspaceNotFound:  # its server died before the workspace was made, or after it was removed
                    self.ledger.settled(record, sandbox_id)
                except Exception:
                    _log.exception("removing sandbox %s, left by a server that died (%s), failed", sandbox_id, record)
        return removed
