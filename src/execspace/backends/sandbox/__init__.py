"""The ``sandbox`` backend: programs run on this host inside an OS sandbox.

Linux: bubblewrap (see :mod:`.bwrap` for the exact boundary). macOS: Seatbelt
(``sandbox-exec``, see :mod:`.seatbelt`). Other platforms, Windows included, fail
closed with ``UnsupportedBackend``. What a program may touch is a
:class:`~.policy.SandboxPolicy` (profile, path rules, network), enforced around the
program and by the engine's file API alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import functools
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from ...artifacts import ArtifactService
from ...backend import Probe
from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...environments import DEBIAN_PATH, Environment, EnvironmentStore, lookup_in_root
from ...envpolicy import MINIMAL_PATH, EnvPolicy
from ...errors import CapabilityError, InvalidSpec, SetupFailed, UnsupportedBackend
from ...languages import available_languages
from ...models import NetworkApprover, NetworkPolicy, ResourceLimits, RunProgramSpec, RunResult, Workspace
from ...process.freezing import SETTLE_SECONDS
from ...process.hostrunner import DISK_BYTES_DETAIL, HostRunner, unisolated_capabilities
from ...process.preparation import PreparedRun, ProgramLookup, lookup_on_path, signal_status
from ...process.rlimits import RLIMIT_ENFORCED, rlimit_preexec
from ...process.supervisor import Launch, SupervisedProcess
from ...rundirs import daemon_dirs
from ...workspace.branches import overlay_supported
from ...workspace.confine import ConfinedRoot, split_relpath
from ...workspace.diskimages import disk_tools_missing
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root, private_dir
from ...workspace.hostroots import closed_ancestor
from ...workspace.layout import ensure_layout
from ...workspace.protected import PlaceholderRun, Placeholders
from .bwrap import (
    SANDBOX_WORKSPACE,
    BwrapConfig,
    ProgramBind,
    build_argv,
    find_bwrap,
    hidden_by_default,
    is_sandbox_uid,
    open_program_bind,
    policy_mounts,
    sandbox_uid,
    tmpfs_sizes,
    visible_path_entries,
)
from .cgroups import CgroupSupport
from .egress import PROXY_PORT, EgressChannel, proxy_env
from .options import SandboxMode, SandboxOptions
from .policy import Access, Profile, Resolver, Resolvers, SandboxPolicy, file_access_hook
from .probecache import ProbeCache
from .seccomp import LOAD_FAILED_FIX, KernelSeccompFilters, SeccompFilters, check_probe, describe, probe_script
from .session import SessionConfig
from .supervisorbin import EGRESS_FIX, SESSION_FIX, egress_bridge_binary, supervisor_binary

__all__ = [
    "SANDBOX_WORKSPACE",
    "KernelSeccompFilters",
    "Profile",
    "SandboxBackend",
    "SandboxOptions",
    "SandboxPolicy",
    "SandboxProcess",
    "SandboxRunner",
    "SeccompFilters",
    "SessionConfig",
    "hidden_by_default",
    "sandbox_layout_owner",
    "which_in_sandbox",
]

DOES_NOT_PROTECT = (
    "kernel vulnerabilities: the boundary is Linux namespaces; a kernel exploit escapes it",
    "reading world-readable host system files (/usr, /etc…) that are bound read-only",
    "with network on: anything reachable from this host, including services on other hosts",
    "with a network allow-list: whatever the program sends to an allowed destination (exfiltration to it)",
    "CPU time is an rlimit per process, not a total; without cgroups so is memory (RLIMIT_AS of each process, and "
    "the sizes of the sandbox's tmpfs)",
    "disk usage is measured after a run (limit_hit), not stopped while the program writes",
)


#: How ``SessionConfig.disk_bytes`` bounds a session's sandbox.
DISK_BOUND_DETAIL = (
    "each workspace is a filesystem of that size of its own (sparse ext4 image, loop-mounted; a write past it fails "
    "with ENOSPC), and /tmp and /dev/shm tmpfs that together hold at most the same size (in memory; / and /dev are "
    "read-only): what a sandbox can write at once is at most twice the bound; the workspaces have no snapshots or "
    "forks"
)
#: ``Capabilities.details["tmpfs"]``: what a sandbox can write outside its workspace and grants, and its bound.
TMPFS_DETAIL = (
    "/ and /dev are read-only; the writable in-memory filesystems are /tmp and /dev/shm, tmpfs of at most 256 MiB "
    "and 64 MiB that together hold at most the run's memory_bytes (a quarter of it for /dev/shm; in session mode "
    "the session's SessionConfig.memory_bytes and disk_bytes, shared by its runs); a write past them fails with "
    "ENOSPC"
)
#: ``Capabilities.details["mode"]``: what survives what in each mode.
MODE_DETAILS = {
    "per-run": "per-run: one sandbox per run; nothing a run starts survives it",
    "session": "session: one sandbox per workspace, whose supervisor (PID 1) starts every run; programs started "
    "by one call survive it and share the sandbox (a server of one call is reachable on localhost by the next); "
    "nothing survives the session (workspace cleanup, idle timeout, engine close)",
}
#: What session mode shares between the runs of one workspace, stated in ``details["session"]``.
SESSION_DETAILS = (
    "the programs of one session share its uid, /tmp and PID namespace: they can see and signal each other, "
    "never the supervisor; their stdio are sockets (so no program reopens another's through /proc; "
    "/dev/stdout cannot be opened either); a run's timeout kills its process group through the supervisor and "
    "its escaped descendants by their run marker from the host (one that drops the marker from its environment "
    "lives until the session ends); no cgroup per run: a run asking for another network setting, pids, cpus, or a "
    "cgroup-enforced memory_bytes runs in a sandbox of its own, as in per-run mode"
)


def _c_compiler() -> str | None:
    return shutil.which("cc") or shutil.which("gcc")


def _is_root() -> bool:
    return os.geteuid() == 0


class SandboxRunner(HostRunner):
    """A HostRunner whose wrapper step puts each program in bubblewrap.

    Also starts long-lived processes of other components in a workspace's sandbox (:meth:`start_process`: a
    Jupyter kernel), under the same boundary, uid, limits and bookkeeping as a program.
    """

    def __init__(
        self,
        bwrap: str,
        *,
        network_default: bool,
        seccomp: SeccompFilters,
        capabilities: Callable[[], Capabilities],
        env_policy: EnvPolicy | None = None,
        policy: SandboxPolicy | None = None,
        hidden: Sequence[Path] = (),
        cgroups: CgroupSupport | None = None,
        owner: Callable[[Workspace], tuple[int, int] | None] | None = None,
        kill_grace: float = 2.0,
        network_allow: NetworkPolicy | None = None,
        on_network_attempt: NetworkApprover | None = None,
        environment: Environment | None = None,
        program_binds: tuple[tuple[str, str], ...] = (),
        system_files: tuple[tuple[str, str], ...] = (),
        disk_bound: int | None = None,
        environment_store: EnvironmentStore | None = None,
        output_rate: int | None = None,
    ) -> None:
        lookup, path_view = _environment_view(environment)
        super().__init__(
            capabilities,
            env_policy,
            kill_grace=kill_grace,
            output_rate=output_rate,
            owner=owner,
            program_root=lambda _ws: SANDBOX_WORKSPACE,
            lookup=lookup,
            path_view=path_view,
        )
        self.path_view = path_view
        self.environment = environment
        self.program_binds = program_binds
        self.system_files = tuple((path, text.encode()) for path, text in system_files)
        # a bound on what the sandbox can write (a session's disk_bytes): its tmpfs stay within it too
        self.disk_bound = disk_bound
        self.cgroups = cgroups or CgroupSupport({})
        # Popen(user=...) makes CPython fork a copy of this process instead of vfork-ing; util-linux's
        # setpriv drops the uid after the exec instead (≈1.5 ms less per run, +8–10 % throughput)
        self.setpriv = shutil.which("setpriv")
        # in the sandbox's own session (bwrap --new-session), util-linux's setsid --ctty makes a pty run's terminal
        # the program's controlling tty: ^C, job control and SIGWINCH reach it and not bwrap
        self.setsid = _visible(shutil.which("setsid"))
        self.bwrap = bwrap
        self.network_default = network_default
        # the engine's allow-list: the network of every run that does not choose its own
        self.network_allow = network_allow
        self.on_network_attempt = on_network_attempt
        self.seccomp = seccomp
        self.policy = policy or SandboxPolicy().with_home(os.environ.get("HOME"))
        self.resolvers = Resolvers(self.policy)
        # host directories never visible through a grant (the engine's workspaces, the daemon's, the environment
        # store), but for the environment trees a run is in (environment_store), read-only
        self.hidden = tuple(hidden)
        self.environment_store = environment_store
        # shared with clones (with_seccomp): their runs mount the same placeholders
        self.placeholders = Placeholders()
        self._bridge: Path | None = None

    def in_environment(self, spec: RunProgramSpec) -> SandboxRunner:
        """The runner for ``spec``: this one, or for a run naming another runtime environment, the same runner
        (shared bookkeeping, as :meth:`with_seccomp`) with that tree bound and its bin first. The name is looked
        up for every such run, so a rebuilt environment is the one it gets."""
        if spec.environment is None:
            return self
        environment = EnvironmentStore().get(spec.environment)
        if self.environment is not None and environment.path == self.environment.path:
            return self
        clone = copy.copy(self)
        clone.environment = environment
        clone.policy = _with_environment(self.policy, environment)
        clone.resolvers = Resolvers(clone.policy)
        lookup, clone.path_view = _environment_view(environment)
        clone.preparation = self.preparation.with_lookup(lookup, clone.path_view)
        return clone

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        runner = self.in_environment(spec)
        if runner is not self:
            return await runner.run_program(ws, spec)
        return await super().run_program(ws, spec)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> SupervisedProcess:
        runner = self.in_environment(spec)
        if runner is not self:
            return await runner.start_program(ws, spec)
        return await super().start_program(ws, spec)

    def with_seccomp(self, seccomp: SeccompFilters) -> SandboxRunner:
        """The same runner (policy, uid, cgroups, environment, programs known to :meth:`stop_programs`) with other
        seccomp filters: for processes such as a sandboxed Jupyter kernel (:class:`~.seccomp.KernelSeccompFilters`)."""
        clone = copy.copy(self)
        clone.seccomp = seccomp
        return clone

    async def start_process(
        self,
        ws: Workspace,
        argv: Sequence[str],
        *,
        limits: ResourceLimits,
        seccomp: SeccompFilters | None = None,
    ) -> SandboxProcess:
        """Start a long-lived process in ``ws``'s sandbox, as a program would run there.

        The same boundary, policy mounts, uid and environment as :meth:`run_program`; ``limits`` hold for the whole
        sandbox for the process's life (a cgroup where it can, else rlimits); no deadline; stdin stays open
        (``process.write_stdin``); it dies with this process (``--die-with-parent``); the run's placeholders go
        when it exits; :meth:`stop_programs` kills it with the workspace's programs.

        Args:
            seccomp: the filters bwrap loads (default: the runner's), e.g. :class:`KernelSeccompFilters`.

        Raises:
            FileNotFoundError: ``argv[0]`` is a bare name not found in the sandbox.
            OSError: the sandbox could not be started.
        """
        runner = self if seccomp is None else self.with_seccomp(seccomp)
        spec = RunProgramSpec(argv[0], list(argv[1:]), timeout=None, limits=limits)
        prep = runner.preparation.prepare(ws, spec)
        if isinstance(prep, RunResult):
            raise FileNotFoundError(prep.stderr.strip())
        launch = runner.wrap(prep, interactive=True)
        # pinned now, to the directory made for this run, whatever a program renames around it later
        with ConfinedRoot(str(prep.root)) as cr:
            dir_fd = cr.open_dir(split_relpath(prep.run_dir))
        try:
            proc = await runner.spawn_prepared(prep, launch)
        except BaseException:
            os.close(dir_fd)
            raise
        return SandboxProcess(proc, prep.run_dir, f"{SANDBOX_WORKSPACE}/{prep.run_dir}", dir_fd)

    def wrap(self, prep: PreparedRun, *, interactive: bool = False, init_fd: int | None = None) -> Launch:
        """The bwrap launch of ``prep``; ``init_fd``: the program is a session's supervisor, read from that fd
        (see :attr:`.bwrap.BwrapConfig.init_fd`), which the launch passes to bwrap."""
        # the run's placeholders go once it is over: exited, timed out, killed, or failed to start
        held = self.placeholders.run()
        try:
            launch = self._wrap(prep, held, interactive, init_fd)
        except BaseException:
            held.release()
            raise
        launch.on_exit.append(held.release)
        return launch

    def program_env(self, prep: PreparedRun) -> dict[str, str]:
        """The environment of ``prep``'s program in the sandbox: its PATH without what the sandbox hides (the
        runtime environment's bin first), the runtime environment's variables where the run sets none of its own,
        and temporary files in the sandbox's own /tmp where the workspace's ``tmp`` is not writable."""
        env = dict(prep.env)
        env["PATH"] = self.path_view(env["PATH"])
        if self.environment is not None:
            env.update({k: v for k, v in self.environment.program_env().items() if k not in prep.spec.env})
        if not self.access_of(prep.root, "tmp").can_write:
            env.update(TMPDIR="/tmp", TMP="/tmp", TEMP="/tmp")
        return env

    def access_of(self, root: Path, rel: str) -> Access:
        """What the policy gives a program at ``rel`` of the workspace at ``root``."""
        return self.resolvers(os.path.realpath(root)).access(rel)

    def _wrap(self, prep: PreparedRun, held: PlaceholderRun, interactive: bool, init_fd: int | None) -> Launch:
        wanted = self.network_allow if prep.spec.network is None else prep.spec.network
        network = self.network_default if wanted is None else wanted == "on"
        env = self.program_env(prep)
        res = self.resolvers(os.path.realpath(prep.root))
        binds = self._open_binds(res.root, prep.ws)
        # every fd bwrap reads from; closed right after the spawn, or here if anything fails before it
        data_fds = [b.fd for b in binds]
        egress = None
        try:
            system_root = (
                None if self.environment is None or self.environment.root is None else str(self.environment.root)
            )
            mounts = policy_mounts(
                res,
                prep.cwd_rel,
                held=held,
                hidden=self.hidden,
                shown=self._shown_environments(res),
                binds=binds,
                system_root=system_root,
            )
            inner = list(prep.argv)
            if prep.spec.pty is not None:
                if self.setsid is None:
                    raise CapabilityError("a pseudo-terminal (pty)", "sandbox", "install util-linux (setsid)")
                inner = [self.setsid, "--ctty", *inner]
            if isinstance(wanted, NetworkPolicy):
                # the network stays off (own namespace, off filter): the channel to the proxy is the only way out
                egress = EgressChannel(wanted, self._bridge_binary(), prep.root, prep.run_dir, self.on_network_attempt)
                mounts, inner = [*mounts, *egress.bwrap_args()], egress.argv(inner)
                env.update(proxy_env(PROXY_PORT))
            seccomp_fd = self.seccomp.open_filter_fd(network_restricted=not network)
            data_fds.append(seccomp_fd)
            files = []
            for path, data in self.system_files:
                files.append((_data_fd(data), path))
                data_fds.append(files[-1][0])
            tmp_size, shm_size = tmpfs_sizes(prep.spec.limits.memory_bytes, self.disk_bound)
            cfg = BwrapConfig(self.bwrap, network, tmp_size, shm_size, mounts, files, init_fd, system_root=system_root)
            chdir = prep.cwd_view or None
            argv = build_argv(cfg, prep.root, prep.cwd_rel, inner, seccomp_fd=seccomp_fd, chdir=chdir)
            launch = self.launch(prep, argv, env, str(prep.root), interactive=interactive)
        except BaseException:
            for fd in data_fds:
                os.close(fd)
            if egress is not None:
                egress.close()
            raise
        if egress is not None:
            launch.pass_fds = (*launch.pass_fds, *egress.pass_fds)
            launch.after_spawn.append(egress.started)
            launch.on_exit.append(egress.close)
            launch.annotate.append(egress.annotate)
        launch.pty_controlling = False
        launch.signal_target = _program_group
        launch.exit_status = functools.partial(_bwrap_exit_status, prep.argv[0])
        # bwrap has its own copy once started: ours closes right after the spawn, even a failed one
        launch.pass_fds = (*launch.pass_fds, *data_fds, *(() if init_fd is None else (init_fd,)))
        launch.after_spawn += [functools.partial(os.close, fd) for fd in data_fds]
        if _is_root():
            self._drop_to_sandbox_uid(prep, launch)
        return launch

    def _shown_environments(self, res: Resolver) -> tuple[str, ...]:
        """The policy's host grants that are built trees of the (hidden) environment store: the run's environment,
        serve's kernels'. Each is bound alone, read-only; any other grant there is refused."""
        store = self.environment_store
        if store is None:
            return ()
        return tuple(t.path for t in res.targets if t.rel is None and t.access.can_read and store.holds(t.path))

    def _open_binds(self, root: str, ws: Workspace) -> list[ProgramBind]:
        """The program binds of a run, each directory opened (see :func:`.bwrap.open_program_bind`)."""
        binds: list[ProgramBind] = []
        try:
            for path, rel in self.program_binds:
                binds.append(ProgramBind(open_program_bind(root, rel, self.preparation.owner(ws)), path, rel))
        except BaseException:
            for b in binds:
                os.close(b.fd)
            raise
        return binds

    def _bridge_binary(self) -> Path:
        if self._bridge is None:
            # built once per host and user, then found in the cache: the first allow-list run waits for the build
            self._bridge = egress_bridge_binary(_private_execspace_dir())
        return self._bridge

    def _drop_to_sandbox_uid(self, prep: PreparedRun, launch: Launch) -> None:
        """Start bwrap as the workspace's unprivileged uid, inside a per-run cgroup when limits or the freezer
        need one (its tree is then held still by the freezer, see :class:`.cgroups.GroupFreeze`)."""
        uid = sandbox_uid(prep.root)
        limits = prep.spec.limits
        group = self.cgroups.create(limits)
        if group is None:
            launch.preexec_fn = _with_nproc(launch.preexec_fn, limits.pids)
            if self.setpriv is None:
                launch.user, launch.group = uid, uid
            else:
                drop = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
                launch.argv = [*drop, *launch.argv]
            return
        # the group does these for the whole sandbox; per-process rlimits would only get in the way
        in_group = group.enforces()
        rest = replace(
            limits,
            memory_bytes=None if "memory_bytes" in in_group else limits.memory_bytes,
            pids=None if "pids" in in_group else limits.pids,
        )
        # joining a cgroup needs root, so the uid is dropped here, after joining, not by Popen
        launch.preexec_fn = _join_then_drop(group.join_fn(), _with_nproc(rlimit_preexec(rest), rest.pids), uid)
        launch.freezer = group.freezer
        hit: list[str | None] = [None]

        def finish() -> None:
            hit[0] = group.limit_hit()
            group.remove()

        launch.on_exit.append(finish)
        rlimit_classify = launch.classify_exit
        launch.classify_exit = lambda code: hit[0] or (rlimit_classify(code) if rlimit_classify else None)


@dataclass(frozen=True, slots=True)
class SandboxProcess:
    """A long-lived process in a workspace's sandbox (:meth:`SandboxRunner.start_process`)."""

    process: SupervisedProcess
    """Its supervision: ``stream``, ``write_stdin``, ``kill``, ``wait`` (its pid is bwrap's, not its own)."""
    run_dir: str
    """Its run directory, workspace-relative (``runs/…``), writable by it."""
    run_path: str
    """The same directory as the process sees it (``/workspace/runs/…``)."""
    run_dir_fd: int
    """An fd of that directory, opened before the process started (so it is the one made for it): the caller's
    to close."""


def _environment_view(environment: Environment | None) -> tuple[ProgramLookup, Callable[[str], str]]:
    """How a program is found and the PATH it gets: in the host's system directories (with a venv's ``bin``,
    bound by the policy, first), or in a rootfs environment's own, on Debian's PATH."""
    if environment is not None and environment.root is not None:
        return functools.partial(lookup_in_root, environment.root), lambda _path: DEBIAN_PATH
    if environment is None:
        return which_in_sandbox, functools.partial(_path_view, None)
    # the environment's bin is bound by the policy, wherever it lies: the view keeps it, the lookup too
    return lookup_on_path, functools.partial(_path_view, str(environment.bin_dir))


def _with_environment(policy: SandboxPolicy, environment: Environment) -> SandboxPolicy:
    """``policy`` reading a venv environment's tree at its own path; a rootfs is the sandbox's ``/`` instead, its
    host path never shown."""
    return policy if environment.root is not None else policy.with_read_paths(environment.path)


def _path_view(bin_dir: str | None, path: str) -> str:
    """``path`` as a sandbox sees it, with ``bin_dir`` (a runtime environment's, bound by the policy) first."""
    view = visible_path_entries(path) or MINIMAL_PATH
    return view if bin_dir is None else ":".join(dict.fromkeys([bin_dir, *view.split(":")]))


def which_in_sandbox(cmd: str, path: str = MINIMAL_PATH) -> str | None:
    """The program a sandbox starts for ``cmd``: a bare name is looked up on the entries of ``path`` the sandbox
    sees (no ``/root``, ``/home``… ones); a path is started as given."""
    if "/" in cmd:
        return cmd
    return lookup_on_path(cmd, visible_path_entries(path) or MINIMAL_PATH)


#: bwrap's own error when the program cannot be executed, by strerror: what a shell exits with then
_EXEC_ERRORS = {
    os.strerror(errno.ENOENT): 127,
    os.strerror(errno.EACCES): 126,
    os.strerror(errno.ENOEXEC): 126,
    os.strerror(errno.EISDIR): 126,
    os.strerror(errno.ENOTDIR): 126,
}


def _bwrap_exit_status(program: str, code: int, stderr: bytes) -> tuple[int, bytes]:
    """The program's exit code as every backend reports it, from bwrap's, and the stderr to report: 127/126 with
    our explanation when bwrap's exec of ``program`` failed (bwrap exits 1 after ``bwrap: execvp PROGRAM: ERROR``),
    ``-N`` when the program was killed by signal N (bwrap exits ``128 + N``), else the program's own code."""
    if code != 1:
        return signal_status(code), stderr
    prefix = f"bwrap: execvp {program}: ".encode()
    if not (stderr.startswith(prefix) and stderr.endswith(b"\n")):
        return code, stderr
    error = stderr[len(prefix) : -1].decode(errors="replace")
    status = _EXEC_ERRORS.get(error)
    if status is None:
        return code, stderr
    return status, f"execspace: cannot execute {program!r} in the sandbox: {error}{exec_hint(program)}\n".encode()


def exec_hint(program: str) -> str:
    """Why a program path the host has is missing in the sandbox, and the fix ('' when we cannot tell)."""
    if not os.path.isabs(program):
        return ""
    if not os.path.lexists(program):
        return " (nor is it on this host)"
    real = os.path.realpath(program)
    if real != program and os.path.islink(program):
        home = os.path.dirname(os.path.dirname(real))
        closed = closed_ancestor(home)
        grant = (
            f"make the venv from a Python others can read (its install is under {closed}, which the sandbox's uid "
            "cannot pass)"
            if closed is not None
            else f"grant that install read-only, e.g. --read {home} (read_paths=)"
        )
        return (
            f" ({program} is a link to {real}, which the sandbox does not show: a venv's python links to the "
            f"Python it was made from; {grant}, or run the sandbox's python3 with the venv's site-packages on "
            "PYTHONPATH)"
        )
    return (
        f" ({program} is on this host but not in the sandbox: grant its directory, e.g. --read "
        f"{os.path.dirname(program)}; if it is a script, the interpreter on its #! line must be in the sandbox too)"
    )


def _with_nproc(inner: Any, pids: int | None) -> Any:
    if pids is None:
        return inner

    def apply() -> None:
        import resource

        if inner is not None:
            inner()
        # the uid is unique to this workspace, so NPROC counts only its processes
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))

    return apply


