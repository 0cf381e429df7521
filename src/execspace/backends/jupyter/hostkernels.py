"""Kernels reached through ``jupyter_client`` (ZMQ): on this host as the caller, or in the OS sandbox.

:class:`ZmqConnection` is the :class:`~.kernels.KernelConnection` of both; what differs between them is the
process side (:class:`KernelProcess`): :class:`HostKernel` here, ``SandboxedKernel`` in :mod:`.sandboxed`.
:class:`HostLauncher` starts host kernels (no isolation) and keeps the warm pool (:mod:`.pool`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import secrets
import shutil
import tempfile
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from ...envpolicy import EnvPolicy
from ...errors import SetupFailed
from ...models import Workspace
from ...process.freezing import Hold, StoppedTree
from ...workspace.layout import workspace_env
from .kernels import bind, new_run_dir
from .pool import KernelPool, PooledKernel

with warnings.catch_warnings():
    # jupyter_core warns about its platformdirs migration on import; nothing for our callers to act on
    warnings.simplefilter("ignore", DeprecationWarning)
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.manager import AsyncKernelManager

__all__ = ["PYTHON_KERNEL_ARGS", "HostKernel", "HostLauncher", "KernelProcess", "ZmqConnection"]

#: IPython's history database lives in the HOME the kernel started with: a pooled kernel's staging HOME is
#: deleted when it is bound, and a workspace's next kernel should not read the last one's inputs.
PYTHON_KERNEL_ARGS = ["--HistoryManager.hist_file=:memory:"]
_LOG_HINT = "see kernel.log in the workspace's runs/kernel-* directory; check that ipykernel is installed"


class KernelProcess(Protocol):
    """The process side of a kernel, wherever it runs."""

    def hold(self) -> Hold | None:
        """What holds its processes still (see ``KernelConnection.hold``)."""
        ...

    async def is_alive(self) -> bool: ...

    async def interrupt(self) -> None: ...

    async def exit_status(self) -> tuple[int | None, str]:
        """The dead kernel's exit status (``-N`` for signal N, None if unknown) and how to say it."""
        ...

    async def stop(self) -> None: ...


