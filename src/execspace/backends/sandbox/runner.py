"""The sandbox's part of the run path (:class:`Sandbox`): the wrapper that puts each program of a workspace in
bubblewrap, under the policy's mounts, the seccomp filter, the workspace's uid and cgroup, and, with an allow-list,
the egress channel; and the per-run runner, a :class:`~execspace.process.hostrunner.HostRunner` configured with it
(:func:`sandbox_runner`). The factory (:mod:`.factory`) builds it; session mode composes it (:mod:`.sessionrunner`)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import functools
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ...audit import AuditSink
from ...capabilities import Capabilities
from ...environments import DEBIAN_PATH, Environment, EnvironmentStore, lookup_in_root
from ...envpolicy import MINIMAL_PATH, EnvPolicy
from ...errors import CapabilityError, UsageError
from ...models import NetworkApprover, NetworkPolicy, ResourceLimits, RunProgramSpec, Workspace
from ...process.hostrunner import HostRunner
from ...process.preparation import (
    PreparedRun,
    ProgramLookup,
    host_user_exists,
    lookup_on_path,
    lookup_where_it_runs,
    signal_status,
)
from ...process.rlimits import rlimit_preexec
from ...process.supervisor import Launch, SupervisedProcess
from ...tracing import NO_TRACER, Tracer
from ...workspace.confine import ConfinedRoot, split_relpath
from ...workspace.hostmanager import private_dir
from ...workspace.hostroots import closed_ancestor
from ...workspace.protected import PlaceholderRun, Placeholders
from .bwrap import (
    SANDBOX_WORKSPACE,
    TMP,
    BwrapConfig,
    ProgramBind,
    build_argv,
    data_fd,
    hidden_by_default,
    open_program_bind,
    policy_mounts,
    sandbox_uid,
    tmpfs_sizes,
    visible_path_entries,
)
from .cgroups import CgroupSupport
from .egress import EgressChannel
from .grants import GrantHelper, RunGrants
from .machine import MACHINE_USERS, Layer, Machine, machine_env, runs_as_user, user_argv
from .policy import Access, Resolver, Resolvers, SandboxPolicy
from .probecache import ProbeCache
from .seccomp import SeccompFilters
from .supervisorbin import egress_bridge_binary

__all__ = [
    "Sandbox",
    "SandboxPlan",
    "SandboxProcess",
    "SandboxRunnerConfig",
    "exec_hint",
    "is_root",
    "private_execspace_dir",
    "sandbox_of",
    "sandbox_runner",
    "visible",
    "which_in_sandbox",
    "with_environment",
]


_MAX_DECISIONS = 4096


def is_root() -> bool:
    return os.geteuid() == 0


@dataclass(frozen=True, slots=True)
class SandboxRunnerConfig:
    """What a sandbox runs every program of its engine with (:class:`Sandbox`): what the factory decided."""

    bwrap: str
    """The bubblewrap binary."""
    network_default: bool
    """The network of a run that asks for none (and of an engine without an allow-list)."""
    seccomp: SeccompFilters
    """The filters bwrap loads (built once per engine)."""
    capabilities: Callable[[], Capabilities]
    env_policy: EnvPolicy | None = None
    policy: SandboxPolicy | None = None
    """What programs may touch (default: ``workspace-write`` with this user's HOME's credential stores denied)."""
    hidden: Sequence[Path] = ()
    """Host directories never visible through a grant (the engine's workspaces, the daemon's, the store)."""
    cgroups: CgroupSupport | None = None
    owner: Callable[[Workspace], tuple[int, int] | None] | None = None
    """The uid/gid a workspace's files belong to (as root: its sandbox uid)."""
    kill_grace: float = 2.0
    network_allow: NetworkPolicy | None = None
    """The engine's allow-list: the network of every run that does not choose its own."""
    on_network_attempt: NetworkApprover | None = None
    environment: Environment | None = None
    """The engine's runtime environment (a run may name another)."""
    program_binds: tuple[tuple[str, str], ...] = ()
    system_files: tuple[tuple[str, str], ...] = ()
    disk_bound: int | None = None
    """A bound on what the sandbox can write (a session's ``disk_bytes``): its tmpfs stay within it too."""
    environment_store: EnvironmentStore | None = None
    output_rate: int | None = None
    machine: Machine | None = None
    """Machine mode (:mod:`.machine`, as root): programs run as ``user`` with ``sudo``, over a writable system."""
    tracer: Tracer = NO_TRACER
    """The span of each run (:class:`~execspace.process.hostrunner.HostRunner`'s)."""
    audit: AuditSink | None = None
    """Where each run's start and end lines go (:class:`~execspace.process.hostrunner.HostRunner`'s)."""
    grant_helper: GrantHelper | None = None
    """As root (but for a machine): what shows write grants and unreachable read grants from clones of their own
    (:mod:`.grants`)."""