def _host_cgroups() -> CgroupSupport:
    """The cgroup controllers runs get groups in here: root's, on Linux; none otherwise."""
    return CgroupSupport.detect() if _is_root() and sys.platform.startswith("linux") else CgroupSupport({})


def _session_limits(config: SessionConfig, groups: CgroupSupport) -> str:
    """What bounds each session as a whole (its ``SessionConfig``), and how; "" when nothing does."""
    limits = []
    if config.memory_bytes is not None:
        limits.append(f"memory_bytes={config.memory_bytes}: {_memory_detail(groups)}")
    if config.pids is not None:
        limits.append(f"pids={config.pids}: {_pids_detail(groups)}")
    if config.cpus is not None:
        limits.append(f"cpus={config.cpus}: {_cpus_detail(groups)}")
    if config.disk_bytes is not None:
        limits.append(f"disk_bytes={config.disk_bytes}: {DISK_BOUND_DETAIL}")
    return "; ".join(limits)


def _pids_detail(groups: CgroupSupport) -> str:
    if "pids" in groups.enforced:
        return "cgroup pids.max over the whole sandbox (" + groups.describe()["pids"] + ")"
    return "RLIMIT_NPROC of the per-workspace uid" if _is_root() else "not enforced (not root)"


def _cpus_detail(groups: CgroupSupport) -> str:
    if "cpus" in groups.enforced:
        return "cgroup CPU quota over the whole sandbox, throttled past it (" + groups.describe()["cpu"] + ")"
    return "not enforced (a cgroup CPU controller needs root)"