@dataclass(slots=True)
class ZmqConnection:
    """A kernel driven by an ``AsyncKernelClient``; liveness, interrupts and exit status from its process."""

    proc: KernelProcess
    kc: AsyncKernelClient
    log: IO[bytes] | None = None
    """Host kernels: the file taking the kernel's own stdout/stderr (sandboxed ones write theirs themselves)."""
    dropped: int = 0
    """Always 0: jupyter_client queues every message it receives."""

    def execute(self, code: str, *, silent: bool = False) -> str:
        return str(self.kc.execute(code, silent=silent, store_history=not silent, allow_stdin=False))

    async def next_iopub(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        return await _next(self.kc.get_iopub_msg, timeout)

    async def next_shell(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
        return await _next(self.kc.get_shell_msg, timeout)

    async def drain(self) -> None:
        while await _next(self.kc.get_shell_msg, 0) is not None:
            pass

    def hold(self) -> Hold | None:
        return self.proc.hold()

    async def interrupt(self) -> None:
        await self.proc.interrupt()

    async def is_alive(self) -> bool:
        return await self.proc.is_alive()

    async def exit_status(self) -> tuple[int | None, str]:
        return await self.proc.exit_status()

    async def stop(self, *, wait: bool = True) -> None:
        with contextlib.suppress(Exception):
            self.kc.stop_channels()
        await self.proc.stop()
        if self.log is not None:
            self.log.close()


async def _next(get: Callable[..., Awaitable[dict[str, Any]]], timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109
    try:
        return await get(timeout=timeout)
    except queue.Empty:
        return None


@dataclass(slots=True)
class HostKernel:
    """A kernel started on this host by ``jupyter_client``."""

    km: AsyncKernelManager

    @property
    def pid(self) -> int | None:
        return getattr(self.km.provisioner, "pid", None)

    def hold(self) -> Hold | None:
        pid = self.pid
        return None if pid is None else StoppedTree([pid])

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


class HostLauncher:
    """Kernels on this host as the caller (no isolation), started by ``jupyter_client``'s kernel manager."""

    def __init__(
        self,
        env_policy: EnvPolicy | None,
        *,
        kernel_name: str = "python3",
        language: str = "python",
        pool_dir: Path | None = None,
        pool_size: int = 0,
        pool_idle_timeout: float = 600.0,
        start_timeout: float = 30.0,
    ) -> None:
        self.kernel_name = kernel_name
        self._env_policy = env_policy or EnvPolicy()
        self._args = PYTHON_KERNEL_ARGS if language == "python" else []
        self._start_timeout = start_timeout
        # connection files hold the HMAC key: keep them in a private dir, not the shared runtime dir
        self._conn_dir = Path(tempfile.mkdtemp(prefix="execspace-jupyter-"))
        # binding a pooled kernel runs Python in it: only ipykernel-style kernels can be pooled
        self.pool = (
            KernelPool(pool_dir, pool_size, pool_idle_timeout, self._start_pooled, ZmqConnection.stop)
            if pool_dir is not None and pool_size > 0 and language == "python"
            else None
        )

    async def start(self, ws: Workspace, *, timeout: float) -> ZmqConnection:  # noqa: ASYNC109
        assert ws.host_path is not None
        root = str(ws.host_path)
        pooled = self.pool.take() if self.pool is not None else None
        kernel = await self._bind(pooled, root, timeout) if pooled is not None else None
        if self.pool is not None:
            self.pool.refill()  # after binding, so that the refill's start-up does not compete with it
        return kernel or await self._launch(root, new_run_dir(root), timeout)

    async def _launch(self, root: str, run_dir: str, timeout: float) -> ZmqConnection:  # noqa: ASYNC109
        """Start a kernel in ``root``'s ``work/`` with the environment of a run in ``root``."""
        # the kernel's stdout/stderr (crash reports), closed when it stops; opening a local file does not block
        log = open(os.path.join(root, run_dir, "kernel.log"), "ab")  # noqa: SIM115, ASYNC230
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        km = AsyncKernelManager(
            kernel_name=self.kernel_name, connection_file=str(self._conn_dir / f"{secrets.token_hex(8)}.json")
        )
        try:
            await km.start_kernel(
                cwd=os.path.join(root, "work"), env=env, stdout=log, stderr=log, extra_arguments=self._args
            )
        except Exception as exc:
            log.close()
            raise SetupFailed("jupyter", f"kernel {self.kernel_name!r} did not start: {exc}", _LOG_HINT) from exc
        kernel = ZmqConnection(HostKernel(km), km.client(), log)
        try:
            kernel.kc.start_channels()
            await kernel.kc.wait_for_ready(timeout=timeout)
        except BaseException as exc:
            await kernel.stop()
            if not isinstance(exc, Exception):
                raise
            raise SetupFailed("jupyter", f"kernel {self.kernel_name!r} did not start: {exc}", _LOG_HINT) from exc
        return kernel

    async def _start_pooled(self, staging: Path) -> ZmqConnection:
        """A kernel for the pool: staged in its own directory, with an environment for no workspace."""
        for sub in ("work", "home", "tmp"):
            os.makedirs(staging / sub, 0o700, exist_ok=True)
        return await self._launch(str(staging), new_run_dir(str(staging)), self._start_timeout)

    async def _bind(self, pooled: PooledKernel, root: str, timeout: float) -> ZmqConnection | None:  # noqa: ASYNC109
        """Hand a pooled kernel to the workspace at ``root``; None if it is unusable (start one cold then)."""
        kernel: ZmqConnection = pooled.kernel
        run_dir = new_run_dir(root)
        env = self._env_policy.build(os.environ, {}, workspace_env(root, run_dir))
        ok = False
        try:
            work = os.path.join(root, "work")
            ok = await kernel.is_alive() and (await bind(kernel, work, env, timeout)).get("status") == "ok"
            if ok and kernel.log is not None:
                # same filesystem (both under the workspace root): the kernel's open log file moves with it
                with contextlib.suppress(OSError):
                    os.replace(kernel.log.name, os.path.join(root, run_dir, "kernel.log"))
        finally:
            # also when our caller is cancelled: a kernel in neither the pool nor a session would never be stopped
            if not ok:
                await kernel.stop()
                await asyncio.to_thread(shutil.rmtree, os.path.join(root, run_dir), True)
            await asyncio.to_thread(shutil.rmtree, pooled.staging, True)
        return kernel if ok else None

    async def aclose(self) -> None:
        if self.pool is not None:
            await self.pool.aclose()
        await asyncio.to_thread(shutil.rmtree, self._conn_dir, True)
