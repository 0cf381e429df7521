"""Who owns a leftover (a container, a pool slot), and whether that process is provably gone.

A resource that may outlive a crash records its owner: the process (pid and start time, so a reused pid
is not mistaken for the owner), the host, the boot and the pid namespace. A clean-up removes it only
when :func:`owner_alive` says ``False``; where it cannot judge (another host, another pid namespace, a
record from an older version) it says ``None`` and the leftover stays.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Owner", "current_owner", "owner_alive", "pid_alive"]

_FIELDS = ("pid", "pid-start", "host", "boot", "pidns")


@dataclass(frozen=True, slots=True)
class Owner:
    pid: int
    start: str
    """Start time of the process in clock ticks since boot (``/proc/<pid>/stat`` field 22)."""
    host: str
    boot: str
    pidns: str

    def fields(self, prefix: str) -> dict[str, str]:
        """The owner as ``{prefix.field: value}`` strings (container labels, a slot's owner file)."""
        values = (str(self.pid), self.start, self.host, self.boot, self.pidns)
        return {f"{prefix}.{name}": value for name, value in zip(_FIELDS, values, strict=True)}

    @classmethod
    def from_fields(cls, prefix: str, fields: Mapping[str, str]) -> Owner | None:
        """Read :meth:`fields` back; None when they are missing or malformed (so: cannot judge, keep it)."""
        try:
            pid, start, host, boot, pidns = (fields[f"{prefix}.{name}"] for name in _FIELDS)
            return cls(int(pid), str(start), str(host), str(boot), str(pidns))
        except (KeyError, ValueError, TypeError):
            return None


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _pid_start(pid: int) -> str:
    stat = _read(f"/proc/{pid}/stat")
    # the command name (field 2) may hold spaces and parentheses: split after its closing one
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else ""


def _pidns() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def current_owner() -> Owner:
    pid = os.getpid()
    return Owner(pid, _pid_start(pid), socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), _pidns())


def owner_alive(owner: Owner, here: Owner) -> bool | None:
    """``True``/``False`` when we can tell from this process; ``None`` when we cannot (leave it alone)."""
    if owner.host != here.host:
        return None
    if owner.boot and here.boot and owner.boot != here.boot:
        return False  # no process survives a reboot
    if owner.pidns != here.pidns or not owner.start:
        return None
    return _pid_start(owner.pid) == owner.start


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists in our pid namespace (one we may not signal counts). A leftover named only
    by a pid (a ``run-<pid>-…`` cgroup, a ``.partial-<pid>-…`` tree) is removed once this is False."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