def _freeze_detail(groups: CgroupSupport) -> str:
    """How a snapshot or a pause holds the sandbox's processes still."""
    if groups.freezes:
        return "cgroup freezer of each run's and session's group (" + groups.describe()["freezer"] + ")"
    return (
        "SIGSTOP to every process, sent again to any woken or new one while held; a tree not all stopped within "
        f"{SETTLE_SECONDS:g} s fails the pause or snapshot (FreezeFailed)"
    )


def _memory_detail(groups: CgroupSupport) -> str:
    if "memory_bytes" in groups.enforced:
        return (
            "cgroup memory limit over the whole sandbox, swap and its tmpfs pages included ("
            + groups.describe()["memory"]
            + ")"
        )
    # no cgroup (not root): the tmpfs sizes are what bounds the memory that no process's address space holds
    return (
        "RLIMIT_AS per process (each process's address space, not their sum), and the sizes of the sandbox's "
        "in-memory filesystems, which RLIMIT_AS does not count: / and /dev read-only, /tmp and /dev/shm together "
        "at most memory_bytes (see details['tmpfs'])"
    )


def _join_then_drop(join: Any, limits: Any, uid: int) -> Any:
    def apply() -> None:
        join()
        if limits is not None:
            limits()
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return apply


class SandboxBackend:
    name = "sandbox"
    options = SandboxOptions

    @classmethod
    async def probe(cls, options: SandboxOptions, /) -> Probe:
        if options.mode == "session" and sys.platform.startswith("linux") and not _c_compiler():
            return Probe(
                False, "session mode builds its supervisor with a C compiler, and none is on PATH", SESSION_FIX
            )
        return await cls.probe_boundary(options.bwrap)

    @classmethod
    async def probe_boundary(
        cls, bwrap: str | None = None, *, seccomp: SeccompFilters | None = None, cache: ProbeCache | None = None
    ) -> Probe:
        """Whether the boundary holds here with bwrap ``bwrap``, loading ``seccomp`` (default: the filters every
        run loads), with its verdict kept in ``cache``."""
        if sys.platform == "darwin":
            from .seatbelt import probe_seatbelt  # macOS only: Linux never pays for importing it

            return await asyncio.to_thread(probe_seatbelt)
        if not sys.platform.startswith("linux"):
            return Probe(False, _UNSUPPORTED_PLATFORM.format(platform=sys.platform), _UNSUPPORTED_FIX)
        path = find_bwrap(bwrap)
        if path is None:
            return Probe(False, "bubblewrap (bwrap) is not installed", "apt-get install bubblewrap")
        return await asyncio.to_thread(_cached_probe, path, seccomp or SeccompFilters(), cache or ProbeCache())

    @classmethod
    def capabilities(
        cls,
        env_policy: EnvPolicy | None = None,
        network_default: bool = False,
        *,
        policy: SandboxPolicy | None = None,
        cgroups: CgroupSupport | None = None,
        mode: SandboxMode = "per-run",
    ) -> Capabilities:
        if policy is not None and not policy.managed:
            return _unmanaged_capabilities(policy, env_policy)
        if sys.platform == "darwin":
            from .seatbelt import seatbelt_capabilities

            return seatbelt_capabilities(policy or SandboxPolicy(), env_policy)
        if policy is not None:
            network_default = policy.network_enabled
        host_path = (env_policy or EnvPolicy()).program_path(os.environ)
        limits = {"timeout", "output_bytes", "disk_bytes"} | RLIMIT_ENFORCED
        # what open() would enforce here, so that a statement made without opening (doctor) says the same
        groups = cgroups if cgroups is not None else _host_cgroups()
        if _is_root():
            limits.add("pids")
        limits |= groups.enforced & {"cpus"}
        return Capabilities(
            backend="sandbox",
            isolation=Isolation.PROCESS,
            network_control=True,
            network_default=network_default,
            network_domains=_c_compiler() is not None,
            clean_env=True,
            read_only_mounts=True,
            streaming=True,
            # a session's supervisor makes the terminal the program's controlling tty itself
            pty=mode == "session" or _visible(shutil.which("setsid")) is not None,
            host_paths=True,
            environments=True,
            enforced_limits=frozenset(limits),
            languages=available_languages(visible_path_entries(host_path) or MINIMAL_PATH),
            fork="cow" if overlay_supported() else "copy",
            does_not_protect=DOES_NOT_PROTECT,
            details={
                "boundary": "bubblewrap: user/pid/ipc/uts/net namespaces, read-only system dirs, "
                "no host /home /root /run",
                "uid": "per-workspace unprivileged uid" if _is_root() else "your uid, without capabilities",
                "pids": _pids_detail(groups),
                "memory_bytes": _memory_detail(groups),
                "cpus": _cpus_detail(groups),
                "freeze": _freeze_detail(groups),
                "disk_bytes": DISK_BYTES_DETAIL,
                "tmpfs": TMPFS_DETAIL,
                "seccomp": describe(),
                "profile": (policy or SandboxPolicy()).summary(),
                "mode": MODE_DETAILS[mode],
                **({"session": SESSION_DETAILS} if mode == "session" else {}),
            },
        )

    @classmethod
    async def open(cls, options: SandboxOptions, /) -> BaseEngine:
        """Open a sandbox engine with ``options`` (see :class:`SandboxOptions`; ``mode="session"``: see
        :mod:`.sessionrunner`); raise ``SetupFailed`` (cause and fix) if the boundary does not work here."""
        workspace_root, env_policy, kill_grace = options.workspace_root, options.env_policy, options.kill_grace
        host_roots, artifacts, bwrap, mode = options.host_roots, options.artifacts, options.bwrap, options.mode
        if sys.platform != "darwin" and not sys.platform.startswith("linux"):
            raise UnsupportedBackend(
                f"sandbox: {_UNSUPPORTED_PLATFORM.format(platform=sys.platform)}; {_UNSUPPORTED_FIX}"
            )
        allow = options.network if isinstance(options.network, NetworkPolicy) else None
        policy = _resolve_policy(options.policy, False if allow is not None else cast("bool | None", options.network))
        environment = _runtime_environment(options.environment, policy)
        if environment is not None:
            policy = _with_environment(policy, environment)
        root = Path(workspace_root) if workspace_root else default_workspace_root().with_name("sandbox")
        if mode == "session" and (sys.platform == "darwin" or not policy.managed):
            raise UnsupportedBackend(
                "sandbox mode='session' runs on Linux with a managed profile (workspace-write, read-only); "
                "use mode='per-run' here"
            )
        if not policy.managed:
            return _open_unmanaged(policy, root, env_policy, host_roots, artifacts, kill_grace)
        seccomp = SeccompFilters()  # built once for this engine, shared by the probe and every run
        probe = await cls.probe_boundary(bwrap, seccomp=seccomp)
        if not probe.ok:
            raise SetupFailed("sandbox", probe.reason, probe.fix)
        cgroups = _host_cgroups()
        caps = cls.capabilities(env_policy, policy=policy, cgroups=cgroups, mode=mode)
        if environment is not None:
            caps = replace(caps, details={**caps.details, "environment": environment.summary()})
        if sys.platform == "darwin":
            from .seatbelt import seatbelt_engine

            return seatbelt_engine(policy, root, caps, env_policy, host_roots, artifacts, kill_grace)
        bwrap_path = find_bwrap(bwrap)
        assert bwrap_path is not None
        as_root = _is_root()
        private = _private_execspace_dir()
        store = _environment_store()

        def owner(ws: Workspace) -> tuple[int, int] | None:
            if not as_root or ws.host_path is None:
                return None
            uid = sandbox_uid(ws.host_path)
            return uid, uid

        fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, owner=owner, access=file_access_hook(policy))
        runner_options: dict[str, Any] = {
            "network_default": policy.network_enabled,
            "seccomp": seccomp,
            "policy": policy,
            "hidden": (root, private, *_daemon_dirs(as_root), *_store_dirs(store)),
            "environment_store": store,
            "cgroups": cgroups,
            "owner": owner,
            "capabilities": lambda: caps,
            "env_policy": env_policy,
            "kill_grace": kill_grace,
            "output_rate": options.output_rate,
            "network_allow": allow,
            "on_network_attempt": options.on_network_attempt,
            "environment": environment,
            "program_binds": options.program_binds,
            "system_files": options.system_files,
        }
        if allow is not None and not caps.network_domains:
            raise CapabilityError("a network allow-list (NetworkPolicy)", "sandbox", EGRESS_FIX)
        prepare = sandbox_layout_owner() if as_root else None
        if mode == "session":
            config = options.session or SessionConfig()
            if config.pids is not None and "pids" not in caps.enforced_limits:
                raise CapabilityError(
                    "SessionConfig.pids", "sandbox", "limiting a session's processes needs root (a cgroup or its uid)"
                )
            if config.cpus is not None and "cpus" not in caps.enforced_limits:
                raise CapabilityError(
                    "SessionConfig.cpus", "sandbox", "a session's CPU quota is a cgroup: run as root (cpu controller)"
                )
            if config.disk_bytes is not None:
                if why := disk_tools_missing():
                    raise CapabilityError("SessionConfig.disk_bytes", "sandbox", why)
                runner_options["disk_bound"] = config.disk_bytes
                caps = replace(caps, fork=None)  # its manager refuses them: a copy would not be bounded
            if limits := _session_limits(config, cgroups):
                caps = replace(caps, details={**caps.details, "session_limits": limits})
            return await _open_session(bwrap_path, runner_options, config, root, prepare, fs, caps)
        runner = SandboxRunner(bwrap_path, **runner_options)
        manager = HostWorkspaceManager(
            "sandbox",
            root,
            prepare=prepare,
            program_path=lambda _p: SANDBOX_WORKSPACE,
            program_binds=options.program_binds,
            private_root=not as_root,
            stop_programs=runner.stop_programs,
            copy_on_write=True,
            freeze=runner.frozen,
        )
        return BaseEngine("sandbox", manager, fs, runner, caps)


