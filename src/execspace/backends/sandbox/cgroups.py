"""Per-run cgroups for the sandbox: memory, process count and CPU bandwidth for the whole sandbox, and the freezer
that holds it still for a snapshot or a pause.

rlimits are per process (a program can fork its way around ``RLIMIT_AS``) and
``RLIMIT_NPROC`` counts a uid, not a run. A cgroup counts every process of the
run together. We use cgroup v1 controllers, or a delegated cgroup v2 subtree,
when this process may create groups below its own; otherwise nothing here is
claimed and the backend falls back to rlimits (and says so in Capabilities).

The freezer (v1's ``freezer`` controller, v2's ``cgroup.freeze``) is why every run and session gets a group where
there is one, limits or not: signals cannot hold a tree whose processes wake each other (``SIGCONT``) faster than
they are stopped, the kernel's freezer can (:class:`GroupFreeze`). The group counts the CPU its processes use too
(v1's ``cpuacct`` controller, v2's ``cpu.stat``, which every v2 group has): one read tells ``execspace serve`` whether
a sandbox is idle (:meth:`RunCgroup.cpu_clock`), where a walk of its processes would read a file per process.

The child joins its group in ``preexec_fn`` *before* it drops to the sandbox uid
(joining needs privileges the sandbox uid must not have), so every process of
the run, bwrap included, is inside the group from its first instruction.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...models import ResourceLimits
from ...owner import pid_alive
from ...process.freezing import Hold, StoppedTree
from ...process.proctree import tree_cpu_seconds

__all__ = ["BWRAP_HELPER_PIDS", "CgroupSupport", "GroupFreeze", "RunCgroup"]

#: bwrap keeps two processes of its own in the group (the monitor and the sandbox's pid 1).
BWRAP_HELPER_PIDS = 2

#: Controllers of a limit, with the limit's name.
_CONTROLLERS = {"memory": "memory_bytes", "pids": "pids", "cpu": "cpus"}
#: The v1 controller that freezes a group (v2 freezes any group but the root: ``cgroup.freeze``).
_FREEZER = "freezer"
#: The v1 controller that counts a group's CPU time (v2 counts it in any group: ``cpu.stat``).
_ACCOUNTING = "cpuacct"
#: The controllers every run's group joins where they are there, limits or not.
_ALWAYS = (_FREEZER, _ACCOUNTING)
#: The file that freezes a group, by cgroup version.
_STATE = {1: "freezer.state", 2: "cgroup.freeze"}
#: The name of the frozen group a hold makes in a run's group (``held-<hex>``).
_HELD = "held-"
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
                    if opt in _CONTROLLERS or opt in _ALWAYS:
                        found.setdefault(opt, mount_point)
    return found


class CgroupSupport:
    """What this host lets us do with cgroups; probed once per engine."""

    def __init__(self, bases: dict[str, _Base]) -> None:
        self._bases = bases

    @property
    def enforced(self) -> frozenset[str]:
        """Limit names a run group enforces here (``memory_bytes``, ``pids``, ``cpus``)."""
        return frozenset(_CONTROLLERS[c] for c in self._bases if c in _CONTROLLERS)

    @property
    def freezes(self) -> bool:
        """Whether run groups are frozen by the kernel here (else a pause or snapshot stops them by signals)."""
        return _FREEZER in self._bases

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
                _remove_stale(base)
        freezer = cls._v1_base(_FREEZER, groups, mounts) or cls._v2_freezer(groups, mounts, bases)
        if freezer is not None and _can_create(freezer.path, _STATE[freezer.version]):
            bases[_FREEZER] = freezer
            _remove_stale(freezer)
        accounting = cls._v1_base(_ACCOUNTING, groups, mounts)
        if accounting is not None and _can_create(accounting.path, "cpuacct.usage"):
            bases[_ACCOUNTING] = accounting
            _remove_stale(accounting)
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

    @staticmethod
    def _v2_freezer(groups: dict[str, str], mounts: dict[str, Path], limits: dict[str, _Base]) -> _Base | None:
        """v2 freezes the group a process is in, which is the limits' group where they are v2 (one hierarchy: a
        process is in one group), else one of our own."""
        if "" not in groups or "" not in mounts:
            return None
        v2 = [b.path for b in limits.values() if b.version == 2]
        own = mounts[""] / groups[""].lstrip("/")
        return _Base(_FREEZER, 2, v2[0] if v2 else own / "execspace")

    def create(self, limits: ResourceLimits) -> RunCgroup | None:
        """A fresh group for one run with the requested limits, and the freezer and CPU accounting where they are
        there; None when none of them is."""
        wanted = {c: b for c, b in self._bases.items() if c in _ALWAYS or getattr(limits, _CONTROLLERS[c]) is not None}
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


def _remove_stale(base: _Base) -> None:
    """Remove run groups left by an execspace process that died before cleaning up. A hold it left frozen is
    thawed first: its processes take the kill their bwrap's death sent them, and the groups empty."""
    with contextlib.suppress(OSError):
        for entry in base.path.iterdir():
            parts = entry.name.split("-")
            if len(parts) == 3 and parts[0] == "run" and parts[1].isdigit() and not pid_alive(int(parts[1])):
                for held in entry.glob(f"{_HELD}*"):
                    with contextlib.suppress(OSError):
                        _freeze(held, base.version, frozen=False)
                        held.rmdir()
                with contextlib.suppress(OSError):
                    entry.rmdir()


