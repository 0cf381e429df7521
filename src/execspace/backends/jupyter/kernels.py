"""One Jupyter kernel per workspace: started on first use, kept across calls, replaced when it dies.

The kernel runs either inside the OS sandbox (:mod:`.sandboxed`: a sandbox program reached over IPC
sockets) or on this host as the caller (no isolation, started by ``jupyter_client``'s kernel manager).
Either way its working directory is the workspace's ``work/`` and its environment is built by the same
:class:`EnvPolicy` as programs', so host secrets are not inherited.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import queue
import re
import secrets
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from ...envpolicy import EnvPolicy
from ...errors import SetupFailed, UnsupportedLanguage, UsageError
from ...languages import resolve_language
from ...models import DEFAULT_OUTPUT_BYTES, DEFAULT_TIMEOUT, BlockResult, CodeBlock, ResourceLimits, Workspace
from ...protocols import WorkspaceFS
from ...workspace.layout import workspace_env
from .outputs import CellOutputs
from .pool import KernelPool, PooledKernel

with warnings.catch_warnings():
    # jupyter_core warns about its platformdirs migration on import; nothing for our callers to act on
    warnings.simplefilter("ignore", DeprecationWarning)
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager

__all__ = ["CellResult", "KernelSessions"]

#: Exit codes of a cell, shaped like a program's: 0 ok, 1 exception, -2 interrupted (SIGINT), -9 restarted;
#: a kernel that died gives its own exit status.
EXIT_OK, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_RESTARTED = 0, 1, -2, -9
#: How often a silent cell checks that its kernel is still alive.
_LIVENESS_POLL = 0.25
_CELL_FILE = re.compile(r"^cell-(\d+)-")


@dataclass(frozen=True, slots=True)
class CellResult:
    """What one cell produced."""

    exit_code: int
    text: str
    """stdout, stderr, ``text/plain`` results, tracebacks and execspace's notes, in the order they came."""
    stdout: str
    stderr: str
    files: tuple[str, ...]
    """Workspace paths of the rich outputs saved under ``out/``."""
    duration: float
    timed_out: bool = False
    error: tuple[str, str] | None = None
    """(exception name, value) when the cell raised."""
    kernel_died: bool = False
    state_lost: bool = False
    """The kernel's variables and imports are gone (it died or was restarted)."""
    truncated: bool = False


class KernelProcess(Protocol):
    """The process side of a kernel, wherever it runs."""

    @property
    def pid(self) -> int | None: ...

    async def is_alive(self) -> bool: ...

    async def interrupt(self) -> None: ...

    async def exit_status(self) -> tuple[int | None, str]:
        """The dead kernel's exit status (``-N`` for signal N, None if unknown) and how to say it."""
        ...

    async def stop(self) -> None: ...


class KernelLauncher(Protocol):
    """Starts kernels somewhere other than this host's ``jupyter_client`` provisioner (the OS sandbox:
    :class:`~.sandboxed.SandboxKernelConfig`; a remote server could be another). Such kernels are not pooled."""

    async def start(self, ws: Workspace, *, args: list[str], timeout: float) -> tuple[KernelProcess, Any]:  # noqa: ASYNC109
        """Start a kernel for ``ws``; return its process side and a connected ``AsyncKernelClient``-like client
        (``execute``, ``get_iopub_msg``, ``get_shell_msg``, ``stop_channels``)."""
        ...


@dataclass(slots=True)
class HostKernel:
    """A kernel started on this host by ``jupyter_client``."""

    km: AsyncKernelManager

    @property
    def pid(self) -> int | None:
        return getattr(self.km.provisioner, "pid", None)

    async def is_alive(self) -> bool:
        return bool(await self.km.is_alive())

    async def interrupt(self) -> None:
        await self.km.interrupt_kernel()

    async def exit_status(self) -> tuple[int | None, str]:
        code: int | None = None
        if self.km.provisioner is not None:
            with contextlib.suppress(Exception):
                code = await self.km.provisioner.poll()
        if code is None:
            return None, "it stopped responding"
        return code, (f"killed by signal {-code}" if code < 0 else f"exit code {code}")

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.km.has_kernel:
                await self.km.shutdown_kernel(now=True)