async def _open_session(
    bwrap: str,
    runner_options: dict[str, Any],
    config: SessionConfig,
    root: Path,
    prepare: Callable[[Path], None] | None,
    fs: HostWorkspaceFS,
    caps: Capabilities,
) -> BaseEngine:
    from .sessionrunner import SessionRunner  # it builds on SandboxRunner, defined here

    supervisor = await asyncio.to_thread(supervisor_binary, _private_execspace_dir())
    policy: SandboxPolicy = runner_options["policy"]
    runner = SessionRunner(
        bwrap,
        supervisor=supervisor,
        config=config,
        workspace_root=root,
        root_mode=0o711 if _is_root() else 0o700,
        prepare_slot=prepare,
        # no-access globs are judged against a workspace's files when its sandbox starts; a slot has none; a slot
        # becomes a workspace by a rename, which a disk-bounded one's mount point refuses (EBUSY)
        pool=not policy.no_access_globs and config.disk_bytes is None,
        **runner_options,
    )
    manager = HostWorkspaceManager(
        "sandbox",
        root,
        prepare=prepare,
        program_path=lambda _p: SANDBOX_WORKSPACE,
        program_binds=runner_options["program_binds"],
        private_root=not _is_root(),
        adopt=runner.adopt if runner.pool is not None else None,
        refill=runner.refill if runner.pool is not None else None,
        stop_programs=runner.stop_programs,
        copy_on_write=True,
        freeze=runner.frozen,
        disk_bytes=config.disk_bytes,
    )
    return BaseEngine("sandbox", manager, fs, runner, caps, on_close=runner.aclose)


