"""The sandboxes of one e2b engine: created, found again by metadata, reused by id, killed only when ours.

Every SDK call goes through :func:`sdk_call`, which turns the SDK's exceptions into execspace errors that say what
was lost and what to do (a gone sandbox, a refused key, a full service, a service that does not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ...errors import (
    BackendError,
    CapabilityError,
    PathDenied,
    PathIsDirectory,
    SandboxLost,
    SetupFailed,
    WorkspaceNotFound,
)
from ...process.warmpool import WarmPool
from ...workspace.fileagent import agent_text
from ...workspace.layout import LAYOUT_DIRS, sanitize_id
from .network import sandbox_rules
from .options import E2BOptions

if TYPE_CHECKING:
    from e2b import AsyncCommandHandle
    from e2b_code_interpreter import AsyncSandbox

__all__ = ["HOME", "Box", "Sandboxes", "sdk_call"]

T = TypeVar("T")

#: The sandbox user's home, where E2B templates (and ``execspace serve``) put it.
HOME = "/home/user"
_WS_KEY = "execspace.workspace"
_WS_DIR = "execspace.directory"
#: The metadata of a sandbox made ahead for the pool (per turn the workspace's name is only informative).
_POOL_KEY = "execspace.pool"


#: The file agent's program (:mod:`execspace.workspace.fileagent`), uploaded once to each sandbox.
_AGENT = agent_text()
_AGENT_NAME = f".execspace/agent-{hashlib.sha256(_AGENT.encode()).hexdigest()[:12]}.py"


async def sdk_call(what: str, call: Awaitable[T], *, gone: str = "") -> T:
    """Await an SDK call, its failures as execspace errors naming ``what`` failed (``gone``: what a lost
    sandbox took with it)."""
    import httpx  # the SDK's transport: its errors escape the SDK on the files API
    from e2b import CommandExitException
    from e2b import exceptions as ex

    try:
        return await call
    except CommandExitException:
        raise  # a command's own exit status: for the caller to read
    except ex.AuthenticationException as exc:
        raise SetupFailed(
            "e2b", f"{what}: the E2B service refused the API key ({exc})", "check api_key / E2B_API_KEY"
        ) from exc
    except ex.RateLimitException as exc:
        raise BackendError(
            f"{what}: the E2B service is at capacity (429, after the SDK's retries honouring Retry-After); "
            "retry later, kill sandboxes you no longer need or raise the service's limit"
        ) from exc
    except ex.ServiceBusyException as exc:
        raise BackendError(f"{what}: the E2B service is busy (503); retry later") from exc
    except (ex.SandboxNotFoundException, ex.SandboxNotRunningException) as exc:
        raise SandboxLost(
            f"{what}: the sandbox is gone (expired after sandbox_timeout, or killed): {gone or 'its state'} "
            "was lost; create the workspace again to start afresh, and raise sandbox_timeout to keep it longer"
        ) from exc
    except ex.SandboxUnreachableException as exc:
        raise BackendError(f"{what}: cannot reach the E2B service ({exc}); is it up? check sandbox_url") from exc
    except (ex.TimeoutException, httpx.TimeoutException) as exc:
        raise BackendError(f"{what}: no answer within the timeout ({exc}); is the E2B service up?") from exc
    except ex.SandboxException as exc:
        raise BackendError(f"{what}: {exc}") from exc
    except (OSError, httpx.TransportError) as exc:
        raise BackendError(f"{what}: cannot reach the E2B service ({exc}); check api_url / sandbox_url") from exc


#: Seconds the agent waits for a request before it ends itself (a client that went away leaves none for long).
_AGENT_IDLE = 600
#: Seconds the agent has to exit once its stdin is closed, before its stream is cut.
_AGENT_EXIT = 2.0
#: Seconds the engine's close waits for the SDK's last answer to leave its HTTP client's thread (see ``aclose``).
_SDK_THREADS_SETTLE = 0.02


class _Lines:
    """The agent's stdout as whole lines (its output arrives in chunks cut anywhere)."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.stderr = ""
        self._partial = ""

    def feed(self, text: str) -> None:
        *whole, self._partial = (self._partial + text).split("\n")
        for line in whole:
            self.queue.put_nowait(line)

    def feed_err(self, text: str) -> None:
        self.stderr = (self.stderr + text)[-2000:]


