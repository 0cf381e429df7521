"""A run's ``memory_bytes`` on the container backend: a cgroup of exactly that size, and the kernel's word on a breach.

An exec joins its container's cgroup and the Engine API has no per-exec limits, so a run that asks for
``memory_bytes`` runs in a *member* container of its workspace, created with exactly that memory (no swap) and
joined to the workspace container's network and process namespaces: it sees the same loopback and the same
processes as a run in the workspace container, binds the same workspace, and only its cgroup (memory, pids, CPU)
and its ``/tmp`` are its own. There is one member per distinct limit, kept for the workspace's life, so runs that
ask the same limit share it as runs without one share the workspace container.

A breach is what the kernel says, never a guess from exit status 137: each memory cgroup counts its OOM kills
(``oom_kill`` in cgroup v2's ``memory.events``, v1's ``memory.oom_control``), read by an exec in the container
(so it works for remote and Podman daemons alike). A run that asked for a limit reads its member's counter before it
starts and after it ends; a run without one that ended by SIGKILL reads its container's counter against the count
last seen there. An increase means a process of that cgroup was killed for memory: ``limit_hit="memory_bytes"``.
"""

from __future__ import annotations

import contextlib
import signal
from dataclasses import dataclass
from typing import Any

from ...errors import CapabilityError

__all__ = ["MIN_MEMORY", "OomWatch", "check_memory", "member_kwargs", "oom_kills"]

#: The least memory a container's cgroup takes (Docker and Podman refuse less).
MIN_MEMORY = 6 * 1024 * 1024

#: Prints the cgroup's ``oom_kill`` line: v2 (private cgroup namespace, else the exec's own group), else v1.
_OOM_SCRIPT = r"""
g=$(grep '^0::' /proc/self/cgroup 2>/dev/null); g=${g#0::}
for f in /sys/fs/cgroup/memory.events "/sys/fs/cgroup$g/memory.events" /sys/fs/cgroup/memory/memory.oom_control; do
  [ -r "$f" ] && grep '^oom_kill ' "$f" && exit 0
done
exit 3
"""


def check_memory(memory_bytes: int | None) -> None:
    """Refuse a run limit no container cgroup can be created with."""
    if memory_bytes is not None and memory_bytes < MIN_MEMORY:
        raise CapabilityError(
            f"memory_bytes={memory_bytes} (a container's memory cgroup takes at least {MIN_MEMORY} bytes)",
            "container",
            f"ask for at least {MIN_MEMORY // 2**20} MiB, or use the sandbox backend",
        )


def member_kwargs(kwargs: dict[str, Any], owner: str, memory_bytes: int) -> dict[str, Any]:
    """``containers.create`` arguments of the workspace container (``kwargs``) turned into its member's for
    ``memory_bytes``: in ``owner``'s network and process namespaces, with a cgroup of that size."""
    return {
        **kwargs,
        "network_mode": f"container:{owner}",
        "pid_mode": f"container:{owner}",
        # the owner's init is pid 1 of the shared namespace and reaps the orphans; a second one would not be pid 1
        "init": False,
        "mem_limit": memory_bytes,
        "memswap_limit": memory_bytes,
    }


def oom_kills(api: Any, cid: str, user: str) -> int | None:
    """How many processes the kernel has killed for memory in ``cid``'s cgroup (None: it cannot be read, e.g.
    the container is gone)."""
    with contextlib.suppress(Exception):  # a stopped container, a daemon hiccup: no evidence either way
        exec_id = api.exec_create(cid, ["sh", "-c", _OOM_SCRIPT], user=user, stdout=True, stderr=False)["Id"]
        out = api.exec_start(exec_id)
        for line in bytes(out).decode("ascii", "replace").splitlines():
            name, _, count = line.partition(" ")
            if name == "oom_kill" and count.strip().isdigit():
                return int(count)
    return None


@dataclass(frozen=True, slots=True)
class OomWatch:
    """What a run's end is judged against: the OOM kills of its container's cgroup when it started."""

    container: str
    baseline: int | None
    """The count when the run started (None: unknown, so no increase can be told)."""
    asked: bool
    """The run asked for ``memory_bytes`` (it has the member to itself by its limit): read whatever its end."""

    def worth_reading(self, exit_code: int) -> bool:
        """Whether the counter is read after the run: always for a run that asked for a limit; otherwise only
        after a SIGKILL, the OOM killer's signal (most runs then cost no extra exec)."""
        return self.baseline is not None and (self.asked or exit_code == -signal.SIGKILL)

    def breached(self, after: int | None) -> bool:
        return self.baseline is not None and after is not None and after > self.baseline