def _data_fd(data: bytes) -> int:
    """An fd bwrap reads ``data`` from (``--ro-bind-data``), positioned at its start."""
    fd = os.memfd_create("execspace-system-file", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


_UNSUPPORTED_PLATFORM = (
    "no OS sandbox for {platform}: execspace sandboxes programs with bubblewrap on Linux and "
    "Seatbelt on macOS; Windows (AppContainer, job objects) is not implemented"
)
_UNSUPPORTED_FIX = "run execspace inside WSL2 (bubblewrap works there), or use the container or e2b backend"
_EXTERNAL_REFUSAL = (
    "the sandbox engine was opened with Profile.EXTERNAL: isolation is provided elsewhere, so this "
    "engine refuses to run programs locally; run them where that isolation is, or open the engine "
    "with a managed profile (workspace-write, read-only)"
)


def _visible(path: str | None) -> str | None:
    """``path`` if a sandbox sees it (under a top-level directory it binds), else None."""
    return path if path is not None and not hidden_by_default(os.path.realpath(path)) else None


def _program_group(bwrap_pid: int) -> int | None:
    """The process group of the program bwrap runs: bwrap's child is the sandbox's init (in a session of its
    own), whose child is the program; a signal for the program goes to that group, never to bwrap itself.
    None until the program exists (the sandbox is being set up)."""
    pid = bwrap_pid
    for _ in range(2):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = f.read().split()
        except OSError:
            return None
        if not children:
            return None
        pid = int(children[0])
    try:
        group, own = os.getpgid(pid), os.getpgid(bwrap_pid)
    except OSError:
        return None
    # the program is forked before it leaves bwrap's group: until then a signal would reach bwrap too
    return None if group == own else group


def _daemon_dirs(as_root: bool) -> tuple[Path, ...]:
    """The warm daemon's directories: its key there lets a client run commands outside any sandbox.
    A root caller's are 0700 root and its programs run under other uids, which the daemon refuses:
    masking them would only break grants over their parents (bwrap cannot reach a mount point there)."""
    return () if as_root else tuple(map(Path, daemon_dirs()))


def _environment_store() -> EnvironmentStore:
    """This caller's environment store, made now: hidden from every sandbox, even through a grant that covers it,
    so it must exist before a program with a write grant over its parent could make it and plant a tree in it
    that a later build would take as built."""
    store = EnvironmentStore()
    with contextlib.suppress(OSError):  # not creatable here: then a sandbox cannot make it either
        store.create()
    return store


def _store_dirs(store: EnvironmentStore) -> tuple[Path, ...]:
    """The store as a hidden directory: a program with a write grant over it (a normal user's is in their HOME)
    could plant code that another workspace's run executes (a ``.pth``). As root, one the sandbox's uid cannot
    reach is out of its sight already, and bwrap (running as that uid) could not mask it."""
    return () if closed_ancestor(store.root) is not None else (store.root,)


def _runtime_environment(name: str | None, policy: SandboxPolicy) -> Environment | None:
    """The built environment ``name`` (``EnvironmentNotFound`` naming the build command), None for none."""
    if name is None:
        return None
    if not policy.managed or sys.platform == "darwin":
        raise CapabilityError(
            f"environment={name!r}",
            "sandbox",
            "environments run on Linux with a managed profile (workspace-write, "
            "read-only); drop environment= or the profile",
        )
    return EnvironmentStore().get(name)


def _resolve_policy(policy: SandboxPolicy | None, network: bool | None) -> SandboxPolicy:
    policy = policy or SandboxPolicy()
    if network is not None:
        if policy.network is not None and policy.network != network:
            raise InvalidSpec(f"network={network} contradicts the policy's network={policy.network}; give one")
        policy = policy.with_network(network)
    # credential stores live in the HOME of whoever opens the engine; paths are compared canonical
    return policy.with_home(os.environ.get("HOME"))


class ExternalRunner(HostRunner):
    """``Profile.EXTERNAL``: isolation is someone else's job, so this engine runs nothing."""

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        raise UnsupportedBackend(_EXTERNAL_REFUSAL)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> SupervisedProcess:
        raise UnsupportedBackend(_EXTERNAL_REFUSAL)


def _unmanaged_capabilities(policy: SandboxPolicy, env_policy: EnvPolicy | None) -> Capabilities:
    details = {"profile": policy.summary(), "boundary": "none"}
    if policy.profile is Profile.EXTERNAL:
        return Capabilities(
            backend="sandbox",
            isolation=Isolation.NONE,
            network_control=False,
            network_default=policy.network_enabled,
            clean_env=False,
            read_only_mounts=False,
            streaming=False,
            host_paths=True,
            does_not_protect=("runs nothing: programs must run where the external isolation is",),
            details={**details, "runs": "refused (UnsupportedBackend)"},
        )
    dangers = (
        "danger-full-access: NO sandbox; the program runs as this process's user with its files, "
        "network, credentials and processes",
        "network cannot be turned off",
        "process count (pids) is not limited",
    )
    return unisolated_capabilities("sandbox", env_policy, dangers, details)


def _open_unmanaged(
    policy: SandboxPolicy,
    root: Path,
    env_policy: EnvPolicy | None,
    host_roots: Sequence[Path | str],
    artifacts: ArtifactService | None,
    kill_grace: float,
) -> BaseEngine:
    """DANGER_FULL_ACCESS (run like ``local``) or EXTERNAL (run nothing): no sandbox to probe."""
    caps = _unmanaged_capabilities(policy, env_policy)
    fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, access=file_access_hook(policy))
    runner_cls = ExternalRunner if policy.profile is Profile.EXTERNAL else HostRunner
    runner = runner_cls(lambda: caps, env_policy, kill_grace=kill_grace)
    manager = HostWorkspaceManager(
        "sandbox",
        root,
        private_root=not _is_root(),
        stop_programs=runner.stop_programs,
        copy_on_write=True,
        freeze=runner.frozen,
    )
    return BaseEngine("sandbox", manager, fs, runner, caps)