class _AgentProcess:
    """The long-lived agent of one sandbox: requests on its stdin, one answer line each on its stdout."""

    def __init__(self, handle: AsyncCommandHandle[str], lines: _Lines) -> None:
        self.handle = handle
        self.lines = lines
        self.ended: asyncio.Future[int] = asyncio.ensure_future(self._exit_code())
        self.ended.add_done_callback(self._end_of_answers)

    def _end_of_answers(self, ended: asyncio.Future[int]) -> None:
        if not ended.cancelled():
            ended.exception()  # a broken stream is reported to whoever asks next (answer), not logged as lost
        self.lines.queue.put_nowait(None)

    async def _exit_code(self) -> int:
        from e2b import CommandExitException

        try:
            return int((await self.handle.wait()).exit_code)
        except CommandExitException as exc:
            return int(exc.exit_code)

    async def answer(self, what: str, within: float) -> str:
        try:
            line = await asyncio.wait_for(self.lines.queue.get(), within)
        except TimeoutError:
            raise BackendError(f"{what}: no answer within {within:g} s; is the E2B service up?") from None
        if line is not None:
            return line
        self.lines.queue.put_nowait(None)  # for whoever asks next: it stays ended
        try:
            code = await self.ended
        except Exception as exc:  # the stream broke, not the agent
            raise BackendError(f"{what}: the connection to the sandbox broke ({exc}); is the E2B service up?") from exc
        if code == 127:
            raise SetupFailed(
                "e2b",
                f"the sandbox's template has no python3, which the file checks need ({self.lines.stderr.strip()})",
                "use a template with python3 (code-interpreter-v1, base)",
            )
        raise BackendError(f"{what}: the file agent ended (exit {code}) before answering: {self.lines.stderr.strip()}")