@dataclass(slots=True)
class _Kernel:
    proc: KernelProcess
    kc: AsyncKernelClient
    log: IO[bytes] | None = None
    """Host kernels: the file taking the kernel's own stdout/stderr (sandboxed ones write theirs themselves)."""


@dataclass(slots=True)
class _Session:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    kernel: _Kernel | None = None
    cancelled: str | None = None
    """msg_id of a cell whose caller was cancelled: interrupted, maybe still running."""
    lost: str | None = None
    """Why the previous kernel's state is gone, told once with the next call's output."""
    next_cell: int = 0


class _KernelDied(Exception):
    pass


class KernelSessions:
    """Kernels keyed by workspace; the executor path of the ``jupyter`` backend."""

    def __init__(
        self,
        fs: WorkspaceFS,
        env_policy: EnvPolicy | None = None,
        *,
        kernel_name: str = "python3",
        language: str = "python",
        start_timeout: float = 30.0,
        interrupt_grace: float = 2.0,
        pool_dir: Path | None = None,
        pool_size: int = 0,
        pool_idle_timeout: float = 600.0,
        launcher: KernelLauncher | None = None,
    ) -> None:
        self.kernel_name = kernel_name
        self.launcher = launcher
        """Set: kernels are started by it (e.g. in the OS sandbox), not on this host, and never pooled."""
        self.language = language
        self._fs = fs
        self._env_policy = env_policy or EnvPolicy()
        self._start_timeout = start_timeout
        self._interrupt_grace = interrupt_grace
        self._sessions: dict[str, _Session] = {}
        # connection files hold the HMAC key: keep them in a private dir, not the shared runtime dir
        self._conn_dir = Path(tempfile.mkdtemp(prefix="execspace-jupyter-"))
        self._closed = False
        # IPython's history database lives in the HOME the kernel started with: a pooled kernel's staging HOME
        # is deleted when it is bound, and a workspace's next kernel should not read the last one's inputs
        self._kernel_args = ["--HistoryManager.hist_file=:memory:"] if language == "python" else []
        # binding a pooled kernel runs Python in it: only ipykernel-style kernels can be pooled
        self.pool = (
            KernelPool(pool_dir, pool_size, pool_idle_timeout, self._start_pooled, _stop)
            if pool_dir is not None and pool_size > 0 and language == "python" and launcher is None
            else None
        )

    def start_pool(self) -> None:
        """Begin filling the warm pool in the background (needs a running event loop)."""
        if self.pool is not None:
            self.pool.refill()

    # -- executor path -----------------------------------------------------------------

    def handles(self, tag: str) -> bool:
        """Whether a code block with fence tag ``tag`` runs in the kernel."""
        words = tag.split()
        if not words:
            return False
        try:
            return resolve_language(words[0]).name == self.language
        except UnsupportedLanguage:
            return False

    async def run_block(
        self,
        ws: Workspace,
        block: CodeBlock,
        index: int,
        *,
        timeout: float | None,  # noqa: ASYNC109 - a deadline for the kernel, not for our task
        limits: ResourceLimits,
    ) -> tuple[BlockResult, str]:
        """Run one code block in ``ws``'s kernel, as :class:`~execspace.CodeExecutor` runs a program."""
        unenforced = sorted(limits.requested() - {"output_bytes"})
        if unenforced:
            why = (
                f"the {self.kernel_name} kernel does not enforce {', '.join(unenforced)}; drop these limits "
                "or run the code as a program on the local or sandbox backend"
            )
            return BlockResult(index, block.language, 127, "", "", 0.0, error=why), f"[error: {why}]\n"
        cell = await self.execute(ws, block.code, timeout=timeout, output_bytes=limits.output_bytes)
        result = BlockResult(
            index, block.language, cell.exit_code, cell.stdout, cell.stderr, cell.duration, cell.timed_out
        )
        return result, cell.text

    # -- cells ---------------------------------------------------------------------------

    async def execute(
        self,
        ws: Workspace,
        code: str,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - interrupts the kernel, not our task
        output_bytes: int | None = DEFAULT_OUTPUT_BYTES,
    ) -> CellResult:
        """Run ``code`` in the workspace's kernel (started on first use); rich outputs go to ``out/``."""
        if self._closed:
            raise UsageError("this engine's kernels are shut down; open a new engine")
        session = self._sessions.setdefault(_key(ws), _Session())
        async with session.lock:
            await self._replace_if_dead(session)
            await self._settle_cancelled(session)
            fresh = session.kernel is None
            kernel = session.kernel or await self._start(ws, session)
            out = CellOutputs(session.next_cell, output_bytes)
            session.next_cell += 1
            state_lost = fresh and session.lost is not None
            if session.lost is not None:
                out.note(session.lost)
                session.lost = None
            started = time.monotonic()
            exit_code, timed_out, died = await self._run_cell(session, kernel, code, out, timeout)
            duration = time.monotonic() - started
        if out.files:
            await self._fs.put_files(ws, out.files)
        if out.dropped:
            out.note(f"{out.dropped} more rich outputs of this cell were not saved (at most 50 per cell)")
        return _result(
            out,
            exit_code,
            duration,
            timed_out=timed_out,
            died=died,
            state_lost=state_lost or died or exit_code == EXIT_RESTARTED,
        )

    async def _run_cell(
        self,
        session: _Session,
        kernel: _Kernel,
        code: str,
        out: CellOutputs,
        timeout: float | None,  # noqa: ASYNC109
    ) -> tuple[int, bool, bool]:
        """Return (exit code, timed out, kernel died)."""
        await _drain_replies(kernel.kc)
        msg_id = kernel.kc.execute(code, allow_stdin=False, stop_on_error=True)
        deadline = time.monotonic() + timeout if timeout is not None else math.inf
        try:
            if await self._collect_or_interrupt(session, kernel, msg_id, out, deadline):
                return (EXIT_ERROR if out.error else EXIT_OK), False, False
            await kernel.proc.interrupt()
            if await _collect(kernel, msg_id, out, time.monotonic() + self._interrupt_grace):
                out.note(f"timed out after {timeout:g}s; the kernel was interrupted and keeps its state")
                return EXIT_INTERRUPTED, True, False
        except _KernelDied:
            status, how = await kernel.proc.exit_status()
            await self._discard(session)
            session.lost = "a fresh kernel was started: the previous one died, its variables and imports are gone"
            out.note(
                f"the kernel died during this cell ({how}); its variables and imports are lost, "
                "the next call starts a fresh kernel"
            )
            return (EXIT_RESTARTED if status is None else status), False, True
        await self._discard(session)
        session.lost = "a fresh kernel was started: the previous one was restarted, its variables and imports are gone"
        out.note(
            f"timed out after {timeout:g}s and the kernel did not stop on interrupt: it was restarted, "
            "its variables and imports are lost"
        )
        return EXIT_RESTARTED, True, False

    # -- kernel lifetime ---------------------------------------------------------------

    async def _start(self, ws: Workspace, session: _Session) -> _Kernel:
        if ws.host_path is None:
            raise UsageError("the jupyter backend needs a host-directory workspace")
        root = str(ws.host_path)
        if session.next_cell == 0:
            session.next_cell = _next_cell_number(ws.host_path / "out")
        if self.launcher is not None:
            proc, kc = await self.launcher.start(ws, args=self._kernel_args, timeout=self._start_timeout)
            session.kernel = _Kernel(proc, kc)
            return session.kernel
        pooled = self.pool.take() if self.pool is not None else None
        kernel = await self._bind(pooled, root) if pooled is not None else None
        self.start_pool()
        if kernel is None:
            run_dir, log = _kernel_run_dir(root)
            kernel = await self._launch(root, run_dir, log)
        session.kernel = kernel
        return kernel

    async def _launch(self, root: str, run_dir: str, log: IO[bytes]) -> _Kernel:
        """Start a kernel in ``root``'s ``work/`` with the environment of a run in ``root``."""
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        km = AsyncKernelManager(
            kernel_name=self.kernel_name, connection_file=str(self._conn_dir / f"{secrets.token_hex(8)}.json")
        )
        try:
            await km.start_kernel(
                cwd=os.path.join(root, "work"), env=env, stdout=log, stderr=log, extra_arguments=self._kernel_args
            )
        except Exception as exc:
            log.close()
            raise SetupFailed("jupyter", f"kernel {self.kernel_name!r} did not start: {exc}", _LOG_HINT) from exc
        kernel = _Kernel(HostKernel(km), km.client(), log)
        try:
            kernel.kc.start_channels()
            await kernel.kc.wait_for_ready(timeout=self._start_timeout)
        except BaseException as exc:
            await _stop(kernel)
            if not isinstance(exc, Exception):
                raise
            raise SetupFailed("jupyter", f"kernel {self.kernel_name!r} did not start: {exc}", _LOG_HINT) from exc
        return kernel

    async def _start_pooled(self, staging: Path) -> _Kernel:
        """A kernel for the pool: staged in its own directory, with an environment for no workspace."""
        for sub in ("work", "home", "tmp"):
            os.makedirs(staging / sub, 0o700, exist_ok=True)
        run_dir, log = _kernel_run_dir(str(staging))
        return await self._launch(str(staging), run_dir, log)

    async def _bind(self, pooled: PooledKernel, root: str) -> _Kernel | None:
        """Hand a pooled kernel to the workspace at ``root``; None if it is unusable (start one cold then)."""
        kernel = pooled.kernel
        run_dir, log = _kernel_run_dir(root)
        log.close()
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        code = _BIND_CELL.format(work=os.path.join(root, "work"), env=env)
        ok = False
        try:
            ok = await kernel.proc.is_alive() and await _silent_cell(kernel.kc, code, self._start_timeout)
            if ok and kernel.log is not None:
                # same filesystem (both under the workspace root): the kernel's open log file moves with it
                with contextlib.suppress(OSError):
                    os.replace(kernel.log.name, os.path.join(root, run_dir, "kernel.log"))
        finally:
            # also when our caller is cancelled: a kernel in neither the pool nor a session would never be stopped
            if not ok:
                await _stop(kernel)
                await asyncio.to_thread(shutil.rmtree, os.path.join(root, run_dir), True)
            await asyncio.to_thread(shutil.rmtree, pooled.staging, True)
        return kernel if ok else None

    async def _collect_or_interrupt(
        self, session: _Session, kernel: _Kernel, msg_id: str, out: CellOutputs, deadline: float
    ) -> bool:
        """:func:`_collect`, interrupting the cell if our caller is cancelled, so that the kernel is free again."""
        try:
            return await _collect(kernel, msg_id, out, deadline)
        except asyncio.CancelledError:
            session.cancelled = msg_id
            with contextlib.suppress(Exception):
                await asyncio.shield(kernel.proc.interrupt())
            raise

    async def _settle_cancelled(self, session: _Session) -> None:
        """Wait for a cancelled cell to end before the next one: a request sent while the interrupted cell
        still runs would be aborted by the kernel (stop_on_error) and silently do nothing."""
        msg_id, session.cancelled = session.cancelled, None
        if msg_id is None or session.kernel is None:
            return
        try:
            if await _collect(session.kernel, msg_id, CellOutputs(0, 0), time.monotonic() + self._interrupt_grace):
                return
            why = "the previous one was restarted because a cancelled cell did not stop on interrupt"
        except _KernelDied:
            why = "the previous one died after a cell was cancelled"
        await self._discard(session)
        session.lost = f"a fresh kernel was started: {why}, its variables and imports are gone"

    async def _replace_if_dead(self, session: _Session) -> None:
        """A kernel can die between calls (OOM killer, a thread calling os._exit): say so, start afresh."""
        if session.kernel is not None and not await session.kernel.proc.is_alive():
            _, how = await session.kernel.proc.exit_status()
            await self._discard(session)
            session.lost = (
                f"a fresh kernel was started: the previous one died between calls ({how}), "
                "its variables and imports are gone"
            )

    async def _discard(self, session: _Session) -> None:
        kernel, session.kernel = session.kernel, None
        if kernel is not None:
            await _stop(kernel)

    async def shutdown(self, ws: Workspace) -> None:
        """Stop the workspace's kernel (its state is lost). Idempotent."""
        session = self._sessions.pop(_key(ws), None)
        if session is not None:
            async with session.lock:
                await self._discard(session)

    async def aclose(self) -> None:
        """Stop every kernel. Idempotent."""
        self._closed = True
        if self.pool is not None:
            await self.pool.aclose()
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await self._discard(session)
        await asyncio.to_thread(shutil.rmtree, self._conn_dir, True)