def sandbox_layout_owner() -> Any:
    """A workspace ``prepare`` hook (root only): the layout belongs to the workspace's sandbox uid, so that the
    sandbox can write where it may; shared with the jupyter backend's pre-made kernel slots."""

    def prepare(ws_dir: Path) -> None:
        uid = sandbox_uid(ws_dir)
        with ConfinedRoot(str(ws_dir), (uid, uid)) as cr:
            previous = cr.root_uid()
            if previous != uid and is_sandbox_uid(previous):
                # laid out for another uid (an older derivation, or copied from another directory): its files
                # would be unwritable to its own programs; whatever lies outside is no sandbox uid's of ours
                cr.take_over(previous)
        ensure_layout(ws_dir, (uid, uid))

    return prepare


def _private_execspace_dir() -> Path:
    """This user's execspace directory (the probe's verdict, every backend's default workspaces), made now:
    hidden from every sandbox, even through a grant that covers it, so it must exist before a program with a
    write grant over its parent could create it and make it its own."""
    directory = ProbeCache().directory
    with contextlib.suppress(OSError):  # not creatable here: then no sandbox can create it either
        private_dir(directory, 0o711)
    return directory


def _cached_probe(bwrap: str, seccomp: SeccompFilters, cache: ProbeCache) -> Probe:
    try:
        key = cache.key(bwrap, seccomp.bpf(network_restricted=True))
    except (OSError, SetupFailed):
        return _probe_boundary(bwrap, seccomp)  # the probe reports what is wrong
    probe = cache.get(key)
    if probe is None:
        probe = _probe_boundary(bwrap, seccomp)
        cache.put(key, probe)
    return probe