class Sandbox:
    """The wrapper that puts each prepared run's program in bubblewrap (a :data:`~execspace.process.hostrunner.Wrapper`
    of a :class:`~execspace.process.hostrunner.HostRunner`), and what a sandboxed run needs besides: the runtime
    environment a run names (:meth:`choose`), other seccomp filters (:meth:`with_seccomp`), long-lived processes
    of other components in a workspace's sandbox (:meth:`start_process`: a Jupyter kernel), under the same
    boundary, uid, limits and bookkeeping as a program.

    :attr:`runner` is the HostRunner it wraps the runs of (set by :func:`sandbox_runner`, or session mode's).
    """

    def __init__(self, config: SandboxRunnerConfig) -> None:
        environment = config.environment
        self.machine = config.machine
        self.grant_helper = config.grant_helper
        self.lookup, self.path_view = self._view(environment)
        self.environment = environment
        self.owner = config.owner
        self.program_binds = config.program_binds
        self.system_files = tuple((path, text.encode()) for path, text in config.system_files)
        self.disk_bound = config.disk_bound
        self.cgroups = config.cgroups or CgroupSupport({})
        # Popen(user=...) makes CPython fork a copy of this process instead of vfork-ing; util-linux's
        # setpriv drops the uid after the exec instead (≈1.5 ms less per run, +8–10 % throughput)
        self.setpriv = shutil.which("setpriv")
        # in the sandbox's own session (bwrap --new-session), util-linux's setsid --ctty makes a pty run's terminal
        # the program's controlling tty: ^C, job control and SIGWINCH reach it and not bwrap
        self.setsid = visible(shutil.which("setsid"))
        self.bwrap = config.bwrap
        self.network_default = config.network_default
        self.network_allow = config.network_allow
        self.on_network_attempt = config.on_network_attempt
        self.seccomp = config.seccomp
        self.policy = config.policy or SandboxPolicy().with_home(os.environ.get("HOME"))
        self.resolvers = Resolvers(self.policy)
        # host directories never visible through a grant (the engine's workspaces, the daemon's, the environment
        # store), but for the environment trees a run is in (environment_store), read-only
        self.hidden = tuple(config.hidden)
        self.environment_store = config.environment_store
        # shared with clones (with_seccomp): their runs mount the same placeholders
        self.placeholders = Placeholders()
        self._bridge: Path | None = None
        self.decisions: dict[tuple[Path, str], Access] | None = None
        """What the policy gives at a path of a workspace, kept (a session's runs ask the same for every run)."""
        self._runner: HostRunner | None = None

    @property
    def runner(self) -> HostRunner:
        """The runner whose runs it wraps (the one :meth:`start_process` starts with)."""
        if self._runner is None:
            raise UsageError("this sandbox wraps no runner's runs yet: build it with sandbox_runner()")
        return self._runner

    @runner.setter
    def runner(self, runner: HostRunner) -> None:
        self._runner = runner

    def in_environment(self, spec: RunProgramSpec) -> Sandbox:
        """The sandbox for ``spec``: this one, or for a run naming another runtime environment, a copy (sharing the
        placeholders, as :meth:`with_seccomp`) with that tree bound and its bin first. The name is looked up for
        every such run, so a rebuilt environment is the one it gets."""
        if spec.environment is None:
            return self
        environment = EnvironmentStore().get(spec.environment)
        if self.environment is not None and environment.path == self.environment.path:
            return self
        clone = copy.copy(self)
        clone.environment = environment
        clone.policy = with_environment(self.policy, environment)
        clone.resolvers = Resolvers(clone.policy)
        clone.lookup, clone.path_view = clone._view(environment)
        return clone

    def _view(self, environment: Environment | None) -> tuple[ProgramLookup, Callable[[str], str]]:
        lookup, path_view = _environment_view(environment)
        # a machine's programs may be where only its upper layers have them (sudo, what pip installed): the
        # sandbox finds them (setpriv's execvp), and says 127 for one it does not
        return (lookup_where_it_runs if self.machine is not None else lookup), path_view

    def user_exists(self, name: str) -> bool:
        """Whether the sandbox has a user ``name``: its ``/etc`` is the host's (a rootfs environment's has the same
        system users; a machine's adds ``user``)."""
        return (self.machine is not None and name in MACHINE_USERS) or host_user_exists(name)

    def choose(self, runner: HostRunner, spec: RunProgramSpec) -> HostRunner:
        """The runner of ``spec`` (a :data:`~execspace.process.hostrunner.Chooser`): ``runner``, or for another
        runtime environment one sharing its bookkeeping, wrapping in that environment's sandbox."""
        sandbox = self.in_environment(spec)
        if sandbox is self:
            return runner
        preparation = runner.preparation.with_lookup(sandbox.lookup, sandbox.path_view)
        sandbox.runner = runner.sharing(preparation=preparation, wrappers=[sandbox], choose=sandbox.choose)
        return sandbox.runner

    def with_seccomp(self, seccomp: SeccompFilters) -> HostRunner:
        """A runner sharing this one's bookkeeping (policy, uid, cgroups, environment, programs known to
        ``stop_programs``) whose sandboxes load other seccomp filters: for processes such as a sandboxed Jupyter
        kernel (:class:`~.seccomp.KernelSeccompFilters`). Its runs are sandboxes of their own (per-run)."""
        clone = copy.copy(self)
        clone.seccomp = seccomp
        clone.runner = self.runner.sharing(wrappers=[clone], choose=clone.choose)
        return clone.runner

    async def start_process(
        self,
        ws: Workspace,
        argv: Sequence[str],
        *,
        limits: ResourceLimits,
        seccomp: SeccompFilters | None = None,
    ) -> SandboxProcess:
        """Start a long-lived process in ``ws``'s sandbox, as a program would run there.

        The same boundary, policy mounts, uid and environment as ``run_program``; ``limits`` hold for the whole
        sandbox for the process's life (a cgroup where it can, else rlimits); no deadline; stdin stays open
        (``process.write_stdin``); it dies with this process (``--die-with-parent``); the run's placeholders go
        when it exits; ``stop_programs`` kills it with the workspace's programs.

        Args:
            seccomp: the filters bwrap loads (default: the runner's), e.g. :class:`KernelSeccompFilters`.

        Raises:
            CommandNotFound: ``argv[0]`` is a bare name not found in the sandbox.
            OSError: the sandbox could not be started.
        """
        runner = self.runner if seccomp is None else self.with_seccomp(seccomp)
        spec = RunProgramSpec(argv[0], list(argv[1:]), timeout=None, limits=limits)
        prep = runner.preparation.prepare(ws, spec)
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

    def __call__(self, prep: PreparedRun, launch: Launch) -> Launch:
        """``launch`` (the program as is) in bwrap: the wrapper step of its runner."""
        return self.wrap(prep, launch)

    def wrap(self, prep: PreparedRun, launch: Launch, *, init_fd: int | None = None) -> Launch:
        """The bwrap launch of ``prep`` (from ``launch``, the program as is): its steps in turn, each a new plan —
        the environment view, the pty, the egress channel, bubblewrap with the seccomp filter, then (as root) the
        uid and cgroup drop. ``init_fd``: the program is a session's supervisor, read from that fd (see
        :attr:`.bwrap.BwrapConfig.init_fd`), which the launch passes to bwrap."""
        # the run's placeholders go once it is over: exited, timed out, killed, or failed to start
        held = self.placeholders.run()
        helper = self.grant_helper
        grants = RunGrants(helper, sandbox_uid(prep.root) if helper is not None else 0)
        try:
            plan = SandboxPlan(launch)
            # a session's supervisor stays root of a machine sandbox: it starts each run as user itself
            as_user = (self.as_machine_user,) if self.machine is not None and init_fd is None else ()
            for step in (self.environment_view, *as_user, self.with_pty, self.with_egress):
                plan = step(prep, plan)
            launch = self.in_bubblewrap(prep, plan, held, init_fd, grants)
            if self.machine is not None:
                launch = self._drop_to_sandbox_uid(prep, self.in_machine(prep, launch), drop=False)
            elif grants.staged:
                # the helper stages the grants as root, then drops to the sandbox's uid itself
                launch = self._drop_to_sandbox_uid(prep, grants.around(launch), drop=False)
            elif is_root():
                launch = self._drop_to_sandbox_uid(prep, launch)
        except BaseException:
            launch.stack.abandon()  # what the steps before the failed one registered
            held.release()
            grants.close()
            raise
        launch.stack.callback(held.release)
        return launch

    def environment_view(self, prep: PreparedRun, plan: SandboxPlan) -> SandboxPlan:
        """The program's environment as the sandbox has it (:meth:`program_env`)."""
        return SandboxPlan(replace(plan.launch, env=self.program_env(prep)), plan.mounts)

    def as_machine_user(self, prep: PreparedRun, plan: SandboxPlan) -> SandboxPlan:
        """Machine mode: the program started as ``user`` (:func:`.machine.user_argv`), unless the run names root."""
        assert self.machine is not None
        launch = plan.launch
        if not runs_as_user(prep.spec.user):
            return plan
        return SandboxPlan(replace(launch, argv=user_argv(self.machine.setpriv, launch.argv)), plan.mounts)

    def machine_layers(self) -> tuple[Layer, ...]:
        """Machine mode: the overlays of this sandbox's view (its environment's)."""
        assert self.machine is not None
        environment = self.environment
        if environment is not None and environment.root is not None:
            return self.machine.layers(str(environment.root), None)
        return self.machine.layers(None, None if environment is None else str(environment.path))

    async def seed_machine(self, workspace: Path) -> None:
        """Machine mode: the workspace's layers made ahead, in a worker thread (:meth:`.machine.Machine.seed`)."""
        assert self.machine is not None
        await asyncio.to_thread(self.machine.seed, workspace, self.machine_layers())

    def in_machine(self, prep: PreparedRun, launch: Launch) -> Launch:
        """Machine mode: ``launch`` (bwrap) started by the machine helper, in the sandbox's user namespace over
        its overlays (:meth:`.machine.Machine.around`)."""
        assert self.machine is not None
        return self.machine.around(prep, launch, self.machine_layers())

    def with_pty(self, prep: PreparedRun, plan: SandboxPlan) -> SandboxPlan:
        """A pty run's program under ``setsid --ctty``: bwrap starts it in a session of its own, where that makes
        the terminal its controlling tty."""
        if prep.spec.pty is None:
            return plan
        if self.setsid is None:
            raise CapabilityError("a pseudo-terminal (pty)", "sandbox", "install util-linux (setsid)")
        launch = plan.launch
        return SandboxPlan(replace(launch, argv=[self.setsid, "--ctty", *launch.argv]), plan.mounts)

    def with_egress(self, prep: PreparedRun, plan: SandboxPlan) -> SandboxPlan:
        """With an allow-list, the program behind the egress bridge: the network stays off (own namespace, off
        filter), the channel to the run's proxy is the only way out. The channel goes when the run is over."""
        wanted = self.network_allow if prep.spec.network is None else prep.spec.network
        if not isinstance(wanted, NetworkPolicy):
            return plan
        environment = self.environment
        egress = EgressChannel(
            wanted,
            self._bridge_binary(),
            prep.root,
            prep.run_dir,
            self.on_network_attempt,
            system_root=None if environment is None or environment.root is None else str(environment.root),
            overlay_trust=self.machine is None,
        )
        launch = plan.launch
        launch.stack.after_spawn(egress.started)
        launch.stack.callback(egress.close)
        launch.stack.annotate(egress.annotate)
        launch = replace(
            launch,
            argv=egress.argv(list(launch.argv)),
            env=egress.env(launch.env),
            pass_fds=(*launch.pass_fds, *egress.pass_fds),
        )
        return SandboxPlan(launch, (*plan.mounts, *egress.bwrap_args()))

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
        return env if self.machine is None else machine_env(env, tuple(prep.spec.env), prep.spec.user)

    def access_of(self, root: Path, rel: str) -> Access:
        """What the policy gives a program at ``rel`` of the workspace at ``root``."""
        decisions = self.decisions
        if decisions is None:
            return self.resolvers(os.path.realpath(root)).access(rel)
        # every session run asks for its cwd and tmp; the answer depends on the policy and the path only
        key = (root, rel)
        found = decisions.get(key)
        if found is None:
            if len(decisions) > _MAX_DECISIONS:
                decisions.clear()
            found = decisions[key] = self.resolvers(os.path.realpath(root)).access(rel)
        return found

    def in_bubblewrap(
        self,
        prep: PreparedRun,
        plan: SandboxPlan,
        held: PlaceholderRun,
        init_fd: int | None,
        grants: RunGrants,
    ) -> Launch:
        """``plan``'s program in bwrap: the policy's mounts, program binds and system files, then the plan's own
        mounts; the seccomp filter; the network as the run asks. The fds bwrap reads from close right after the
        spawn. ``grants``: how the run's host grants are bound (each by its fd, or from a clone the grant helper
        stages as root)."""
        wanted = self.network_allow if prep.spec.network is None else prep.spec.network
        network = self.network_default if wanted is None else wanted == "on"
        res = self.resolvers(os.path.realpath(prep.root))
        binds = self._open_binds(res.root, prep.ws)
        # every fd bwrap reads from; closed right after the spawn, or here if anything fails before it
        data_fds = [b.fd for b in binds]
        launch = plan.launch
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
                stage=grants.bind,
            )
            data_fds += grants.bwrap_fds()
            seccomp_fd = self.seccomp.open_filter_fd(network_restricted=not network)
            data_fds.append(seccomp_fd)
            files = []
            for path, data in self.system_files:
                files.append((data_fd(data, "execspace-system-file"), path))
                data_fds.append(files[-1][0])
            tmp_size, shm_size = tmpfs_sizes(prep.spec.limits.memory_bytes, self.disk_bound)
            machine: list[str] | None = None
            if self.machine is not None:
                layers = self.machine_layers()
                machine = self.machine.bwrap_binds(layers, system_root)
                mounts += self.machine.tree_binds(layers)
            cfg = BwrapConfig(
                self.bwrap,
                network,
                tmp_size,
                shm_size,
                [*mounts, *plan.mounts],
                files,
                init_fd,
                system_root=system_root,
                machine=machine,
                tmp_bound=any(b.path == TMP for b in binds),
            )
            chdir = prep.cwd_view or None
            argv = build_argv(cfg, prep.root, prep.cwd_rel, list(launch.argv), seccomp_fd=seccomp_fd, chdir=chdir)
        except BaseException:
            for fd in data_fds:
                os.close(fd)
            raise
        # bwrap has its own copy once started: ours closes right after the spawn, even a failed one
        for fd in data_fds:
            launch.stack.after_spawn(functools.partial(os.close, fd))
        return replace(
            launch,
            argv=argv,
            cwd=str(prep.root),
            # bwrap starts the program in a session of its own: setsid --ctty there gives it the terminal
            pty_controlling=False,
            signal_target=_program_group,
            exit_status=functools.partial(_bwrap_exit_status, prep.argv[0]),
            pass_fds=(*launch.pass_fds, *data_fds, *(() if init_fd is None else (init_fd,))),
        )

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
                owner = self.owner(ws) if self.owner is not None else None
                binds.append(ProgramBind(open_program_bind(root, rel, owner), path, rel))
        except BaseException:
            for b in binds:
                os.close(b.fd)
            raise
        return binds

    def _bridge_binary(self) -> Path:
        if self._bridge is None:
            # built once per host and user, then found in the cache: the first allow-list run waits for the build
            self._bridge = egress_bridge_binary(private_execspace_dir())
        return self._bridge

    def _drop_to_sandbox_uid(self, prep: PreparedRun, launch: Launch, *, drop: bool = True) -> Launch:
        """``launch`` starting bwrap as the workspace's unprivileged uid, inside a per-run cgroup when limits or the
        freezer need one (its tree is then held still by the freezer, see :class:`.cgroups.GroupFreeze`).
        ``drop=False``: the cgroup and limits only, the uid being the machine helper's to change."""
        uid = sandbox_uid(prep.root)
        limits = prep.spec.limits
        group = self.cgroups.create(limits)
        if group is None:
            preexec = _with_nproc(launch.preexec_fn, limits.pids)
            if not drop:
                return replace(launch, preexec_fn=preexec)
            if self.setpriv is None:
                return replace(launch, preexec_fn=preexec, user=uid, group=uid)
            setpriv = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
            return replace(launch, preexec_fn=preexec, argv=[*setpriv, *launch.argv])
        # the group does these for the whole sandbox; per-process rlimits would only get in the way
        in_group = group.enforces()
        rest = replace(
            limits,
            memory_bytes=None if "memory_bytes" in in_group else limits.memory_bytes,
            pids=None if "pids" in in_group else limits.pids,
        )
        hit: list[str | None] = [None]

        def finish() -> None:
            hit[0] = group.limit_hit()
            group.remove()

        launch.stack.callback(finish)
        rlimit_classify = launch.classify_exit
        return replace(
            launch,
            # joining a cgroup needs root, so the uid is dropped here, after joining, not by Popen
            preexec_fn=_join_then_drop(
                group.join_fn(), _with_nproc(rlimit_preexec(rest), rest.pids), uid if drop else None
            ),
            freezer=group.freezer,
            cpu_clock=group.cpu_clock,
            classify_exit=lambda code: hit[0] or (rlimit_classify(code) if rlimit_classify else None),
        )


