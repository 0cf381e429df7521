"""The ``container`` backend: one hardened container per workspace, over the Docker Engine API.

The workspace is a host directory bind-mounted at ``/workspace``; files move in and
out through the host-side confined file code (no symlink is ever followed out of
the workspace), and programs run as ``exec`` in the workspace's long-lived container.
Defaults: no network, read-only root with a tmpfs ``/tmp``, every capability dropped,
``no-new-privileges``, a non-root user, memory/pids/CPU limits, no mount but the workspace.
Works against Docker or Podman's Docker-compatible socket (``docker_host=``).

A warm pool (``pool_size``) keeps started containers ready, each bound to its own empty
directory that becomes the new workspace's directory by an atomic rename (see ``pool.py``).
Containers are removed with their workspace, at engine close, at interpreter exit, and,
after a crash, by the reaper that runs when an engine opens (``reaper.py``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path

from ...audit import AuditSink
from ...backend import Probe
from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...environments import EnvironmentStore
from ...envpolicy import EnvPolicy
from ...errors import CapabilityError, InvalidSpec, PolicyViolation, SetupFailed
from ...languages import LANGUAGES
from ...models import NetworkPolicy, Workspace
from ...protocols import ProgramRunner, WorkspaceFS, WorkspaceManager
from ...tracing import NO_TRACER, Tracer
from ...userconfig import config_path, user_config
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root, private_dir
from ...workspace.layout import ensure_layout
from ...workspace.protected import ProtectedPaths
from ...workspace.slots import take_slot
from .config import CONTAINER_WORKSPACE, DEFAULT_USER, ContainerConfig, daemon_socket_path
from .daemon import WorkspaceContainers, connect, daemon_info, image_languages
from .egress import egress_unavailable
from .envimage import environment_image
from .imagebuild import DEFAULT_IMAGE, build_image, default_via
from .limits import RLIMITS
from .options import ContainerOptions
from .pool import PoolSlot, WarmPool, container_pool
from .reaper import reap_orphans, start_watchdog
from .runner import ContainerRunner

__all__ = [
    "CONTAINER_WORKSPACE",
    "DEFAULT_IMAGE",
    "IMAGE_ENV",
    "ContainerBackend",
    "ContainerConfig",
    "ContainerEngine",
    "ContainerOptions",
    "WarmPool",
    "build_image",
    "connect",
    "container_image",
    "default_via",
    "reap_orphans",
]

#: The environment variable naming the image when ``image=`` (CLI ``--image``) is not given.
IMAGE_ENV = "EXECSPACE_CONTAINER_IMAGE"

DOES_NOT_PROTECT = (
    "the container shares the host kernel: a kernel exploit escapes it (use a microVM for hostile code)",
    "memory and pids limits apply to a whole container: the runs of a workspace that ask the same memory_bytes "
    "(or none) share one container's",
    "a run's timeout kills processes carrying its marker or in its process group; one that clears its "
    "environment and starts a new session survives until the workspace is removed",
    "read-only staging only strips write bits; the program owns the files and can restore them",
    "cpu_seconds and file_size_bytes are per-process rlimits of the run",
    "with a network allow-list: whatever the program sends to an allowed destination (exfiltration to it); the "
    "runs of one workspace share its container's loopback, so a program can reach another run's proxy port "
    "(its attempts are then judged by that run's allow-list and land in that run's audit)",
)


def container_image(image: str | None) -> str:
    """The image to use: ``image``, else ``$EXECSPACE_CONTAINER_IMAGE``, else ``[container] image`` of the user
    config file; ``SetupFailed`` when none names one (or the file is malformed)."""
    name = image or os.environ.get(IMAGE_ENV, "").strip() or user_config("container").container.image
    if not name:
        raise SetupFailed(
            "container",
            "no container image is named",
            f"pass image='NAME' (CLI: --image NAME), set {IMAGE_ENV}, or write image = \"NAME\" under "
            f"[container] in {config_path()}; build one with `execspace image build` ({DEFAULT_IMAGE})",
        )
    return name


class ContainerBackend:
    name = "container"

    options = ContainerOptions

    @classmethod
    async def probe(cls, options: ContainerOptions, /) -> Probe:
        """Works here when a daemon answers AND it has the image ``open`` would use: the default choice must
        never land on a backend that cannot open."""
        docker_host, image = options.docker_host, options.image
        try:
            client = await asyncio.to_thread(connect, docker_host, 3.0)
        except SetupFailed as exc:
            return Probe(False, exc.cause, exc.fix)
        try:
            info = await asyncio.to_thread(daemon_info, client, docker_host)
            name = container_image(image)
            await asyncio.to_thread(image_languages, client, name)
        except SetupFailed as exc:
            return Probe(False, exc.cause, exc.fix)
        finally:
            await asyncio.to_thread(client.close)
        return Probe(True, f"{info}, image {name}")

    @classmethod
    async def capabilities(cls, options: ContainerOptions | None = None) -> Capabilities:
        """What an engine opened with ``options`` (default: the defaults) states, without opening one: with the
        daemon and the image's own ``execspace.languages`` label when the daemon answers and has the image (what
        ``execspace doctor`` shows)."""
        options = options or ContainerOptions()
        config = ContainerConfig(
            image="(the image= option)", memory_bytes=options.memory_bytes, pids=options.pids, cpus=options.cpus
        )
        daemon, declared = "", tuple[str, ...]()
        try:
            client = await asyncio.to_thread(connect, options.docker_host, 3.0)
        except SetupFailed:
            client = None
        if client is not None:
            try:
                daemon = str(await asyncio.to_thread(daemon_info, client, options.docker_host))
                config = replace(config, image=container_image(options.image))
                declared = await asyncio.to_thread(image_languages, client, config.image)
            except SetupFailed:
                pass
            finally:
                await asyncio.to_thread(client.close)
        languages = declared if options.languages is None else tuple(options.languages)
        return cls.statement(config, daemon, options.pool_size, options.watchdog, languages)

    @classmethod
    def statement(
        cls,
        config: ContainerConfig | None = None,
        daemon: str = "",
        pool_size: int = 1,
        watchdog: bool = False,
        languages: Sequence[str] = (),
        network_allow: NetworkPolicy | None = None,
        egress: bool = False,
    ) -> Capabilities:
        """What an engine opened with ``config`` applies (the defaults when ``config`` is None); ``egress``: its
        runs may take allow-lists (:func:`~.egress.egress_unavailable` says why not), ``network_allow`` the
        engine's own."""
        config = config or ContainerConfig(image="(the image= option)")
        network = config.network if config.networked else "none"
        if network_allow is not None:
            network = f"allow-list through the egress proxy ({len(network_allow.allowed)} entries)"
        return Capabilities(
            backend="container",
            isolation=Isolation.CONTAINER,
            # a networked container cannot take the network away from one run
            network_control=not config.networked,
            network_default=config.networked,
            network_domains=egress and not config.networked,
            clean_env=True,
            read_only_mounts=False,
            streaming=True,
            host_paths=True,
            enforced_limits=frozenset({"timeout", "output_bytes", "pids", "memory_bytes", *RLIMITS}),
            languages=tuple(languages),
            does_not_protect=DOES_NOT_PROTECT,
            fork="copy",  # files only (a running container is not forked)
            details={
                "image": config.image,
                "languages": "as the image declares (label execspace.languages) or the languages= option",
                "daemon": daemon,
                "user": f"{config.user[0]}:{config.user[1]}",
                "network": network,
                "root_fs": f"read-only, tmpfs /tmp ({config.tmp_bytes} bytes)",
                "capabilities": "all dropped, no-new-privileges",
                "memory_bytes": f"{config.memory_bytes} per workspace container (no swap), shared by the runs that "
                "ask none; a run that asks for memory_bytes gets a container cgroup of exactly that (a member "
                "container in the workspace's namespaces, one per distinct limit); a breach is the cgroup's OOM "
                "kill, limit_hit='memory_bytes'",
                "pids": f"{config.pids} per workspace container; a run may not ask for fewer",
                "cpus": f"{config.cpus} (rate limit, not cpu_seconds)",
                "cpu_seconds": "RLIMIT_CPU of each process of the run, whole seconds rounded up",
                "file_size_bytes": "RLIMIT_FSIZE of each process of the run, rounded down to 512 bytes",
                "rlimits": f"nofile {config.nofile}, nproc {config.nproc} (per uid)",
                "warm_pool": f"{pool_size} started container(s)" if pool_size else "off",
                "cleanup": "with the workspace, at engine close, at exit (atexit), orphans reaped on open"
                + (", watchdog process" if watchdog else ""),
                "mounts": ", ".join(
                    [
                        f"workspace at {CONTAINER_WORKSPACE} (root read-only, layout directories writable, "
                        f"protected: {', '.join(config.protected)})",
                        *config.read_only_binds.values(),
                    ]
                ),
            },
        )

    @classmethod
    async def open(cls, options: ContainerOptions, /) -> ContainerEngine:
        """Open a container engine with ``options`` (see :class:`ContainerOptions`)."""
        docker_host, pool_size, languages = options.docker_host, options.pool_size, options.languages
        if pool_size < 0:
            raise PolicyViolation("pool_size must be 0 or more")
        unknown = set(languages or ()) - {lang.name for lang in LANGUAGES}
        if unknown:
            raise InvalidSpec(f"unknown languages {sorted(unknown)}; known: {[lang.name for lang in LANGUAGES]}")
        environment = None if options.environment is None else EnvironmentStore().get(options.environment)
        rootfs = environment is not None and environment.root is not None
        if rootfs and options.image:
            raise InvalidSpec(
                f"image={options.image!r} and the rootfs environment {options.environment!r} name two images (the "
                "environment is imported as one): drop image= or environment="
            )
        image = "" if rootfs else container_image(options.image)
        binds = dict(options.read_only_binds or {})
        if environment is not None and not rootfs:
            binds[str(environment.path)] = str(environment.path)  # at its own path: its scripts' #! lines name it
        allow = options.network if isinstance(options.network, NetworkPolicy) else None
        config = ContainerConfig(
            image=image,
            user=options.user or (DEFAULT_USER if os.getuid() == 0 else (os.getuid(), os.getgid())),
            memory_bytes=options.memory_bytes,
            pids=options.pids,
            cpus=options.cpus,
            read_only_binds=binds,
            network="none" if isinstance(options.network, NetworkPolicy) else options.network,
            protected=tuple(options.protected),
        )
        unavailable = egress_unavailable(docker_host, config.networked)
        if allow is not None and unavailable is not None:
            raise CapabilityError(
                "a network allow-list (NetworkPolicy)", "container", f"{unavailable}; or use the sandbox backend"
            )
        client = await asyncio.to_thread(connect, docker_host)
        root = (
            Path(options.workspace_root) if options.workspace_root else default_workspace_root().with_name("container")
        )
        try:
            info = await asyncio.to_thread(daemon_info, client, docker_host)
            if rootfs:
                assert environment is not None
                image = await asyncio.to_thread(environment_image, client, environment)
                config = replace(config, image=image)
            declared = await asyncio.to_thread(image_languages, client, image)
            if options.reap_on_open:
                await asyncio.to_thread(reap_orphans, client, root)
        except BaseException:
            await asyncio.to_thread(client.close)
            raise
        containers = WorkspaceContainers(client, config, daemon_socket_path(docker_host))
        # started before any container exists, so that none is ever outside its watch
        try:
            guard = start_watchdog(docker_host, containers.engine_id, root) if options.watchdog else None
        except BaseException:
            await containers.close()
            raise
        caps = cls.statement(
            config,
            str(info),
            pool_size,
            options.watchdog,
            declared if languages is None else languages,
            network_allow=allow,
            egress=unavailable is None,
        )
        if environment is not None:
            caps = replace(caps, details={**caps.details, "environment": environment.summary()})
        owner = _owner(config) if os.getuid() == 0 else _no_owner
        tracer = options.tracer or NO_TRACER
        manager = _ContainerWorkspaceManager(
            containers, root, _layout_owner(config.user), pool_size, tracer, options.audit
        )
        pool = manager.pool
        pool.refill()
        fs = HostWorkspaceFS(
            artifacts=options.artifacts,
            host_roots=options.host_roots,
            owner=owner,
            access=ProtectedPaths(config.protected),
            tracer=tracer,
            audit=options.audit,
        )
        runner = ContainerRunner(
            containers,
            lambda: caps,
            options.env_policy or EnvPolicy(),
            owner,
            environment,
            network_allow=allow,
            on_network_attempt=options.on_network_attempt,
            tracer=tracer,
            audit=options.audit,
        )

        async def close() -> None:
            await pool.close()
            await containers.close()
            if guard is not None:
                await asyncio.to_thread(_stop_watchdog, guard)

        watchdog_pid = guard.pid if guard is not None else None
        parts = (manager, fs, runner, caps)
        return ContainerEngine(
            *parts, pool=pool, engine_id=containers.engine_id, watchdog_pid=watchdog_pid, on_close=close
        )