@dataclass(eq=False)
class Box:
    """One sandbox as this engine holds it."""

    sandbox: AsyncSandbox
    owned: bool
    """Created by us (killed by ``cleanup``, and per turn at close); a sandbox given by id never is."""
    workspace: str
    """The key of the workspace it was made for ("" for a sandbox given by id)."""
    home: str = HOME
    """The home as programs see it: E2B's ``/home/user``, elsewhere where the service puts what its files API
    calls ``/home/user`` (``execspace serve`` today: the workspace's ``work/``); found as a command's cwd."""
    on_lost: Callable[[Box], Awaitable[str]] | None = None
    """What the engine does when the sandbox turns out gone (forget it, or replace it); says what it did."""
    timeout: float = 30.0
    """Seconds the agent may take to answer (the engine's ``request_timeout``)."""
    directory: str = ""
    """The name of its workspace's directory under ``.execspace/ws`` when it is not the key: a fork keeps its
    source's (renaming a directory of an overlay's lower layer would copy it whole); its metadata says so."""
    resume_for: int | None = None
    """Set while paused: the lifetime (seconds) it gets when the next call resumes it."""
    login_names: tuple[str, ...] | None = None
    """The names its login shell exports, once read (only ``EnvPolicy(inherit="all")`` needs them)."""
    _agent: _AgentProcess | None = field(default=None, init=False, repr=False)
    _agent_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    async def call(self, what: str, call: Awaitable[T]) -> T:
        """:func:`sdk_call` on this sandbox: a lost sandbox is reported naming its workspace, after
        :attr:`on_lost` has dealt with it. A paused sandbox is resumed first."""
        if self.resume_for is not None:
            try:
                await self.resume()
            except BaseException:
                if inspect.iscoroutine(call):
                    call.close()  # never to run: not left unawaited
                raise
        try:
            return await sdk_call(what, call, gone=f"the workspace {self.workspace!r} (sandbox {self.id})")
        except SandboxLost as exc:
            if self.on_lost is None:
                raise
            lost = f"the sandbox {self.id} is gone (expired after sandbox_timeout, or killed)"
            then = await self.on_lost(self)
            raise SandboxLost(f"{what}: {lost}: the workspace {self.workspace!r} was lost. {then}") from exc.__cause__

    async def resume(self) -> None:
        """Resume the paused sandbox (E2B's connect); its programs continue where they were."""
        lifetime, self.resume_for = self.resume_for, None
        try:
            await sdk_call(f"resuming sandbox {self.id}", self.sandbox.connect(timeout=lifetime))
        except BaseException:
            self.resume_for = lifetime
            raise

    def sdk_path(self, path: str) -> str:
        """The files-API path of ``path`` as programs see it (under :attr:`home`)."""
        return HOME + path[len(self.home) :]

    def root_of(self, key: str) -> str:
        name = self.directory if key == self.workspace and self.directory else key
        return f"{self.home}/.execspace/ws/{name}"

    def stage_dir(self) -> str:
        return f"{self.home}/.execspace/stage"

    @property
    def id(self) -> str:
        return str(self.sandbox.sandbox_id)

    async def agent(self, op: str, **args: object) -> Any:
        """Run one op of the in-sandbox agent; its refusals as execspace/OS errors."""
        request = json.dumps({"op": op, "args": args}) + "\n"
        async with self._agent_lock:  # one request at a time: answers come back in order on one stdout
            agent = await self._running_agent()
            try:
                await self.call(f"file operation {op}", agent.handle.send_stdin(request))
            except SandboxLost:
                raise
            except BackendError:
                # the service may answer "no such process" a moment before our stream of it ends
                await asyncio.wait([agent.ended], timeout=1.0)
                if not agent.ended.done():
                    raise
                # it had ended (idle, or killed) before the request: it never read it, a new one does
                agent = await self._running_agent()
                await self.call(f"file operation {op}", agent.handle.send_stdin(request))
            line = await agent.answer(f"file operation {op} in sandbox {self.id}", self.timeout)
        answer = json.loads(line)
        if "error" in answer:
            raise _refusal(*answer["error"])
        return answer["ok"]

    async def _running_agent(self) -> _AgentProcess:
        if self._agent is None or self._agent.ended.done():
            self._agent = await self._start_agent()
        return self._agent

    async def _start_agent(self) -> _AgentProcess:
        lines = _Lines()
        handle = await self.call(
            "starting the file agent",
            self.sandbox.commands.run(
                f"exec python3 {self.home}/{_AGENT_NAME} {_AGENT_IDLE}",
                background=True,
                stdin=True,
                timeout=0,  # it lives as long as it is used; it ends itself when idle
                on_stdout=lines.feed,
                on_stderr=lines.feed_err,
            ),
        )
        return _AgentProcess(handle, lines)

    def renew(self, fresh: Box) -> None:
        """Go on with ``fresh``'s sandbox in place of a lost one (every holder of this box moves on)."""
        self.sandbox, self.home, self._agent = fresh.sandbox, fresh.home, fresh._agent
        self.directory = fresh.directory

    async def release(self, *, gently: bool = True) -> None:
        """End our agent, as the sandbox may outlive this engine: its stdin closed (it exits) when ``gently``, and its
        stream ended before this returns. A stream left open is closed later by the SDK's HTTP client from a thread
        of its own, which aborts the interpreter when that happens as it exits."""
        agent, self._agent = self._agent, None
        if agent is None or agent.ended.done():
            return
        if gently:
            with contextlib.suppress(Exception):  # gone already: nothing left to end
                await agent.handle.close_stdin()
            await asyncio.wait([agent.ended], timeout=_AGENT_EXIT)
        if not agent.ended.done():
            await agent.handle.disconnect()
            await asyncio.wait([agent.ended])

    async def install_agent(self) -> None:
        await sdk_call("installing the file agent", self.sandbox.files.write(f"{HOME}/{_AGENT_NAME}", _AGENT))
        where = await sdk_call("finding the home", self.sandbox.commands.run("pwd"))
        self.home = where.stdout.strip() or HOME


def _refusal(kind: str, path: str, why: str) -> Exception:
    if kind == "PathDenied":
        return PathDenied(path, why)
    if kind == "FileNotFoundError":
        return FileNotFoundError(2, why, path)
    if kind == "IsADirectoryError":
        return PathIsDirectory(path, why)
    if kind == "PermissionError":  # the program's own mode bits, checked as it in the sandbox
        return PathDenied(path, why)
    if kind == "WorkspaceGone":
        return BackendError(f"the workspace directory {path} is gone from its sandbox: its files were lost")
    return BackendError(f"{kind} at {path!r}: {why}")


