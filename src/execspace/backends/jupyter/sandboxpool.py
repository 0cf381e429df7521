"""A warm pool of sandboxed kernels: each started in a workspace slot that becomes one new workspace.

A sandbox is fixed to one workspace when it starts: bwrap binds the workspace directory at ``/workspace``
and runs as that workspace's uid. Both follow the directory's inode, not its path (the bind pins the
directory; :func:`~execspace.backends.sandbox.bwrap.sandbox_uid` hashes its device, inode and the nonce kept
on it). So a pooled kernel is started in a fresh slot directory in the workspace root (``.pool-<random>``,
see :mod:`execspace.workspace.slots`), laid out and owned like a workspace, with the same environment and cwd
a kernel of any workspace gets (``/workspace/...`` paths are the same for all). Creating a new workspace
renames a slot into place; that workspace's first kernel start then takes the slot's kernel, and no other
workspace ever can (it is keyed by the directory, checked by inode). Nothing needs binding: the kernel
is exactly what a cold start in that workspace would have given, started a little earlier.

Cold starts remain for workspaces that already exist (a reopened session), for explicit ``path=``
workspaces, for every kernel after a workspace's first, and when the policy has no-access globs (they are
judged against the workspace's files when a sandbox starts, and a slot has none yet).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ...audit import AuditSink
from ...models import Workspace
from ...workspace.hostmanager import HostWorkspaceManager, private_dir
from ...workspace.slots import laid_out_slot, take_slot
from ..sandbox import SANDBOX_WORKSPACE
from .hostkernels import ZmqConnection
from .kernels import Freeze, KernelSessions
from .pool import KernelPool
from .sandboxed import SandboxKernelConfig

__all__ = ["SandboxLauncher", "SlotWorkspaceManager", "make_slot"]


def make_slot(root: Path, root_mode: int, prepare: Callable[[Path], None] | None) -> Path:
    """A slot directory in ``root`` laid out and owned like a new workspace (runs in a worker thread)."""
    private_dir(root, root_mode)  # the slots live in the root: same filesystem, so the rename is atomic
    with laid_out_slot(root) as slot:
        if prepare is not None:
            prepare(slot)  # as root: the slot's uid, which the workspace keeps (same inode)
    return slot


@dataclass(frozen=True, slots=True)
class _Adopted:
    kernel: ZmqConnection
    inode: tuple[int, int]
    """(st_dev, st_ino) of the slot directory: the workspace the kernel's sandbox sees."""


def _inode(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


class SandboxLauncher:
    """The :class:`~.kernels.KernelLauncher` of sandboxed kernels: from the pool for a workspace made of a
    slot, else started cold in the workspace."""

    def __init__(
        self,
        cfg: SandboxKernelConfig,
        new_slot: Callable[[], Path],
        *,
        pool_size: int,
        pool_idle_timeout: float,
        start_timeout: float = 30.0,
    ) -> None:
        self._cfg = cfg
        self._start_timeout = start_timeout
        self._lock = threading.Lock()
        self._adopted: dict[Path, _Adopted] = {}
        self.pool = (
            KernelPool(None, pool_size, pool_idle_timeout, self._start_pooled, ZmqConnection.stop, make_dir=new_slot)
            if pool_size > 0
            else None
        )

    async def _start_pooled(self, slot: Path) -> ZmqConnection:
        ws = Workspace(id=slot.name, path=SANDBOX_WORKSPACE, backend="jupyter", host_path=slot)
        return await self._cfg.start(ws, timeout=self._start_timeout)

    def adopt(self, ws_dir: Path) -> bool:
        """Make a pooled kernel's slot the new workspace ``ws_dir``; False if there is none ready or ``ws_dir``
        exists already (safe from a worker thread, where workspaces are created)."""
        pooled = take_slot(self.pool, ws_dir) if self.pool is not None else None
        if pooled is None:
            return False
        with self._lock:
            self._adopted[ws_dir] = _Adopted(pooled.kernel, _inode(ws_dir))
        return True

    def refill(self) -> None:
        if self.pool is not None:
            self.pool.refill()

    async def start(self, ws: Workspace, *, timeout: float) -> ZmqConnection:  # noqa: ASYNC109
        assert ws.host_path is not None
        with self._lock:
            adopted = self._adopted.pop(ws.host_path, None)
        if adopted is not None:
            if await self._still_there(adopted, ws.host_path):
                return adopted.kernel
            await adopted.kernel.stop()
        return await self._cfg.start(ws, timeout=timeout)

    @staticmethod
    async def _still_there(adopted: _Adopted, host_path: Path) -> bool:
        """Whether the kernel lives and ``host_path`` is still the directory its sandbox sees."""
        try:
            same = await asyncio.to_thread(_inode, host_path) == adopted.inode
        except OSError:
            return False
        return same and await adopted.kernel.is_alive()

    async def release(self, ws: Workspace) -> None:
        """Stop the pooled kernel of a workspace removed before its first cell."""
        with self._lock:
            adopted = self._adopted.pop(ws.host_path, None) if ws.host_path is not None else None
        if adopted is not None:
            await adopted.kernel.stop()

    async def aclose(self) -> None:
        """Stop the pool and the kernels handed to workspaces that never used them. Idempotent."""
        if self.pool is not None:
            await self.pool.aclose()
        with self._lock:
            left, self._adopted = list(self._adopted.values()), {}
        for adopted in left:
            await adopted.kernel.stop()


class SlotWorkspaceManager(HostWorkspaceManager):
    """The sandbox backend's host-directory workspaces, whose new directories come from the kernel pool's
    slots when one is ready, and whose cleanup also stops their kernel."""

    def __init__(
        self,
        root: Path,
        launcher: SandboxLauncher,
        kernels: KernelSessions,
        *,
        prepare: Callable[[Path], None] | None,
        private_root: bool,
        stop_programs: Callable[[Workspace], Awaitable[None]],
        freeze: Freeze,
        audit: AuditSink | None = None,
    ) -> None:
        super().__init__(
            "sandbox",
            root,
            prepare=prepare,
            program_path=lambda _p: SANDBOX_WORKSPACE,
            private_root=private_root,
            adopt=launcher.adopt,
            refill=launcher.refill,
            stop_programs=stop_programs,
            freeze=freeze,
            audit=audit,
        )
        self._launcher = launcher
        self._kernels = kernels

    async def cleanup(self, ws: Workspace) -> None:
        await self._kernels.shutdown(ws)
        await self._launcher.release(ws)
        await super().cleanup(ws)