@dataclass(frozen=True, slots=True)
class SandboxPlan:
    """A run's plan inside the sandbox, before bwrap is put around it: ``launch`` starts the program itself (its
    argv, environment, fds), ``mounts`` are what the steps add to the bwrap command line after the policy's."""

    launch: Launch
    mounts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SandboxProcess:
    """A long-lived process in a workspace's sandbox (:meth:`Sandbox.start_process`)."""

    process: SupervisedProcess
    """Its supervision: ``stream``, ``write_stdin``, ``kill``, ``wait`` (its pid is bwrap's, not its own)."""
    run_dir: str
    """Its run directory, workspace-relative (``runs/…``), writable by it."""
    run_path: str
    """The same directory as the process sees it (``/workspace/runs/…``)."""
    run_dir_fd: int
    """An fd of that directory, opened before the process started (so it is the one made for it): the caller's
    to close."""


def sandbox_runner(config: SandboxRunnerConfig) -> HostRunner:
    """The per-run sandbox's runner: a HostRunner whose one wrapper is the :class:`Sandbox` of ``config``."""
    sandbox = Sandbox(config)
    sandbox.runner = HostRunner(
        config.capabilities,
        config.env_policy,
        kill_grace=config.kill_grace,
        output_rate=config.output_rate,
        owner=config.owner,
        program_root=lambda _ws: SANDBOX_WORKSPACE,
        lookup=sandbox.lookup,
        path_view=sandbox.path_view,
        wrappers=[sandbox],
        choose=sandbox.choose,
        user_exists=sandbox.user_exists,
        tracer=config.tracer,
        audit=config.audit,
    )
    return sandbox.runner