class Sandboxes:
    """The sandboxes of one engine, by workspace key (``sanitize_id`` of its id)."""

    def __init__(self, options: E2BOptions) -> None:
        self.options = options
        self._boxes: dict[str, Box] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._shared: Box | None = None
        self._turns: list[Box] = []
        self._pause_refused: str | None = None
        """The service, once it answered that it does not pause sandboxes."""
        self.pool: WarmPool[Box] | None = None
        if options.pool_size > 0:
            self.pool = WarmPool(
                options.pool_size, self._make_pooled, self._discard, idle_timeout=options.pool_age, starts_at_once=2
            )

    def start(self) -> None:
        """Begin filling the pool (on the event loop of the engine's calls)."""
        if self.pool is not None:
            self.pool.refill()

    def api(self) -> dict[str, Any]:
        """The connection options of every SDK call (unset ones: the SDK's environment variables)."""
        o = self.options
        given = {"api_key": o.api_key, "api_url": o.api_url, "domain": o.domain, "sandbox_url": o.sandbox_url}
        return {k: v for k, v in given.items() if v is not None} | {"request_timeout": o.request_timeout}

    def box(self, key: str) -> Box:
        found = self._boxes.get(key)
        if found is None:
            raise WorkspaceNotFound(f"workspace {key!r} is not open in this engine: create_workspace it first")
        return found

    async def for_workspace(self, key: str, *, create: bool = True) -> Box:
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if self.options.persistence == "session" and key in self._boxes:
                return self._boxes[key]
            box = await self._open(key, create)
            self._boxes[key] = box
            return box

    async def _open(self, key: str, create: bool) -> Box:
        if self.options.sandbox_id is not None:
            if self._shared is None:
                self._shared = await self._connect(self.options.sandbox_id)
            return self._shared
        if self.options.persistence == "session":
            found = await self._find(key)
            if found is not None:
                existing, directory = found
                box = Box(existing, True, key, on_lost=self._lost, timeout=self.options.request_timeout)
                box.directory = directory
                await box.install_agent()
                return box
        if not create:
            raise WorkspaceNotFound(f"no sandbox holds workspace {key!r} (it was cleaned up, or it expired)")
        box = await self._pooled(key) or await self._create(key)
        if self.options.persistence == "turn":
            self._turns.append(box)
        return box

    async def _connect(self, sandbox_id: str) -> Box:
        from e2b_code_interpreter import AsyncSandbox  # e2b's, with run_code

        sandbox = await sdk_call(
            f"connecting to sandbox {sandbox_id}",
            AsyncSandbox.connect(sandbox_id, timeout=self.options.sandbox_timeout, **self.api()),
            gone=f"sandbox {sandbox_id}",
        )
        box = Box(sandbox, False, "", on_lost=self._lost, timeout=self.options.request_timeout)
        await box.install_agent()
        return box

    async def _find(self, key: str) -> tuple[Any, str] | None:
        """The running or paused sandbox we made for workspace ``key`` (by its metadata), connected (which resumes
        a paused one), and the name of the workspace's directory in it; or None."""
        from e2b import SandboxQuery, SandboxState
        from e2b_code_interpreter import AsyncSandbox

        # the engine's own metadata too: another application's workspace of the same id is not this one
        # paused ones too: connect resumes them
        state = [SandboxState.RUNNING, SandboxState.PAUSED]
        query = SandboxQuery(metadata={**self.options.metadata, _WS_KEY: key}, state=state)
        paginator = AsyncSandbox.list(query=query, **self.api())
        listed = await sdk_call("listing sandboxes", paginator.next_items())
        mine = listed  # the key is ours: whatever template it has, it holds this workspace
        if not mine:
            return None
        sandbox = await sdk_call(
            f"connecting to sandbox {mine[0].sandbox_id}",
            AsyncSandbox.connect(mine[0].sandbox_id, timeout=self.options.sandbox_timeout, **self.api()),
            gone=f"workspace {key!r}",
        )
        return sandbox, (mine[0].metadata or {}).get(_WS_DIR, "")

    async def _pooled(self, key: str) -> Box | None:
        """A sandbox of the pool for workspace ``key``, its lifetime renewed; None when the pool has none."""
        if self.pool is None:
            return None
        self.pool.refill()  # behind this take
        while (box := self.pool.take()) is not None:
            box.workspace = key
            try:
                await box.call("renewing a pooled sandbox", box.sandbox.set_timeout(self.options.sandbox_timeout))
            except BackendError:  # gone meanwhile (killed, or the service lost it): the next one, or a create
                await self._discard(box)  # if it is still there, it is of no use
                continue
            return box
        return None

    async def _make_pooled(self) -> Box:
        return await self._create("", pooled=True)

    async def _discard(self, box: Box) -> None:
        with contextlib.suppress(BackendError):  # gone already: nothing to kill
            await self.kill(box)

    async def _create(self, key: str, template: str | None = None, directory: str = "", *, pooled: bool = False) -> Box:
        from e2b_code_interpreter import AsyncSandbox  # e2b's, with run_code

        o = self.options
        template = template or o.template
        # a pooled sandbox's workspace is not known yet (per turn its name is only informative anyway)
        ours = {_POOL_KEY: "1"} if pooled else {_WS_KEY: key, **({_WS_DIR: directory} if directory else {})}
        sandbox = await sdk_call(
            f"creating a sandbox from {template!r}",
            AsyncSandbox.create(
                template=template,
                timeout=o.sandbox_timeout,
                metadata={**o.metadata, **ours},
                envs=dict(o.env_vars),
                secure=o.secure,
                allow_internet_access=o.allow_internet_access or o.network is not None,
                **({"network": sandbox_rules(o.network)} if o.network is not None else {}),
                **self.api(),
            ),
        )
        box = Box(sandbox, True, key, on_lost=self._lost, timeout=self.options.request_timeout)
        box.directory = directory
        try:
            await box.install_agent()
        except BaseException:
            await asyncio.shield(self._discard(box))  # ours and of no use: never left running
            raise
        return box

    async def from_snapshot(self, key: str, snapshot_id: str, directory: str = "") -> Box:
        """A new sandbox of ours for workspace ``key``, created from a snapshot (not held yet: see :meth:`hold`);
        ``directory``: the name of the workspace's directory in it, when known and not ``key``."""
        return await self._create(key, snapshot_id, "" if directory == key else directory)

    def hold(self, key: str, box: Box) -> None:
        """Hold ``box`` as workspace ``key``'s, as if ``for_workspace`` had made it."""
        self._boxes[key] = box
        if self.options.persistence == "turn":
            self._turns.append(box)

    async def keys_in_use(self) -> set[str]:
        """The workspace keys open in this engine, and per session those of the running sandboxes with its
        metadata (another engine's too)."""
        keys = set(self._boxes)
        if self.options.persistence == "session" and self.options.sandbox_id is None:
            from e2b import SandboxQuery, SandboxState
            from e2b_code_interpreter import AsyncSandbox

            state = [SandboxState.RUNNING, SandboxState.PAUSED]
            query = SandboxQuery(metadata=dict(self.options.metadata) or None, state=state)
            pages = AsyncSandbox.list(query=query, **self.api())
            listed = await sdk_call("listing sandboxes", pages.next_items())
            while pages.has_next:
                listed += await sdk_call("listing sandboxes", pages.next_items())
            keys |= {k for s in listed if (k := (s.metadata or {}).get(_WS_KEY))}
        return keys

    async def _lost(self, box: Box) -> str:
        """Deal with ``box``'s sandbox being gone: per session (and a sandbox given by id) it is forgotten, so
        that the next ``create_workspace`` starts afresh; per turn a fresh sandbox takes its place at once."""
        if not box.owned:
            self._shared = None
            self._boxes = {k: b for k, b in self._boxes.items() if b is not box}
            return "It was given by sandbox_id: point sandbox_id at a running sandbox."
        if self.options.persistence == "session":
            if self._boxes.get(box.workspace) is box:
                del self._boxes[box.workspace]
            return "create_workspace makes a fresh sandbox for it; raise sandbox_timeout to keep sandboxes longer."
        try:
            fresh = await self._create(box.workspace)
            await fresh.agent("layout", ws=fresh.root_of(box.workspace), dirs=list(LAYOUT_DIRS))
        except BackendError as exc:
            return f"Recreating it failed too: {exc}"
        box.renew(fresh)
        return (
            f"A fresh sandbox ({box.id}) now holds the workspace, empty (per-turn persistence keeps nothing): "
            "put its inputs again and retry."
        )

    async def pause(self, key: str) -> None:
        """Pause the sandbox of workspace ``key`` (resumed by its next call).

        Raises:
            CapabilityError: the sandbox is shared (``sandbox_id``), or the service does not pause sandboxes
                (it answered 501 or 405 once; not asked again).
        """
        from e2b import SandboxException

        box = self.box(key)
        if not box.owned:
            raise CapabilityError(
                "pausing a sandbox given by sandbox_id", "e2b", "Pause it where it was made: it is not this engine's."
            )
        if self._pause_refused is not None:
            raise CapabilityError(f"pausing sandboxes (the service at {self._pause_refused})", "e2b", _NO_PAUSE)
        if box.resume_for is not None:
            return
        await box.release()  # our file agent: a new one starts after the resume
        try:
            await sdk_call(f"pausing sandbox {box.id}", _refused_as(box.sandbox.pause(), SandboxException))
        except _Unsupported as exc:
            self._pause_refused = self.options.api_url or "E2B's default API"
            raise CapabilityError(f"pausing sandboxes (the service said: {exc})", "e2b", _NO_PAUSE) from None
        box.resume_for = self.options.sandbox_timeout

    async def resume(self, key: str) -> None:
        """Resume the sandbox of workspace ``key`` if it is paused."""
        box = self.box(key)
        if box.resume_for is not None:
            await box.resume()

    async def forget(self, key: str) -> None:
        """Drop workspace ``key``: its sandbox is killed when it is ours and only its own (per turn, then not again
        when the engine closes: a job that kills its hundreds of sandboxes as it goes would wait for as many calls)."""
        box = self._boxes.pop(key, None)
        if box is not None and box.owned:
            await self.kill(box)
            with contextlib.suppress(ValueError):  # not a turn's
                self._turns.remove(box)

    @staticmethod
    async def kill(box: Box) -> None:
        if not box.owned:
            return
        box.resume_for = None  # a paused one is killed as it is
        await box.release(gently=False)
        await sdk_call(f"killing sandbox {box.id}", box.sandbox.kill())

    async def aclose(self) -> None:
        """Kill the per-turn and pooled sandboxes; session ones stay (found again by their metadata) until they
        expire."""
        if self.pool is not None:
            await self.pool.close()
        turns, self._turns = self._turns, []
        kept = [b for b in {*self._boxes.values(), *([self._shared] if self._shared else [])} if b not in turns]
        self._boxes.clear()
        self._shared = None
        for box in kept:
            box.resume_for = None  # a paused one stays paused: the next engine's connect resumes it
            await box.release()
        for box in turns:
            with contextlib.suppress(BackendError):  # gone already, or the service is down: it expires on its own
                await self.kill(box)
        # The SDK's HTTP client (pyqwest) answers each call from a thread of its own, which takes the GIL back after
        # waking the loop: if the interpreter starts to exit meanwhile, Python before 3.14 ends that thread, and
        # ending a Rust thread aborts the process (exit 134 after all the work was done, 1 exit in 30 measured).
        # Waiting in the loop a moment lets the last answer's thread finish first.
        await asyncio.sleep(_SDK_THREADS_SETTLE)


_NO_PAUSE = (
    "Pause needs a service that pauses sandboxes: E2B cloud, or execspace serve; elsewhere keep the sandbox "
    "running (raise sandbox_timeout) or snapshot its files."
)


class _Unsupported(Exception):
    """The service answered that it has no such operation (501 or 405)."""


async def _refused_as(call: Awaitable[T], sdk_error: type[Exception]) -> T:
    try:
        return await call
    except sdk_error as exc:
        if str(exc).startswith(("501", "405")):
            raise _Unsupported(str(exc)) from exc
        raise


def workspace_key(exec_id: str) -> str:
    return sanitize_id(exec_id)
