"""What ``execspace serve`` is configured with."""

from __future__ import annotations

import math
import os
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..audit import key_id  # the name of a key where the server records who did something (a team, an audit line)
from ..environments import EnvironmentSpec
from ..errors import InvalidSpec
from ..models import NetworkPolicy
from ..scrape import MetricsAccess, check_access
from .shares import ShareLimits
from .templates import BUILTIN_TEMPLATES, Profile, Template

__all__ = ["ENVD_VERSION", "KERNEL_TEMPLATES", "TLS", "ServerOptions", "generate_api_key", "key_id"]

#: The envd version reported to the SDK; it switches SDK features on by version (``e2b/envd/versions.py``), so it
#: names the newest level whose features are all implemented: 0.4.0 the server picks the default user, 0.5.2
#: ``close_stdin``, 0.5.7 octet-stream and gzip uploads, 0.6.2 file metadata (``user.e2b.`` xattrs), 0.6.3 entries
#: in watch events, 0.6.4 watches of network mounts (``allow_network_mounts``).
ENVD_VERSION = "0.6.4"
#: The templates whose pooled sandboxes get a warm kernel (``ServerOptions.warm_kernels``).
KERNEL_TEMPLATES = ("code-interpreter-v1",)


def generate_api_key() -> str:
    """A key in the format older SDKs check (``e2b_`` + hex; e2b < 2.30 refuses others unless
    ``E2B_VALIDATE_API_KEY=false``)."""
    return "e2b_" + secrets.token_hex(20)


def _host_memory_mb() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)