def sandbox_of(runner: object) -> Sandbox:
    """The :class:`Sandbox` a sandbox engine's runner (``engine.runner``) wraps its runs in.

    Raises:
        UsageError: ``runner`` is not a sandbox engine's."""
    for wrapper in getattr(runner, "wrappers", ()):
        found = wrapper if isinstance(wrapper, Sandbox) else getattr(wrapper, "sandbox", None)
        if isinstance(found, Sandbox):
            return found
    raise UsageError(f"{runner!r} is not a sandbox engine's runner: open the engine with open_engine('sandbox')")


def _environment_view(environment: Environment | None) -> tuple[ProgramLookup, Callable[[str], str]]:
    """How a program is found and the PATH it gets: in the host's system directories (with a venv's ``bin``,
    bound by the policy, first), or in a rootfs environment's own, on Debian's PATH."""
    if environment is not None and environment.root is not None:
        return functools.partial(lookup_in_root, environment.root), lambda _path: DEBIAN_PATH
    if environment is None:
        return which_in_sandbox, functools.partial(_path_view, None)
    # the environment's bin is bound by the policy, wherever it lies: the view keeps it, the lookup too
    return lookup_on_path, functools.partial(_path_view, str(environment.bin_dir))


def with_environment(policy: SandboxPolicy, environment: Environment) -> SandboxPolicy:
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