class ContainerEngine(BaseEngine):
    """The container backend's engine: the Engine seam, plus its warm pool and the ids its clean-up goes by."""

    def __init__(
        self,
        manager: WorkspaceManager,
        fs: WorkspaceFS,
        runner: ProgramRunner,
        capabilities: Capabilities,
        *,
        pool: WarmPool[PoolSlot],
        engine_id: str,
        watchdog_pid: int | None,
        on_close: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__("container", manager, fs, runner, capabilities, on_close=on_close)
        self._pool = pool
        self.engine_id = engine_id
        """The label value its containers carry (``execspace.engine=…``): the reaper and watchdog go by it."""
        self.watchdog_pid = watchdog_pid
        """The watchdog process that removes its containers if this process dies (None: ``watchdog=False``)."""

    @property
    def pool(self) -> WarmPool[PoolSlot]:
        """The warm pool of pre-started containers; ``await engine.pool.ready()`` waits for its refill."""
        return self._pool


class _ContainerWorkspaceManager(HostWorkspaceManager):
    """Host-directory workspaces whose new directories come from the warm pool when one is ready."""

    def __init__(
        self,
        containers: WorkspaceContainers,
        root: Path,
        prepare: Callable[[Path], None],
        pool_size: int,
        tracer: Tracer,
        audit: AuditSink | None,
    ) -> None:
        super().__init__(
            "container",
            root,
            prepare=prepare,
            program_path=lambda _p: CONTAINER_WORKSPACE,
            adopt=self._adopt_slot,
            refill=lambda: self.pool.refill(),
            stop_programs=containers.remove,  # the container goes first: nothing keeps writing into a removed tree
            freeze=containers.paused,
            tracer=tracer,
            audit=audit,
        )
        self._containers = containers
        containers.pool_root = self.root
        self.pool = container_pool(pool_size, self._make_slot, containers.discard_slot)

    def _make_slot(self) -> PoolSlot:
        private_dir(self.root, 0o700)  # the slots live in the root: same filesystem, so the rename is atomic
        return self._containers.make_slot()

    def _adopt_slot(self, ws_dir: Path) -> bool:
        """Rename a pool slot's directory to ``ws_dir`` if that workspace is new (else keep the slot)."""
        slot = take_slot(self.pool, ws_dir)
        if slot is not None:
            self._containers.adopt(ws_dir, slot)
        return slot is not None


def _stop_watchdog(proc: subprocess.Popen[bytes]) -> None:
    """EOF tells it we are done (it finds nothing left to remove); it must not outlive the engine long."""
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _owner(config: ContainerConfig) -> Callable[[Workspace], tuple[int, int] | None]:
    def owner(ws: Workspace) -> tuple[int, int] | None:
        return config.user

    return owner


def _no_owner(ws: Workspace) -> tuple[int, int] | None:
    return None


def _layout_owner(user: tuple[int, int]) -> Callable[[Path], None]:
    """As root, hand the layout to the container user so the program can write its workspace."""

    def prepare(ws_dir: Path) -> None:
        if os.getuid() == 0:
            ensure_layout(ws_dir, user)

    return prepare