_LOG_HINT = "see kernel.log in the workspace's runs/kernel-* directory; check that ipykernel is installed"


#: Moves a pooled kernel into its workspace: one expression, so that it leaves no names in the user's namespace;
#: the whole environment is replaced, tempfile forgets the staging TMPDIR, IPython's directory history restarts.
_BIND_CELL = (
    "(lambda os, tempfile, ip, kept: (os.chdir({work!r}), os.environ.clear(), os.environ.update(kept), "
    "os.environ.update({env!r}), "
    "setattr(tempfile, 'tempdir', None), ip is not None and '_dh' in ip.user_ns and ip.user_ns['_dh'].clear(), "
    "ip is not None and '_dh' in ip.user_ns and ip.user_ns['_dh'].append({work!r})))"
    "(__import__('os'), __import__('tempfile'), __import__('IPython').get_ipython(), "
    # ipykernel sets MPLBACKEND when it starts; without it figures are not displayed (no PNG comes back)
    "{{k: v for k, v in __import__('os').environ.items() if k == 'MPLBACKEND'}})"
)


async def _silent_cell(kc: AsyncKernelClient, code: str, timeout: float) -> bool:  # noqa: ASYNC109
    """Run ``code`` without output or history; True if it succeeded."""
    msg_id = kc.execute(code, silent=True, store_history=False, allow_stdin=False)
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            reply: dict[str, Any] = await kc.get_shell_msg(timeout=remaining)
        except queue.Empty:
            break
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            return bool(reply["content"].get("status") == "ok")
    return False