def _can_create(base: Path, needs: str = "cgroup.procs") -> bool:
    probe = base / f"probe-{secrets.token_hex(4)}"
    try:
        base.mkdir(exist_ok=True)
        probe.mkdir()
        try:
            return (probe / needs).exists()
        finally:
            probe.rmdir()
    except OSError:
        return False


class RunCgroup:
    """The cgroups of one run: set limits, let the child join, read what was hit, remove."""

    def __init__(self, paths: dict[str, Path], versions: dict[str, int]) -> None:
        self.paths = paths
        self.versions = versions
        self._let_go: set[Path] = set()
        """The frozen groups of its holds that were let go, their processes still in them (:class:`GroupFreeze`)."""

    def setup(self, limits: ResourceLimits) -> None:
        made: set[Path] = set()
        for controller, path in self.paths.items():
            # v2: one group for every controller; v1: one for controllers mounted together (cpu,cpuacct)
            path.mkdir(exist_ok=self.versions[controller] == 2 or path in made)
            made.add(path)
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
        return frozenset(_CONTROLLERS[c] for c in self.paths if c in _CONTROLLERS)

    def freezer(self, roots: Sequence[int], keep: Collection[int]) -> Hold:
        """The run's :class:`~execspace.process.freezing.Freezer`: its group frozen (but ``keep``), else signals to
        the trees under ``roots``."""
        path = self.paths.get(_FREEZER)
        if path is None:
            return StoppedTree(roots, keep)
        return GroupFreeze(path, self.versions[_FREEZER], keep, self._let_go)

    def cpu_clock(self, roots: Sequence[int]) -> float:
        """The run's :data:`~execspace.process.proctree.CpuClock`: the CPU seconds its group counted (v1's
        ``cpuacct.usage``, v2's ``cpu.stat``), else (no accounting here, or the group is gone) the tree's under
        ``roots`` summed."""
        accounting = self.paths.get(_ACCOUNTING)
        v2 = next((p for c, p in self.paths.items() if self.versions[c] == 2), None)
        try:
            if accounting is not None:
                return int((accounting / "cpuacct.usage").read_text()) / 1e9
            if v2 is not None:
                return _events(v2 / "cpu.stat")["usage_usec"] / 1e6
        except (OSError, ValueError, KeyError):
            pass  # removed with its run: what is left of the tree is summed
        return tree_cpu_seconds(roots)

    def join_fn(self) -> Callable[[], None]:
        """For ``preexec_fn``: move the calling (child) process into every group."""
        procs = list(dict.fromkeys(str(p / "cgroup.procs") for p in self.paths.values()))

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
        """Remove the groups, the thawed ones holds left below them first; processes are gone by now, retry
        briefly while the kernel settles."""
        for path in dict.fromkeys(self.paths.values()):
            for held in path.glob(f"{_HELD}*"):
                _rmdir(held)
            _rmdir(path)


