"""The sandbox backend's factory (:class:`SandboxBackend`): what it can do here (probe, capabilities) and how an
engine of it is put together from :class:`.options.SandboxOptions`: the policy, the runner of its mode, the
workspace manager and file API."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import cast

from ...artifacts import ArtifactService
from ...audit import AuditSink
from ...backend import Probe
from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...environments import Environment, EnvironmentStore
from ...envpolicy import MINIMAL_PATH, EnvPolicy
from ...errors import CapabilityError, InvalidSpec, ProgramNotFound, SetupFailed, UnsupportedBackend
from ...languages import available_languages
from ...models import NetworkPolicy, ProgramInfo, RunProgramSpec, RunResult, Workspace
from ...process.freezing import SETTLE_SECONDS
from ...process.hostrunner import DISK_BYTES_DETAIL, HostRunner, unisolated_capabilities
from ...process.rlimits import RLIMIT_ENFORCED
from ...protocols import ProgramHandle
from ...rundirs import daemon_dirs
from ...tracing import NO_TRACER, Tracer
from ...workspace.branches import overlay_supported
from ...workspace.confine import ConfinedRoot
from ...workspace.diskimages import disk_tools_missing
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root
from ...workspace.hostroots import closed_ancestor
from ...workspace.layout import ensure_layout
from .bwrap import (
    SANDBOX_WORKSPACE,
    TMP,
    BwrapConfig,
    build_argv,
    find_bwrap,
    is_sandbox_uid,
    machine_uid,
    sandbox_uid,
    visible_path_entries,
)
from .cgroups import CgroupSupport
from .grants import GrantHelper
from .machine import HOME, MACHINE_USERS, Machine
from .options import SandboxMode, SandboxOptions
from .policy import Profile, SandboxPolicy, file_access_hook
from .probecache import ProbeCache
from .programfiles import ProgramFiles
from .runner import SandboxRunnerConfig, is_root, private_execspace_dir, sandbox_runner, visible, with_environment
from .seccomp import LOAD_FAILED_FIX, SeccompFilters, check_probe, describe, probe_script
from .sessionconfig import SessionConfig
from .supervisorbin import EGRESS_FIX, SESSION_FIX, machine_binary, supervisor_binary
from .views import check_views

__all__ = ["DOES_NOT_PROTECT", "SandboxBackend", "sandbox_layout_owner"]

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
    "/ and /dev are read-only; /tmp is the workspace's tmp/ (its disk, kept from run to run) where that is writable "
    "and the sandbox is no machine; the writable in-memory filesystems are /dev/shm and otherwise /tmp, tmpfs of at "
    "most 64 MiB and 256 MiB that together hold at most the run's memory_bytes (a quarter of it for /dev/shm; in "
    "session mode the session's SessionConfig.memory_bytes and disk_bytes, shared by its runs); a write past them "
    "fails with ENOSPC"
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


def _host_cgroups() -> CgroupSupport:
    """The cgroup controllers runs get groups in here: root's, on Linux; none otherwise."""
    return CgroupSupport.detect() if is_root() and sys.platform.startswith("linux") else CgroupSupport({})


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
    return "RLIMIT_NPROC of the per-workspace uid" if is_root() else "not enforced (not root)"


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
        if is_root():
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
            pty=mode == "session" or visible(shutil.which("setsid")) is not None,
            host_paths=True,
            environments=True,
            enforced_limits=frozenset(limits),
            languages=available_languages(visible_path_entries(host_path) or MINIMAL_PATH),
            fork="cow" if overlay_supported() else "copy",
            does_not_protect=DOES_NOT_PROTECT,
            absolute_paths="view",  # ProgramFiles: the file agent in the sandbox, as its program
            details={
                "boundary": "bubblewrap: user/pid/ipc/uts/net namespaces, read-only system dirs, "
                "no host /home /root /run",
                "uid": "per-workspace unprivileged uid" if is_root() else "your uid, without capabilities",
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
            policy = with_environment(policy, environment)
        root = Path(workspace_root) if workspace_root else default_workspace_root().with_name("sandbox")
        if mode == "session" and (sys.platform == "darwin" or not policy.managed):
            raise UnsupportedBackend(
                "sandbox mode='session' runs on Linux with a managed profile (workspace-write, read-only); "
                "use mode='per-run' here"
            )
        tracer = (options.tracer or NO_TRACER).bound({"execspace.mode": mode})
        if not policy.managed:
            return _open_unmanaged(policy, root, env_policy, host_roots, artifacts, kill_grace, tracer, options.audit)
        # built once for this engine, shared by the probe and every run; a machine's root installs set-ID programs
        seccomp = SeccompFilters(set_id_bits=options.machine)
        probe = await cls.probe_boundary(bwrap, seccomp=seccomp)
        if not probe.ok:
            raise SetupFailed("sandbox", probe.reason, probe.fix)
        cgroups = _host_cgroups()
        caps = cls.capabilities(env_policy, policy=policy, cgroups=cgroups, mode=mode)
        if environment is not None:
            caps = replace(caps, details={**caps.details, "environment": environment.summary()})
        if sys.platform == "darwin":
            from .seatbelt import seatbelt_engine

            if options.audit is not None:
                raise CapabilityError("an audit log (audit=)", "sandbox", "audit on Linux, or with the local backend")

            # Seatbelt runs as the caller, who reaches the trees: read grants show them
            policy = policy.with_read_paths(*options.read_views)
            return seatbelt_engine(policy, root, caps, env_policy, host_roots, artifacts, kill_grace)
        bwrap_path = find_bwrap(bwrap)
        assert bwrap_path is not None
        as_root = is_root()
        private = private_execspace_dir()
        store = _environment_store()

        def owner(ws: Workspace) -> tuple[int, int] | None:
            if not as_root or ws.host_path is None:
                return None
            uid = sandbox_uid(ws.host_path)
            return uid, uid

        machine = await _machine(options, root) if options.machine else None
        hidden = (root, private, *_daemon_dirs(as_root), *_store_dirs(store))
        if options.read_views:
            # read grants: as root, the grant helper shows those the sandbox's uid cannot reach (.grants)
            await asyncio.to_thread(check_views, options.read_views, policy, hidden)
            policy = policy.with_read_paths(*options.read_views)
        program_binds = options.program_binds
        if machine is not None:
            caps = replace(caps, fork="copy", users=MACHINE_USERS, details={**caps.details, "machine": MACHINE_DETAIL})
            if not any(path == HOME for path, _ in program_binds):
                program_binds = (*program_binds, (HOME, "work"))
        elif _tmp_is_the_workspaces(policy):
            program_binds = (*program_binds, (TMP, "tmp"))
        # absolute paths outside a workspace: its file agent, run as its program
        beyond = ProgramFiles((*policy.read_paths, *policy.write_paths, *policy.no_access_paths))
        fs = HostWorkspaceFS(
            artifacts=artifacts,
            host_roots=host_roots,
            owner=owner,
            access=file_access_hook(policy),
            programs_read_all=machine is not None,  # its user holds CAP_DAC_READ_SEARCH (machine.py)
            elsewhere=beyond,
            tracer=tracer,
            audit=options.audit,
        )
        runner_config = SandboxRunnerConfig(
            bwrap_path,
            network_default=policy.network_enabled,
            seccomp=seccomp,
            capabilities=lambda: caps,
            env_policy=env_policy,
            policy=policy,
            hidden=hidden,
            cgroups=cgroups,
            owner=owner,
            kill_grace=kill_grace,
            network_allow=allow,
            on_network_attempt=options.on_network_attempt,
            environment=environment,
            program_binds=program_binds,
            system_files=options.system_files,
            environment_store=store,
            output_rate=options.output_rate,
            machine=machine,
            tracer=tracer,
            audit=options.audit,
            grant_helper=GrantHelper(root, private) if as_root and not machine else None,
        )
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
                runner_config = replace(runner_config, disk_bound=config.disk_bytes)
                caps = replace(caps, fork=None)  # its manager refuses them: a copy would not be bounded
            if limits := _session_limits(config, cgroups):
                caps = replace(caps, details={**caps.details, "session_limits": limits})
            engine = await _open_session(runner_config, config, root, prepare, fs, caps)
            beyond.runner = engine.runner
            return engine
        runner = beyond.runner = sandbox_runner(runner_config)
        manager = HostWorkspaceManager(
            "sandbox",
            root,
            prepare=prepare,
            program_path=lambda _p: SANDBOX_WORKSPACE,
            program_binds=program_binds,
            private_root=not as_root,
            stop_programs=runner.stop_programs,
            # a machine's upper layers cannot live in a fork's overlay: its forks are copies
            copy_on_write=machine is None,
            freeze=runner.frozen,
            holds=runner.holds,
            tracer=tracer,
            audit=options.audit,
        )
        return BaseEngine("sandbox", manager, fs, runner, caps)


async def _open_session(
    runner_config: SandboxRunnerConfig,
    config: SessionConfig,
    root: Path,
    prepare: Callable[[Path], None] | None,
    fs: HostWorkspaceFS,
    caps: Capabilities,
) -> BaseEngine:
    from .sessionrunner import session_runner  # session mode's modules load when a session engine opens

    supervisor = await asyncio.to_thread(supervisor_binary, private_execspace_dir())
    policy = runner_config.policy or SandboxPolicy()
    runner, mode = session_runner(
        runner_config,
        supervisor=supervisor,
        config=config,
        workspace_root=root,
        root_mode=0o711 if is_root() else 0o700,
        prepare_slot=prepare,
        # no-access globs are judged against a workspace's files when its sandbox starts; a slot has none; a slot
        # becomes a workspace by a rename, which a disk-bounded one's mount point refuses (EBUSY)
        pool=not policy.no_access_globs and config.disk_bytes is None,
    )
    manager = HostWorkspaceManager(
        "sandbox",
        root,
        prepare=prepare,
        program_path=lambda _p: SANDBOX_WORKSPACE,
        program_binds=runner_config.program_binds,
        private_root=not is_root(),
        adopt=mode.adopt if mode.pool is not None else None,
        refill=mode.refill if mode.pool is not None else None,
        stop_programs=runner.stop_programs,
        copy_on_write=runner_config.machine is None,
        freeze=runner.frozen,
        holds=runner.holds,
        disk_bytes=config.disk_bytes,
        tracer=runner_config.tracer,
        audit=runner_config.audit,
    )
    return BaseEngine("sandbox", manager, fs, runner, caps, on_close=mode.aclose)


#: ``Capabilities.details["machine"]``: what machine mode gives a program, and what it does not.
MACHINE_DETAIL = (
    "programs run as user (uid 1000, HOME=/home/user) with passwordless sudo to the root of the sandbox's own user "
    "namespace (unprivileged host uids; inside, only CAP_SETUID and CAP_SETGID); the system directories are "
    "overlays whose upper layers are the workspace's (.execspace/machine): the runtime environment's tree is "
    "root's, the host's own files keep their host owners (root adds, replaces and removes entries of /etc, /opt, "
    "/var, /usr/local, never reads more of the host than others may); forks and snapshots are copies"
)


def _tmp_is_the_workspaces(policy: SandboxPolicy) -> bool:
    """Whether a sandbox's ``/tmp`` is its workspace's ``tmp/`` (a program bind): where the workspace is writable
    and no rule names ``/tmp`` itself (a grant of the host's ``/tmp`` shows that instead). What a program or the file
    API puts in ``/tmp`` is then the workspace's, there for its next run (per-run sandboxes included), counted by its
    disk bounds, and named by the same path on both sides; a machine keeps its tmpfs (everyone's, 1777)."""
    named = (*policy.read_paths, *policy.write_paths, *policy.no_access_paths)
    return policy.profile is Profile.WORKSPACE_WRITE and not any(p in (TMP, "tmp") for p in named)


async def _machine(options: SandboxOptions, root: Path) -> Machine:
    """Machine mode's parts (:mod:`.machine`), or why this host cannot have it."""
    if not sys.platform.startswith("linux"):
        raise CapabilityError("machine=True", "sandbox", "machine mode runs on Linux (bubblewrap)")
    if not is_root():
        raise CapabilityError(
            "machine=True",
            "sandbox",
            "machine mode maps two host uids into each sandbox's user namespace, which only root does here; run "
            "execspace as root (an unprivileged machine would need newuidmap/newgidmap (uidmap) with subordinate "
            "ids, which execspace does not use yet)",
        )
    setpriv = shutil.which("setpriv")
    if setpriv is None or not visible(setpriv):
        raise CapabilityError("machine=True", "sandbox", "install util-linux (setpriv) in /usr/bin")
    helper = await asyncio.to_thread(machine_binary, private_execspace_dir())
    stage = root / ".machine-stage"
    await asyncio.to_thread(_make_stage, stage)
    return Machine(helper, stage, setpriv, root / ".machine-seeds")


def _make_stage(stage: Path) -> None:
    stage.parent.mkdir(mode=0o711, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        stage.mkdir(mode=0o711)
    st = os.lstat(stage)
    if not os.path.isdir(stage) or os.path.islink(stage) or st.st_uid != 0:
        raise SetupFailed("sandbox", f"{stage} is not a directory of root's", f"remove {stage}; it is made again")


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


class ExternalRunner:
    """``Profile.EXTERNAL``: isolation is someone else's job, so this engine runs nothing, and has nothing to
    list, stop or hold still."""

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        raise UnsupportedBackend(_EXTERNAL_REFUSAL)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ProgramHandle:
        raise UnsupportedBackend(_EXTERNAL_REFUSAL)

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        return []

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        what = f"pid {key}" if isinstance(key, int) else f"tag {key!r}"
        raise ProgramNotFound(f"no running program with {what} in workspace {ws.id!r}: {_EXTERNAL_REFUSAL}")

    async def stop_programs(self, ws: Workspace) -> None:
        return None

    def frozen(self, ws: Workspace) -> contextlib.AbstractAsyncContextManager[None]:
        return contextlib.nullcontext()


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
    tracer: Tracer,
    audit: AuditSink | None,
) -> BaseEngine:
    """DANGER_FULL_ACCESS (run like ``local``) or EXTERNAL (run nothing): no sandbox to probe."""
    caps = _unmanaged_capabilities(policy, env_policy)
    access = file_access_hook(policy)
    fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots, access=access, tracer=tracer, audit=audit)
    runner = (
        ExternalRunner()
        if policy.profile is Profile.EXTERNAL
        else HostRunner(lambda: caps, env_policy, kill_grace=kill_grace, tracer=tracer, audit=audit)
    )
    manager = HostWorkspaceManager(
        "sandbox",
        root,
        private_root=not is_root(),
        stop_programs=runner.stop_programs,
        copy_on_write=True,
        freeze=runner.frozen,
        tracer=tracer,
        audit=audit,
    )
    return BaseEngine("sandbox", manager, fs, runner, caps)


def sandbox_layout_owner() -> Callable[[Path], None]:
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
                # and a machine's upper layers, root's inside: of the old uid's machine root, now the new one's
                with ConfinedRoot(str(ws_dir), (machine_uid(uid),) * 2) as layers:
                    layers.take_over(machine_uid(previous))
        ensure_layout(ws_dir, (uid, uid))

    return prepare


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
        as_root = is_root()
        if as_root:
            os.chmod(tmp, 0o711)  # noqa: S103 - the sandbox uid must traverse to the workspace
            os.chown(ws, uid, uid)
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
                user=uid if as_root else None,
                group=uid if as_root else None,
                extra_groups=[] if as_root else None,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Probe(False, f"bwrap could not start: {exc}", "check that bwrap is executable")
        finally:
            os.close(seccomp_fd)
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        if "seccomp" in proc.stderr.lower():
            return Probe(False, f"bwrap could not load the seccomp filter: {err[0]}", LOAD_FAILED_FIX)
        if is_root() and "Can't find source path" in proc.stderr and "Permission denied" in proc.stderr:
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