async def _collect(kernel: _Kernel, msg_id: str, out: CellOutputs, deadline: float) -> bool:
    """Feed this cell's messages to ``out`` until the kernel is idle (True) or the deadline (False)."""
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            msg: dict[str, Any] = await kernel.kc.get_iopub_msg(timeout=min(remaining, _LIVENESS_POLL))
        except queue.Empty:
            if not await kernel.proc.is_alive():
                raise _KernelDied from None
            continue
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue  # output of an earlier, interrupted cell or of a background thread
        msg_type, content = msg["header"]["msg_type"], msg["content"]
        if msg_type == "status" and content.get("execution_state") == "idle":
            return True
        out.add(msg_type, content)
    return False


async def _drain_replies(kc: AsyncKernelClient) -> None:
    """Drop execute replies nobody reads, so that they do not pile up over a long session."""
    with contextlib.suppress(queue.Empty):
        while True:
            await kc.get_shell_msg(timeout=0)


async def _stop(kernel: _Kernel) -> None:
    with contextlib.suppress(Exception):
        kernel.kc.stop_channels()
    await kernel.proc.stop()
    if kernel.log is not None:
        kernel.log.close()


def _kernel_run_dir(root: str) -> tuple[str, IO[bytes]]:
    """A run directory for a new kernel, and the log that takes its own stdout/stderr (crash reports)."""
    run_dir = f"runs/kernel-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"
    os.makedirs(os.path.join(root, run_dir), exist_ok=True)
    return run_dir, open(os.path.join(root, run_dir, "kernel.log"), "ab")


def _next_cell_number(out_dir: Path) -> int:
    """One past the highest ``cell-N-*`` already in ``out/``, so a new kernel never overwrites older outputs."""
    try:
        numbers = [int(m.group(1)) for name in os.listdir(out_dir) if (m := _CELL_FILE.match(name))]
    except OSError:
        return 1
    return max(numbers, default=0) + 1


def _key(ws: Workspace) -> str:
    return str(ws.host_path) if ws.host_path is not None else ws.id


def _result(out: CellOutputs, exit_code: int, duration: float, **flags: bool) -> CellResult:
    def text(buf: Any) -> str:
        return str(buf.getvalue().decode("utf-8", "replace"))

    return CellResult(
        exit_code=exit_code,
        text=text(out.text),
        stdout=text(out.stdout),
        stderr=text(out.stderr),
        files=tuple(f.path for f in out.files),
        duration=duration,
        error=out.error,
        truncated=out.text.truncated,
        timed_out=flags["timed_out"],
        kernel_died=flags["died"],
        state_lost=flags["state_lost"],
    )