class GroupFreeze:
    """A :class:`~execspace.process.freezing.Hold` by the cgroup freezer: every process of a run's group but ``keep``
    and their ancestors (a session's supervisor and bwrap, which keep answering) is moved into a frozen group of
    this hold's own below it, where the kernel holds it whatever signal it gets; a process forked or started before
    its move is moved by the next pass. Letting go thaws the frozen group: everything in it runs again at once, and
    stays there (moving a process between groups makes every fork and exit on the host wait for the kernel, which
    on a busy machine takes milliseconds a resumed sandbox's next command would wait too): the next hold takes them
    in from it, and the run's group's removal removes it. Holds nest: each has its own frozen group.

    A hold never outlives this process: a v1 frozen process does not even die of a signal until it is thawed (the
    kill bwrap's death sends its sandbox when this process dies, ``--die-with-parent``, would wait forever), and a
    v2 one left frozen would run nothing until someone thawed it. So each hold has a thawer, a shell in a session of
    its own that thaws the frozen group once the pipe from this process closes: at release, or when this process
    dies, however it dies."""

    def __init__(self, group: Path, version: int, keep: Collection[int], let_go: set[Path]) -> None:
        self._group = group
        self._let_go = let_go
        """The frozen groups the run's holds let go (shared by them): their processes are the next hold's too."""
        self._version = version
        self._held = group / f"{_HELD}{secrets.token_hex(4)}"
        self._spared = _with_ancestors(keep, _procs(group))
        self._made = False
        self._thawer: tuple[subprocess.Popen[bytes], int] | None = None

    def sweep(self, stop: threading.Event) -> str | None:
        if not self._made:
            self._held.mkdir()
            self._made = True
            self._thawer = _thawer(self._held, self._version)
            _freeze(self._held, self._version, frozen=True)
        moved = 0
        for pid in self._loose():
            if stop.is_set():
                return "interrupted"
            if pid not in self._spared:
                _move(pid, self._held)
                moved += 1
        if moved:
            return f"{moved} process{'es' if moved != 1 else ''} still outside the frozen group"
        if not _frozen(self._held, self._version):
            return "the kernel has not frozen every process yet (one in uninterruptible sleep, on a slow disk?)"
        return None

    def _loose(self) -> list[int]:
        """What a pass holds: the processes of the run's group, and those of the groups other holds let go
        (thawed, they run there); such a group found empty is removed."""
        pids = _procs(self._group)
        for other in list(self._let_go):
            found = _procs(other)
            if not found:
                with contextlib.suppress(OSError):
                    other.rmdir()
                self._let_go.discard(other)
            pids += found
        return pids

    def let_go(self) -> bool:
        """Thaw the frozen group: everything in it runs again at once (a process a pass still moves there too)."""
        if self._made:
            with contextlib.suppress(OSError):
                _freeze(self._held, self._version, frozen=False)
            self._let_go.add(self._held)
        return True

    def release(self) -> None:
        if not self._made:
            return
        with contextlib.suppress(OSError):
            _freeze(self._held, self._version, frozen=False)  # what a pass made after let_go, if it came first
        if self._thawer is not None:
            thawer, pipe = self._thawer
            os.close(pipe)
            with contextlib.suppress(subprocess.TimeoutExpired):
                thawer.wait(timeout=1.0)
        if not _procs(self._held):  # held nothing, or its processes ended (else they stay in it: see the class)
            with contextlib.suppress(OSError):
                self._held.rmdir()
                self._let_go.discard(self._held)


def _thawer(group: Path, version: int) -> tuple[subprocess.Popen[bytes], int]:
    """A shell, in a session of its own (no signal to this process's group reaches it), that thaws ``group`` once
    the returned pipe end is closed; the pipe's other end is its only link to this process."""
    read_end, write_end = os.pipe()  # both close-on-exec: no other child of this process holds the write end
    thaw = "THAWED" if version == 1 else "0"
    try:
        thawer = subprocess.Popen(
            ["/bin/sh", "-c", 'read -r _; echo "$2" > "$1"', "execspace-thaw", str(group / _STATE[version]), thaw],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return thawer, write_end


def _procs(group: Path) -> list[int]:
    """The processes of ``group`` (of this pid namespace's view), once each."""
    try:
        text = (group / "cgroup.procs").read_text()
    except OSError:
        return []
    return list(dict.fromkeys(int(pid) for pid in text.split()))


def _move(pid: int, group: Path) -> None:
    # a process that ended meanwhile cannot be moved (ESRCH); one that cannot for another reason is found again
    # by the next pass (and the hold does not settle)
    with contextlib.suppress(OSError):
        _write(group / "cgroup.procs", pid)


def _with_ancestors(keep: Collection[int], members: list[int]) -> frozenset[int]:
    """``keep`` and their ancestors in the group (``members``)."""
    inside = set(members)
    spared = set(keep)
    for pid in keep:
        parent = _parent(pid)
        while parent is not None and parent in inside and parent not in spared:
            spared.add(parent)
            parent = _parent(parent)
    return frozenset(spared)


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _freeze(group: Path, version: int, *, frozen: bool) -> None:
    state = ("FROZEN" if frozen else "THAWED") if version == 1 else ("1" if frozen else "0")
    (group / _STATE[version]).write_text(state)


def _frozen(group: Path, version: int) -> bool:
    """Whether the kernel froze every process of ``group`` (reading v1's state is what updates it)."""
    try:
        if version == 1:
            return (group / "freezer.state").read_text().strip() == "FROZEN"
        return _events(group / "cgroup.events").get("frozen") == 1
    except OSError:
        return False


def _rmdir(path: Path) -> None:
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
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
