"""What the jupyter backend's test modules share: process liveness as the host sees it, the kernels of an engine,
and the skip when sandboxed kernels cannot run here."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from execspace import BaseEngine
from execspace.backends.jupyter import (
    KernelSessions,
    SandboxedKernels,
)
from execspace.registry import probe_backend

__all__ = ["alive", "kernels_of", "require_sandboxed_kernels", "wait_dead"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie is dead for us (its parent may not have reaped it yet)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


async def wait_dead(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return not alive(pid)


def kernels_of(engine: BaseEngine) -> KernelSessions:
    ks = engine.kernels
    assert isinstance(ks, KernelSessions)
    return ks


async def require_sandboxed_kernels() -> None:
    """Skip unless kernels can run in the sandbox here (the probe also checks that the sandbox uid can read
    this environment's packages)."""
    probe = await probe_backend("jupyter", mode=SandboxedKernels())
    if not probe.ok:
        pytest.skip(f"no sandboxed kernels here: {probe.reason}")
