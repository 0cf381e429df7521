"""Per-run cgroups for the sandbox: memory, process count and CPU bandwidth for the whole sandbox.

rlimits are per process (a program can fork its way around ``RLIMIT_AS``) and
``RLIMIT_NPROC`` counts a uid, not a run. A cgroup counts every process of the
run together. We use cgroup v1 controllers, or a delegated cgroup v2 subtree,
when this process may create groups below its own; otherwise nothing here is
claimed and the backend falls back to rlimits (and says so in Capabilities).

The child joins its group in ``preexec_fn`` *before* it drops to the sandbox uid
(joining needs privileges the sandbox uid must not have), so every process of
the run, bwrap included, is inside the group from its first instruction.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...models import ResourceLimits
from ...owner import pid_alive

__all__ = ["BWRAP_HELPER_PIDS", "CgroupSupport", "RunCgroup"]

#: bwrap keeps two processes of its own in the group (the monitor and the sandbox's pid 1).
BWRAP_HELPER_PIDS = 2

_CONTROLLERS = {"memory": "memory_bytes", "pids": "pids", "cpu": "cpus"}
#: The CFS period a CPU quota is measured over (the kernel's default): a group gets ``cpus`` times it per period.
_CPU_PERIOD_US = 100_000
#: The smallest quota the kernel takes (1 ms per period).
_MIN_CPU_QUOTA_US = 1000


@dataclass(frozen=True, slots=True)
class _Base:
    controller: str
    version: int
    path: Path
    """The group below which run groups are created (our own group, plus ``execspace``)."""


def _own_groups() -> dict[str, str]:
    """controller (or "" for v2) → our cgroup path, from /proc/self/cgroup."""
    groups: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for name in names.split(",") if names else [""]:
                groups[name] = path
    return groups


def _mounts() -> dict[str, Path]:
    """controller (or "" for v2) → mount point, from /proc/self/mountinfo."""
    found: dict[str, Path] = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            fstype, _, options = right.split(" ", 2)
            mount_point = Path(left.split(" ")[4])
            if fstype == "cgroup2":
                found.setdefault("", mount_point)
            elif fstype == "cgroup":
                for opt in options.split(","):
                    if opt in _CONTROLLERS:
                        found.setdefault(opt, mount_point)
    return found


class CgroupSupport:
    """What this host lets us do with cgroups; probed once per engine."""

    def __init__(self, bases: dict[str, _Base]) -> None:
        self._bases = bases

    @property
    def enforced(self) -> frozenset[str]:
        """Limit names a run group enforces here (``memory_bytes``, ``pids``, ``cpus``)."""
        return frozenset(_CONTROLLERS[c] for c in self._bases)

    def describe(self) -> dict[str, str]:
        return {c: f"cgroup v{b.version} at {b.path}" for c, b in sorted(self._bases.items())}

    @classmethod
    def detect(cls) -> CgroupSupport:
        """Find controllers we can create groups in; an empty support when none (never raises)."""
        try:
            groups, mounts = _own_groups(), _mounts()
        except (OSError, ValueError):
            return cls({})
        bases: dict[str, _Base] = {}
        for controller in _CONTROLLERS:
            base = cls._v1_base(controller, groups, mounts) or cls._v2_base(controller, groups, mounts)
            if base is not None and _can_create(base.path):
                bases[controller] = base
                _remove_stale(base.path)
        return cls(bases)

    @staticmethod
    def _v1_base(controller: str, groups: dict[str, str], mounts: dict[str, Path]) -> _Base | None:
        if controller not in groups or controller not in mounts:
            return None
        own = mounts[controller] / groups[controller].lstrip("/")
        return _Base(controller, 1, own / "execspace")

    @staticmethod
    def _v2_base(controller: str, groups: dict[str, str], mounts: dict[str, Path]) -> _Base | None:
        if "" not in groups or "" not in mounts:
            return None
        own = mounts[""] / groups[""].lstrip("/")
        try:
            # a delegated subtree: the controller is enabled for our children already
            enabled = (own / "cgroup.subtree_control").read_text().split()
        except OSError:
            return None
        return _Base(controller, 2, own) if controller in enabled else None

    def create(self, limits: ResourceLimits) -> RunCgroup | None:
        """A fresh group for one run with the requested limits; None when no limit needs one."""
        wanted = {c: b for c, b in self._bases.items() if getattr(limits, _CONTROLLERS[c]) is not None}
        if not wanted:
            return None
        name = f"run-{os.getpid()}-{secrets.token_hex(6)}"
        group = RunCgroup({c: b.path / name for c, b in wanted.items()}, {c: b.version for c, b in wanted.items()})
        try:
            group.setup(limits)
        except OSError:
            group.remove()
            raise
        return group


def _remove_stale(base: Path) -> None:
    """Remove run groups left by an execspace process that died before cleaning up."""
    with contextlib.suppress(OSError):
        for entry in base.iterdir():
            parts = entry.name.split("-")
            if len(parts) == 3 and parts[0] == "run" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                with contextlib.suppress(OSError):
                    entry.rmdir()


def _can_create(base: Path) -> bool:
    probe = base / f"probe-{secrets.token_hex(4)}"
    try:
        base.mkdir(exist_ok=True)
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


class RunCgroup:
    """The cgroups of one run: set limits, let the child join, read what was hit, remove."""

    def __init__(self, paths: dict[str, Path], versions: dict[str, int]) -> None:
        self.paths = paths
        self.versions = versions

    def setup(self, limits: ResourceLimits) -> None:
        for controller, path in self.paths.items():
            path.mkdir()
            v1 = self.versions[controller] == 1
            if controller == "memory" and limits.memory_bytes is not None:
                _write(path / ("memory.limit_in_bytes" if v1 else "memory.max"), limits.memory_bytes)
                # without this the group would spill into swap instead of being stopped
                swap = path / ("memory.memsw.limit_in_bytes" if v1 else "memory.swap.max")
                with contextlib.suppress(OSError):
                    _write(swap, limits.memory_bytes if v1 else 0)
            if controller == "pids" and limits.pids is not None:
                _write(path / "pids.max", limits.pids + BWRAP_HELPER_PIDS)
            if controller == "cpu" and limits.cpus is not None:
                quota = max(round(limits.cpus * _CPU_PERIOD_US), _MIN_CPU_QUOTA_US)
                if v1:
                    _write(path / "cpu.cfs_period_us", _CPU_PERIOD_US)
                    _write(path / "cpu.cfs_quota_us", quota)
                else:
                    (path / "cpu.max").write_text(f"{quota} {_CPU_PERIOD_US}")

    def enforces(self) -> frozenset[str]:
        """Limit names this group applies (the rest stays with rlimits)."""
        return frozenset(_CONTROLLERS[c] for c in self.paths)

    def join_fn(self) -> Callable[[], None]:
        """For ``preexec_fn``: move the calling (child) process into every group."""
        procs = [str(p / "cgroup.procs") for p in self.paths.values()]

        def join() -> None:
            pid = str(os.getpid()).encode()
            for file in procs:
                fd = os.open(file, os.O_WRONLY)
                try:
                    os.write(fd, pid)
                finally:
                    os.close(fd)

        return join

    def limit_hit(self) -> str | None:
        """Which limit stopped the run, judged from the group's own counters."""
        mem = self.paths.get("memory")
        if mem is not None and _counter(mem) > 0:
            return "memory_bytes"
        pids = self.paths.get("pids")
        if pids is not None and _events(pids / "pids.events").get("max", 0) > 0:
            return "pids"
        return None

    def remove(self) -> None:
        """Remove the groups; processes are gone by now, retry briefly while the kernel settles."""
        for path in self.paths.values():
            for _ in range(50):
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def _counter(path: Path) -> int:
    events = _events(path / "memory.events")
    if events:
        return events.get("oom_kill", 0) + events.get("max", 0)
    oom = _events(path / "memory.oom_control").get("oom_kill", 0)
    try:
        failcnt = int((path / "memory.failcnt").read_text())
    except (OSError, ValueError):
        failcnt = 0
    return oom + failcnt


def _events(file: Path) -> dict[str, int]:
    try:
        text = file.read_text()
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        with contextlib.suppress(ValueError):
            out[key] = int(value)
    return out


def _write(file: Path, value: int) -> None:
    file.write_text(str(value))