def _probe_boundary(bwrap: str, seccomp: SeccompFilters) -> Probe:
    """Run a real sandbox and check from inside that it holds (no uid 0, no capabilities, seccomp on)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="execspace-probe-") as tmp:
        ws = Path(tmp)
        (ws / "skills").mkdir()
        (ws / "metadata.json").write_text("{}")
        uid = sandbox_uid(ws)
        kwargs: dict[str, Any] = {}
        if _is_root():
            os.chmod(tmp, 0o711)  # noqa: S103 - the sandbox uid must traverse to the workspace
            os.chown(ws, uid, uid)
            kwargs = {"user": uid, "group": uid, "extra_groups": []}
        cfg = BwrapConfig(bwrap, network=False)
        python = shutil.which("python3", path=visible_path_entries(MINIMAL_PATH))
        check = f"id -u; grep CapEff /proc/self/status; {probe_script(python)}"
        try:
            seccomp_fd = seccomp.open_filter_fd(network_restricted=True)
        except SetupFailed as exc:
            return Probe(False, exc.cause, exc.fix)
        try:
            argv = build_argv(cfg, ws, "", ["/bin/sh", "-c", check], seccomp_fd=seccomp_fd)
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=10,
                env={"PATH": MINIMAL_PATH},
                pass_fds=(seccomp_fd,),
                **kwargs,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, f"bwrap could not start: {exc}", "check that bwrap is executable")
        finally:
            os.close(seccomp_fd)
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        if "seccomp" in proc.stderr.lower():
            return Probe(False, f"bwrap could not load the seccomp filter: {err[0]}", LOAD_FAILED_FIX)
        if _is_root() and "Can't find source path" in proc.stderr and "Permission denied" in proc.stderr:
            return Probe(
                False,
                f"the sandbox's unprivileged uid cannot reach a workspace under {Path(tmp).parent}: {err[0]}",
                "let other users traverse every directory on the way (chmod o+x), or point TMPDIR (and "
                "workspace_root=) at a directory they can traverse",
            )
        return Probe(
            False,
            f"bwrap failed: {err[0]}",
            "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
            "user.max_user_namespaces>0); in a container run it with --privileged or a seccomp "
            "profile that allows unshare",
        )
    lines = proc.stdout.split()
    if not lines or lines[0] == "0" or "0000000000000000" not in proc.stdout:
        return Probe(False, f"the sandboxed process kept privileges ({proc.stdout.strip()!r})", "report this as a bug")
    filtered = check_probe(proc.stdout)
    if not filtered.ok:
        return filtered
    return Probe(True, f"bubblewrap at {bwrap}; probe ran as uid {lines[0]} without capabilities; {filtered.reason}")
