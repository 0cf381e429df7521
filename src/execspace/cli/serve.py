"""``execspace serve``: the E2B-compatible sandbox server (see docs/server.md)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SetupFailed, UsageError
from .run import resolve_pair

if TYPE_CHECKING:
    from ..backend import BackendOptions

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "serve",
        help="serve sandboxes to the official E2B SDK (E2B-compatible control plane and envd on one port)",
        description=(
            "An E2B-compatible server: point the e2b SDK at it (E2B_API_URL and E2B_SANDBOX_URL) and each "
            "Sandbox.create() gets a workspace on this host's backend. Needs the 'serve' extra."
        ),
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=3000, help="port to listen on; 0 picks a free one (default 3000)")
    p.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="an X-API-KEY clients must send (repeatable); each key is a team that sees only its own sandboxes and "
        "snapshots; without one a random key is made and printed",
    )
    p.add_argument(
        "--admin-api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key that sees and acts on every team's sandboxes and snapshots (repeatable; an operator's)",
    )
    p.add_argument("--backend", default="sandbox", help="backend each sandbox's workspace lives on (default sandbox)")
    p.add_argument(
        "--sandbox-mode",
        choices=("session", "per-run"),
        default="session",
        help="with --backend sandbox: one sandbox per E2B sandbox whose commands it forks (session, the default), "
        "or a fresh sandbox per command (per-run)",
    )
    p.add_argument(
        "--machine",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="with --backend sandbox: each sandbox is the machine E2B's code expects (user with a passwd entry, "
        "passwordless sudo to the sandbox's own root, a system it can write; docs/server.md); default: when this "
        "host can (as root on Linux), else without it, said at start-up",
    )
    p.add_argument(
        "--workspace-root", metavar="DIR", help="where the sandboxes' workspaces live (default: the backend's)"
    )
    p.add_argument(
        "--max-sandboxes",
        type=int,
        default=100,
        metavar="N",
        help="live sandboxes at once (default 100); with --ray, each node's that declares no execspace_sandbox "
        "resource (0: such nodes hold none)",
    )
    p.add_argument(
        "--pool-size",
        action="append",
        default=[],
        metavar="[TEMPLATE=]N",
        help="ready sandboxes kept per template so that a create does not wait for its set-up (repeatable; N alone "
        "is for base; default base=2; counted toward --max-sandboxes)",
    )
    p.add_argument(
        "--warm-kernels",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the Python kernel of each pooled code-interpreter-v1 sandbox ahead of its create, so that its "
        "first run_code does not wait for it (default on; each costs its pooled sandbox the kernel's memory)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="client connections held at once, more are closed as they come (default: a quarter of the descriptors "
        "the process may open, the rest kept for the sandboxes)",
    )
    p.add_argument(
        "--head-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="time a new connection has to send a complete request head before it is closed (default 10)",
    )
    p.add_argument(
        "--max-upload-mb", type=int, default=1024, metavar="MB", help="largest file POST /files takes (default 1024)"
    )
    p.add_argument(
        "--sandbox-memory-mb",
        type=int,
        metavar="MB",
        help="memory of each sandbox, all its processes together (session mode; a cgroup as root); reported as "
        "memoryMB in its info",
    )
    p.add_argument(
        "--sandbox-disk-mb",
        type=int,
        metavar="MB",
        help="disk of each sandbox: its workspace a filesystem of that size, its /tmp bounded too (session mode; "
        "needs root); reported as diskSizeMB in its info",
    )
    p.add_argument(
        "--sandbox-pids", type=int, metavar="N", help="processes of each sandbox at once (session mode; needs root)"
    )
    p.add_argument(
        "--sandbox-cpus",
        type=float,
        metavar="N",
        help="CPU bandwidth of each sandbox in CPUs, fractions allowed (session mode; a cgroup CPU quota, needs "
        "root); reported as cpuCount in its info",
    )
    p.add_argument(
        "--sandbox-max-commands",
        type=int,
        metavar="N",
        help="commands started through the API and running at once, per sandbox (default 128)",
    )
    p.add_argument(
        "--sandbox-max-streams",
        type=int,
        metavar="N",
        help="streams open at once per sandbox: command and cell output, directory watches (default 128)",
    )
    p.add_argument(
        "--sandbox-max-watchers",
        type=int,
        metavar="N",
        help="directory watchers per sandbox, polled and streamed together (default 16)",
    )
    p.add_argument(
        "--sandbox-request-rate",
        type=float,
        metavar="N",
        help="data-plane requests per second each sandbox makes on average, in bursts of as many; one past it waits "
        "its turn (default 500)",
    )
    p.add_argument(
        "--sandbox-output-rate",
        type=int,
        metavar="MB",
        help="MiB a second read of the output of each sandbox's programs, all together; one that prints faster is "
        "held back by its full pipe (default 32)",
    )
    p.add_argument(
        "--idle-pause",
        type=float,
        metavar="SECONDS",
        help="pause a sandbox created with autoPause once it has been idle this long (its programs use no CPU, no "
        "request or stream of it is open), resumed by its next request (default: never; a template's idle_pause "
        "overrides it)",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="TOML file with [templates.NAME] tables (environment, cpu_count, memory_mb, disk_mb, pids, "
        "idle_pause) and [environments.NAME] specs, built the first time a create needs one (docs/server.md)",
    )
    p.add_argument(
        "--build-wait",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="how long a create waits for its template's environment to be built here (the first time one needs "
        "it) before it answers 503 with Retry-After 4, naming the build, which goes on (default 10: the SDK's "
        "three retries then end before its 60 s request timeout)",
    )
    p.add_argument(
        "--domain", help="answer host-based routing for <port>-<sandboxID>.DOMAIN (behind wildcard DNS + TLS)"
    )
    p.add_argument(
        "--allow-internet-access",
        action="store_true",
        help="let sandboxes created with allow_internet_access=True reach the network through their egress proxy: "
        "every public destination, never this host (default: all offline)",
    )
    p.add_argument(
        "--allow-host-network",
        action="store_true",
        help="DANGEROUS: such sandboxes share this host's network instead, its loopback services (this server's "
        "API included) and its own addresses with it (needs --allow-internet-access)",
    )
    p.add_argument(
        "--resolve",
        action="append",
        default=[],
        type=resolve_pair,
        metavar="NAME=ADDR",
        help="pin NAME to ADDR for sandboxes' egress allow-lists (network.allowOut; repeatable: tests, private "
        "deployments; a pinned address counts as allowed)",
    )
    p.add_argument(
        "--upstream-ca",
        type=Path,
        metavar="FILE",
        help="verify the servers of hosts with network.rules (headers the egress proxy injects) against the CA "
        "certificates in FILE (PEM) instead of this machine's trust store",
    )
    p.add_argument(
        "--kernel-environment",
        default="code-interpreter",
        metavar="NAME",
        help="runtime environment the code interpreter's kernels start from when built (default code-interpreter: "
        "pandas, matplotlib...; 'none': the system python)",
    )
    p.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS (HTTP/2 by ALPN, else HTTP/1.1) with this PEM certificate chain; needs --tls-key",
    )
    p.add_argument("--tls-key", metavar="FILE", help="the PEM private key of --tls-cert")
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="be a front door of a Ray cluster: sandboxes live on its nodes, each node's agent running this server's "
        "data plane with these options (--max-sandboxes per node); ADDRESS as ray.init takes it (HOST:6379, auto); "
        "needs the 'ray' extra (docs/cluster.md)",
    )
    p.add_argument(
        "--metrics",
        choices=("open", "key", "off"),
        default="open",
        help="who may read GET /metrics (Prometheus text): open, anyone who reaches the port (default: a scraper "
        "holds no E2B key); key, a holder of an API key (X-API-KEY or Authorization: Bearer); off, nobody (404); "
        "with --ray, the front door's and each node's server's, which GET /metrics/targets lists",
    )
    p.add_argument(
        "--audit-log",
        type=Path,
        metavar="FILE",
        help="append one JSON line per security-relevant event to FILE (0600; created if missing): sandbox "
        "creates and kills, commands, file writes and removes, refusals, egress; SIGHUP reopens it (rotation); with "
        "--ray, each node's server appends to FILE on its own machine, each line naming its node",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log a line per request on stderr: method, path, sandbox, status, duration (default: quiet)",
    )
    p.set_defaults(handler=command)


def _pool_sizes(values: list[str]) -> tuple[tuple[str, int], ...]:
    """``--pool-size`` values (``N`` or ``TEMPLATE=N``, the last of a template wins) over the default base=2."""
    sizes = {"base": 2}
    for value in values:
        template, _, count = value.rpartition("=")
        try:
            sizes[template or "base"] = int(count)
        except ValueError:
            raise UsageError(f"--pool-size takes N or TEMPLATE=N (e.g. code-interpreter-v1=4), got {value!r}") from None
    return tuple(sizes.items())


async def command(args: argparse.Namespace) -> int:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise UsageError("--tls-cert and --tls-key go together: give both (HTTPS) or neither (plain HTTP)")
    if args.ray and args.max_sandboxes < 0:
        raise UsageError(
            f"--max-sandboxes with --ray is the slots of a node that declares no execspace_sandbox resource: 0 or "
            f"more, got {args.max_sandboxes}"
        )
    try:
        from ..server import (
            BUILTIN_TEMPLATES,
            TLS,
            ServerOptions,
            ShareLimits,
            generate_api_key,
            load_config,
            load_environments,
            serve,
        )
    except ImportError as exc:
        raise SetupFailed(
            "serve",
            f"the server's dependencies are missing ({exc.name})",
            "pip install 'execspace[serve]'",
            component="execspace serve",
        ) from None
    defaults = ShareLimits()
    keys = tuple(args.api_key) or (() if args.admin_api_key else (generate_api_key(),))
    templates = load_config(Path(args.config)) if args.config else dict(BUILTIN_TEMPLATES)
    environments = load_environments(Path(args.config)) if args.config else {}
    options = ServerOptions(
        api_keys=keys,
        admin_keys=tuple(args.admin_api_key),
        # with --ray a node's own slots are its server's maximum: 0 is only the default of nodes that declare none
        max_sandboxes=1 if args.ray and args.max_sandboxes == 0 else args.max_sandboxes,
        pool_sizes=_pool_sizes(args.pool_size),
        warm_kernels=args.warm_kernels,
        max_upload_bytes=args.max_upload_mb * 1024 * 1024,
        max_connections=args.max_connections,
        share=ShareLimits(
            programs=args.sandbox_max_commands or defaults.programs,
            streams=args.sandbox_max_streams or defaults.streams,
            watchers=args.sandbox_max_watchers or defaults.watchers,
            requests_per_second=args.sandbox_request_rate or defaults.requests_per_second,
            output_rate=args.sandbox_output_rate * 1024 * 1024 if args.sandbox_output_rate else defaults.output_rate,
        ),
        head_timeout=args.head_timeout,
        log_requests=args.verbose,
        domain=args.domain,
        allow_internet_access=args.allow_internet_access,
        host_network=args.allow_host_network,
        resolve=dict(args.resolve),
        upstream_ca=None if args.upstream_ca is None else args.upstream_ca.resolve(),
        machine=args.machine,
        kernel_environment=None if args.kernel_environment == "none" else args.kernel_environment,
        sandbox_memory_mb=args.sandbox_memory_mb,
        sandbox_pids=args.sandbox_pids,
        sandbox_disk_mb=args.sandbox_disk_mb,
        sandbox_cpus=args.sandbox_cpus,
        templates=templates,
        environments=environments,
        build_wait=args.build_wait,
        metrics=args.metrics,
        audit_log=None if args.audit_log is None else args.audit_log.resolve(),
        idle_pause=args.idle_pause,
    )

    tls = TLS(Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None
    _log_builds()
    if args.verbose:
        _log_to_stderr()

    def ready(host: str, port: int) -> None:
        url = f"{'https' if tls else 'http'}://{host}:{port}"
        lines = [
            f"execspace serve: listening on {url} (backend {args.backend})",
            "point the E2B SDK at it:",
            f"  export E2B_API_URL={url}",
            f"  export E2B_SANDBOX_URL={url}",
        ]
        if not args.api_key and not args.admin_api_key:
            lines.append(f"  export E2B_API_KEY={keys[0]}")
        print("\n".join(lines), flush=True)

    if args.ray:
        try:
            from ..server.cluster import serve_cluster
        except ImportError as exc:
            raise SetupFailed(
                "serve",
                f"serve --ray's dependencies are missing ({exc.name})",
                "pip install 'execspace[ray]'",
                component="execspace serve --ray",
            ) from None
        await serve_cluster(
            options,
            args.ray,
            host=args.host,
            port=args.port,
            backend=args.backend,
            backend_options=_backend_options(args),
            on_ready=ready,
            tls=tls,
            slots=args.max_sandboxes,
        )
        return 0
    await serve(
        options,
        host=args.host,
        port=args.port,
        backend=args.backend,
        backend_options=_backend_options(args),
        on_ready=ready,
        tls=tls,
    )
    return 0


def _log_to_stderr() -> None:
    """The server's request lines on our stderr (the ready lines go to stdout, for a shell to read)."""
    from ..server.requestlog import LOGGER

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("execspace serve: %(message)s"))
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _log_builds() -> None:
    """Each step of an environment the server builds on a create's first need, on our stderr."""
    from ..server.builds import LOGGER

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("execspace serve: %(message)s"))
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def _backend_options(args: argparse.Namespace) -> BackendOptions | None:
    """The options of the backend the flags set: the sandbox's mode, and where any backend keeps its workspaces."""
    from ..backend import HostOptions
    from ..backends.sandbox import SandboxOptions

    root = args.workspace_root
    if args.backend == "sandbox":
        return SandboxOptions(workspace_root=root or None, mode=args.sandbox_mode)
    return HostOptions(workspace_root=root) if root else None