#: How bwrap says it could not enter the run's working directory (then exits 1, the program never started).
_CHDIR_FAILED = b"bwrap: Can't chdir to "


def _bwrap_exit_status(program: str, code: int, stderr: bytes) -> tuple[int, bytes]:
    """The program's exit code as every backend reports it, from bwrap's, and the stderr to report: 127/126 with
    our explanation when bwrap's exec of ``program`` failed (bwrap exits 1 after ``bwrap: execvp PROGRAM: ERROR``),
    126 when it could not enter the working directory, ``-N`` when the program was killed by signal N (bwrap exits
    ``128 + N``), else the program's own code."""
    if code != 1:
        return signal_status(code), stderr
    if stderr.startswith(_CHDIR_FAILED) and stderr.endswith(b"\n"):
        where, _, error = stderr[len(_CHDIR_FAILED) : -1].decode(errors="replace").rpartition(": ")
        return 126, (
            f"execspace: cannot start {program!r} in {where}: {error} in the sandbox (a working directory outside "
            "the workspace must be there as the program sees it: a system directory, a granted host path, /tmp)\n"
        ).encode()
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
    if "/" in program and not os.path.isabs(program):
        return (
            " (a relative path starts from the run's working directory, in the workspace, not from your current "
            "directory: stage the file into the workspace (CLI: --input; library: stage_inputs), or grant its "
            "directory (--read) and give its absolute path; if it is there, the interpreter on its #! line is missing)"
        )
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


def _with_nproc(inner: Callable[[], None] | None, pids: int | None) -> Callable[[], None] | None:
    if pids is None:
        return inner

    def apply() -> None:
        import resource

        if inner is not None:
            inner()
        # the uid is unique to this workspace, so NPROC counts only its processes
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))

    return apply


def _join_then_drop(join: Callable[[], None], limits: Callable[[], None] | None, uid: int | None) -> Callable[[], None]:
    def apply() -> None:
        join()
        if limits is not None:
            limits()
        if uid is None:
            return
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return apply


def visible(path: str | None) -> str | None:
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


def private_execspace_dir() -> Path:
    """This user's execspace directory (the probe's verdict, every backend's default workspaces), made now:
    hidden from every sandbox, even through a grant that covers it, so it must exist before a program with a
    write grant over its parent could create it and make it its own."""
    directory = ProbeCache().directory
    with contextlib.suppress(OSError):  # not creatable here: then no sandbox can create it either
        private_dir(directory, 0o711)
    return directory
