"""How a sandbox engine in session mode keeps its sessions, and the limits of a session as a whole."""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import InvalidSpec
from ...models import ResourceLimits
from ...workspace.diskimages import MIN_DISK_BYTES

__all__ = ["SessionConfig"]


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How a sandbox engine in session mode keeps its sessions."""

    pool_size: int = 2
    """Sessions started ahead on laid-out slots, so that a new workspace's first run does not wait for one."""
    idle_timeout: float | None = 300.0
    """Seconds a session without programs is kept before it is ended (the next run starts a new one)."""
    request_timeout: float = 10.0
    """Seconds the supervisor has to answer a request; past that the session is ended as hung."""
    start_timeout: float = 10.0
    """Seconds a new session has to report ready."""
    memory_bytes: int | None = None
    """Memory of the whole session (every program in it together, and its supervisor), as a cgroup where this host
    gives one (as root); else an rlimit of each of its processes. A program past it is killed by the kernel. The
    session's ``/tmp`` and ``/dev/shm`` (tmpfs, in memory) together hold at most this much."""
    pids: int | None = None
    """Processes and threads of the whole session at once, as a cgroup where this host gives one; else ``RLIMIT_NPROC``
    of its uid (not as root: its sessions' uids are per workspace, but root's rlimit would not hold)."""
    cpus: float | None = None
    """CPU bandwidth of the whole session, in CPUs (``0.5``: half of one CPU's time per wall second), as a cgroup
    CPU quota (v1 ``cpu.cfs_quota_us``, v2 ``cpu.max``): needs root and the cpu controller, refused otherwise.
    Past it the session's programs are throttled, never killed."""
    disk_bytes: int | None = None
    """Disk of each workspace, as a filesystem of that size of its own (a sparse ext4 image loop-mounted at the
    workspace, :mod:`execspace.workspace.diskimages`): a write past it fails with ``ENOSPC`` in the program. The
    session's ``/tmp`` and ``/dev/shm`` (tmpfs, in memory) together hold at most the same size. Needs root,
    ``mkfs.ext4`` and loop devices, refused otherwise; its workspaces have no snapshots or forks, and no sessions
    started ahead (``pool_size`` is not used)."""

    def __post_init__(self) -> None:
        self.limits(1)  # refused now as ResourceLimits refuses them, not when a session starts
        if self.disk_bytes is not None and self.disk_bytes < MIN_DISK_BYTES:
            raise InvalidSpec(f"SessionConfig.disk_bytes must be at least 1 MiB, got {self.disk_bytes}")

    def limits(self, output_bytes: int) -> ResourceLimits:
        """The limits of a session's own sandbox (its bwrap keeps ``output_bytes`` of what it says)."""
        return ResourceLimits(memory_bytes=self.memory_bytes, pids=self.pids, cpus=self.cpus, output_bytes=output_bytes)