@dataclass(frozen=True, slots=True)
class TLS:
    """A certificate chain and its private key (PEM files): the server speaks HTTPS, HTTP/2 where the client offers
    it by ALPN and HTTP/1.1 otherwise."""

    cert: Path
    key: Path


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """The server's settings; ``execspace serve`` builds one from its flags."""

    api_keys: tuple[str, ...]
    """Keys a control-plane request may carry in ``X-API-KEY``; at least one (``admin_keys`` count too). Each key is
    a team: the sandboxes and snapshots it makes are its own, and another key finds none of them (404)."""
    admin_keys: tuple[str, ...] = ()
    """Keys that see and act on every team's sandboxes and snapshots (an operator's)."""
    client_id: str = "execspace"
    """What the control plane reports as each sandbox's ``clientID`` (a cluster's node server: its Ray node id, so
    that the front door passes its answers on unchanged)."""
    max_sandboxes: int = 100
    """Live sandboxes at once; a create beyond answers 429 with ``Retry-After``."""
    pool_sizes: tuple[tuple[str, int], ...] = (("base", 2),)
    """Ready sandboxes kept per template (see :mod:`.pool`), so that a create does not wait for its set-up;
    they count toward ``max_sandboxes`` (the pools shrink to the room the live sandboxes leave)."""
    default_timeout: int = 300
    """Seconds a sandbox lives when create names no timeout (E2B's default)."""
    max_timeout: int = 24 * 3600
    domain: str | None = None
    """Sandbox domain for host-based routing (``<port>-<sandboxID>.<domain>``); None: the SDK's
    ``E2B_SANDBOX_URL`` (header routing) is the way in."""
    allow_internet_access: bool = False
    """Let a sandbox created with ``allow_internet_access=True`` reach the network (off: every sandbox is offline,
    whatever it asks; its info reports ``allowInternetAccess: false``): every public destination, through its egress
    proxy, never the server's host (see ``host_network``)."""
    host_network: bool = False
    """Dangerous: a sandbox with the network on shares the host's network namespace instead of going through its
    egress proxy, so it reaches the host's loopback services (this server's API included) and its own addresses.
    Needs ``allow_internet_access``."""
    resolve: Mapping[str, str] = field(default_factory=dict)
    """Names pinned to an address for every sandbox's egress allow-list (``NetworkPolicy.resolve``: tests, private
    deployments); a pinned address counts as allowed."""
    upstream_ca: Path | None = None
    """A PEM file of the CAs the servers of hosts with ``network.rules`` must chain to (``NetworkPolicy.upstream_ca``;
    default: this host's trust store)."""
    max_connections: int | None = None
    """Client connections held at once (more are closed as they come); None: a quarter of the descriptors this
    process may open, so that the rest stays for the sandboxes' programs, files and streams."""
    head_timeout: float = 10.0
    """Seconds a new connection has to send a complete request head before it is closed."""
    log_requests: bool = False
    """Log a line per request (method, path, sandbox, status, duration) on the ``execspace.server.requests`` logger,
    at INFO (``execspace serve -v``)."""
    share: ShareLimits = field(default_factory=ShareLimits)
    """What each sandbox may hold of the server at once (file operations, commands, streams, watchers)."""
    max_upload_bytes: int = 1024 * 1024 * 1024
    """Largest file ``POST /files`` takes (after gzip decoding)."""
    reap_interval: float = 0.5
    """Seconds between checks for expired sandboxes."""
    idle_pause: float | None = None
    """Seconds an ``autoPause`` sandbox may be idle (its programs use no CPU, no request of it is open or made)
    before it is paused, resumed by its next request (:mod:`.idle`), where its template names none; None: never."""
    idle_interval: float = 1.0
    """Seconds between two looks at the sandboxes' idleness (one read of each one's CPU count)."""
    watch_interval: float = 0.2
    """Seconds between polls of a watched directory."""
    keepalive_interval: float = 30.0
    """Seconds between keepalive events on a quiet stream."""
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    """Reported in sandbox info where neither the template nor ``sandbox_cpus`` limits it: the host's CPUs."""
    memory_mb: int = field(default_factory=_host_memory_mb)
    """Reported in sandbox info where neither the template nor ``sandbox_memory_mb`` limits it: the host's memory."""
    disk_mb: int = field(default_factory=lambda: shutil.disk_usage("/").total // (1024 * 1024))
    """Reported in sandbox info where neither the template nor ``sandbox_disk_mb`` limits it: the host's disk."""
    templates: Mapping[str, Template] = field(default_factory=lambda: dict(BUILTIN_TEMPLATES))
    """The templates a sandbox may be created from, by name (:mod:`.templates`; ``--config FILE``)."""
    sandbox_cpus: float | None = None
    """CPU bandwidth of each sandbox, in CPUs, where its template names none (``SessionConfig.cpus``: a cgroup CPU
    quota as root); None: no limit of its own."""
    sandbox_memory_mb: int | None = None
    """Memory of each sandbox, every process of it together (its commands, kernels and contexts), enforced on its
    sandbox session (``SessionConfig.memory_bytes``: a cgroup as root); None: no limit of its own."""
    sandbox_disk_mb: int | None = None
    """Disk of each sandbox where its template names none: its workspace on a filesystem of that size of its own,
    its ``/tmp`` and ``/dev/shm`` tmpfs at most that much together (``SessionConfig.disk_bytes``: root only); None:
    no bound of its own (the host's disk)."""
    sandbox_pids: int | None = None
    """Processes and threads of each sandbox at once (``SessionConfig.pids``); None: no limit of its own."""
    warm_kernels: bool = True
    """Start the default Python context's kernel of each pooled sandbox of ``code-interpreter-v1`` ahead of its
    create (in its own session), so that its first ``run_code`` does not wait for a kernel's start; it costs each
    such pooled sandbox the kernel's memory (docs/benchmarks.md)."""
    machine: bool | None = None
    """Run each sandbox on the machine E2B's code expects (the sandbox backend's machine mode: ``user`` with a
    passwd entry and ``HOME=/home/user``, passwordless ``sudo`` to the sandbox's own root, a system it can write in
    its own upper layers); None: when this host can (as root on Linux), else today's sandboxes, said at start-up;
    True: refuse to start without it; False: never."""
    kernel_environment: str | None = "code-interpreter"
    """The runtime environment (``execspace env build NAME``) the code interpreter's kernels start from, so that
    ``run_code`` has E2B's data stack (pandas, matplotlib, …); when it is not built here, or None, kernels run on
    the sandbox's system python (the server logs which). It is also the environment of the built-in
    ``code-interpreter-v1`` template's commands (None: the host's system dirs), unless ``templates`` redefines it."""

    environments: Mapping[str, EnvironmentSpec] = field(default_factory=dict)
    """Specs of environments the server builds the first time a create of a template that names one needs it
    (``[environments.NAME]`` of serve's config file), by name; the built-ins' are known without. An environment
    without a spec must be built ahead (``execspace env build``)."""
    metrics: MetricsAccess = "open"
    """Who may read ``GET /metrics`` (docs/operations.md "Metrics"): ``open`` anyone who reaches the port (a
    Prometheus scraper holds no E2B key), ``key`` a holder of one of the API keys (``X-API-KEY`` or ``Authorization:
    Bearer``), ``off`` nobody (404; no metric is kept)."""
    audit_log: Path | None = None
    """A file the server appends one JSON line to per security-relevant event (docs/operations.md "Audit log");
    None: no audit log."""
    build_wait: float = 10.0
    """Seconds a create waits for its template's environment to be built here before it answers 503 with
    ``Retry-After``, naming the build (which goes on). The official SDK retries such an answer within its request
    timeout (60 s by default): see :data:`.builds.RETRY_AFTER` for why 10 s answers before that timeout."""

    def __post_init__(self) -> None:
        if not (self.api_keys or self.admin_keys) or not all((*self.api_keys, *self.admin_keys)):
            raise InvalidSpec("the server needs at least one non-empty API key")
        if self.max_sandboxes < 1:
            raise InvalidSpec(f"max_sandboxes must be at least 1, got {self.max_sandboxes}")
        if "base" not in self.templates or any(name != t.name for name, t in self.templates.items()):
            raise InvalidSpec("templates must map each template's own name to it, base included")
        if self.templates.get("code-interpreter-v1") == BUILTIN_TEMPLATES["code-interpreter-v1"]:
            built_in = replace(BUILTIN_TEMPLATES["code-interpreter-v1"], environment=self.kernel_environment)
            object.__setattr__(self, "templates", {**self.templates, "code-interpreter-v1": built_in})
        for template, size in self.pool_sizes:
            if template not in self.templates:
                raise InvalidSpec(
                    f"pool size for an unknown template {template!r}: use one of {', '.join(self.templates)}"
                )
            if size < 0:
                raise InvalidSpec(f"the pool size of {template} must be 0 or more, got {size}")
        if self.max_connections is not None and self.max_connections < 1:
            raise InvalidSpec(f"max_connections must be at least 1, got {self.max_connections}")
        if any(name != spec.name for name, spec in self.environments.items()):
            raise InvalidSpec("environments must map each environment's own name to its spec")
        check_access(self.metrics)
        if self.build_wait < 0:
            raise InvalidSpec(f"build_wait must be 0 or more seconds, got {self.build_wait}")
        if self.head_timeout <= 0:
            raise InvalidSpec(f"head_timeout must be positive, got {self.head_timeout}")
        if self.max_upload_bytes < 1:
            raise InvalidSpec(f"max_upload_bytes must be at least 1, got {self.max_upload_bytes}")
        NetworkPolicy.allow([], resolve=self.resolve)  # checks the pins
        if self.host_network and not self.allow_internet_access:
            raise InvalidSpec(
                "host_network (--allow-host-network) needs allow_internet_access (--allow-internet-access)"
            )
        if self.idle_pause is not None and self.idle_pause <= 0:
            raise InvalidSpec(f"idle_pause must be positive seconds (None: never), got {self.idle_pause}")
        if self.idle_interval <= 0:
            raise InvalidSpec(f"idle_interval must be positive, got {self.idle_interval}")
        if not 0 < self.default_timeout <= self.max_timeout:
            raise InvalidSpec("default_timeout must be positive and at most max_timeout")
        for name in ("sandbox_memory_mb", "sandbox_pids", "sandbox_disk_mb"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InvalidSpec(f"{name} must be at least 1, got {value}")
        if self.sandbox_cpus is not None and self.sandbox_cpus <= 0:
            raise InvalidSpec(f"sandbox_cpus must be positive, got {self.sandbox_cpus}")

    def profile(self, template: str) -> Profile:
        """What a sandbox of ``template`` runs in (a snapshot's sandboxes: ``base``'s), the server's limits where
        the template names none."""
        found = self.templates.get(template) or self.templates["base"]
        return found.profile(self.sandbox_cpus, self.sandbox_memory_mb, self.sandbox_pids, self.sandbox_disk_mb)

    def idle_pause_of(self, template: str) -> float | None:
        """Seconds an ``autoPause`` sandbox of ``template`` (a snapshot's: ``base``'s) may be idle before it is
        paused: the template's, else the server's; None: never."""
        found = (self.templates.get(template) or self.templates["base"]).idle_pause
        if found is None:
            return self.idle_pause
        return found or None

    def resources(self, template: str) -> tuple[int, int, int]:
        """``cpuCount``, ``memoryMB`` and ``diskSizeMB`` of a sandbox of ``template``'s info: its limits where it
        has them (CPUs rounded up: E2B's field is an integer), else the host's figures."""
        profile = self.profile(template)
        cpus = self.cpu_count if profile.cpus is None else max(1, math.ceil(profile.cpus))
        memory = self.memory_mb if profile.memory_mb is None else profile.memory_mb
        return cpus, memory, self.disk_mb if profile.disk_mb is None else profile.disk_mb
