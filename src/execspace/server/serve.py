"""Running the server: open the Engine, serve the app, and remove every sandbox on the way out.

Plain HTTP is served by uvicorn (HTTP/1.1, the fastest here); with :class:`TLS`, by hypercorn, which negotiates
HTTP/2 by ALPN and falls back to HTTP/1.1 for clients that do not offer it (the Python SDK's httpx, by default).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from starlette.datastructures import Headers
from starlette.types import ASGIApp

from ..audit import AuditLog, reopened_on_hangup
from ..backend import BackendOptions
from ..backends.local import LocalOptions
from ..backends.sandbox import SandboxOptions, SandboxPolicy, SessionConfig
from ..engine import open_engine
from ..environments import EnvironmentStore
from ..errors import CapabilityError, EnvironmentNotFound, SetupFailed
from ..listening import listen
from ..protocols import Engine
from ..registry import build_options, choose_default_backend, load_backend
from ..scrape import MetricsEndpoint, TargetGroup, prometheus_missing
from ..tracing import Tracer, from_environment
from .app import DATA_PATHS, E2BApp
from .audit import ServerAudit
from .builds import EnvironmentBuilds
from .connections import ConnectionGuard, raise_descriptor_limit
from .events import Events, Listener
from .idle import IdleWatch
from .interpreter import CodeInterpreter
from .jscontext import typescript_node
from .ledger import Ledger
from .options import KERNEL_TEMPLATES, TLS, ServerOptions
from .paths import HOME, HOME_DIR
from .requestlog import RequestLog
from .routing import target_of
from .sandboxes import Sandboxes
from .templates import Profile
from .tracing import TracedRequests, held_sandbox

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from ..backends.jupyter import Interpreter
    from ..environments import Environment
    from .metrics import ServerMetrics

__all__ = [
    "LOGIN_PROFILE",
    "TemplateEngines",
    "serve",
    "serve_app",
    "serve_sandbox_files",
    "with_metrics_endpoint",
]

_log = logging.getLogger("execspace.server")

#: The ``/etc/profile`` of serve's sandboxes, which every command's ``bash -l`` reads (E2B's envd starts each one so):
#: what Debian's sets for a user who is not root (a sandbox's never is), without the ``$(id -u)`` that forks and
#: execs ``id`` in every login shell (about half of a ``commands.run('true')`` here). The host's
#: ``/etc/profile.d`` scripts still run; ``~/.profile`` and the rest are the shell's own, read from ``HOME``.
LOGIN_PROFILE = """\
# /etc/profile of execspace serve's sandboxes (see docs/server.md): Debian's, for a user who is not root.
PATH="/usr/local/bin:/usr/bin:/bin:/usr/local/games:/usr/games"
export PATH
if [ "${PS1-}" ]; then
  if [ "${BASH-}" ] && [ "$BASH" != "/bin/sh" ]; then
    if [ -f /etc/bash.bashrc ]; then
      . /etc/bash.bashrc
    fi
  else
    PS1='$ '
  fi
fi
if [ -d /etc/profile.d ]; then
  for i in /etc/profile.d/*.sh; do
    if [ -r "$i" ]; then
      . "$i"
    fi
  done
  unset i
fi
"""

#: Seconds an idle client connection is kept open.
_KEEP_ALIVE = 30


async def serve(
    options: ServerOptions,
    *,
    host: str = "127.0.0.1",
    port: int = 3000,
    backend: str | None = "sandbox",
    backend_options: BackendOptions | None = None,
    on_ready: Callable[[str, int], None] | None = None,
    tls: TLS | None = None,
    where: str | None = None,
    node: str | None = None,
) -> None:
    """Serve until cancelled or signalled (SIGINT/SIGTERM); on the way out every sandbox is killed and removed.

    ``backend_options`` are the backend's (or a base of them, as ``HostOptions``); ``backend=None`` is the default
    choice, probed with them. ``on_ready(host, port)`` runs once the socket listens (``port=0`` picks a free one; this
    is how to learn it). With ``tls`` the server speaks HTTPS only (HTTP/2 or HTTP/1.1 by ALPN). ``where`` names
    this server in the log and errors of the environments it builds (default: the host's name); ``node`` is the Ray
    node id of a node agent's server (``serve --ray``), named in each of its audit lines.
    """
    if tls is not None:
        _check_tls(tls)
    # bound first: a port in use is one clear error before any sandbox or kernel is started
    with listen(host, port, "execspace serve") as sock:
        builds = EnvironmentBuilds(
            options.environments, where or f"host {socket.gethostname()}", wait=options.build_wait
        )
        await _serve_on(sock, options, backend, backend_options, on_ready, tls, builds, node)


async def _serve_on(
    sock: socket.socket,
    options: ServerOptions,
    backend: str | None,
    backend_options: BackendOptions | None,
    on_ready: Callable[[str, int], None] | None,
    tls: TLS | None,
    builds: EnvironmentBuilds,
    node: str | None,
) -> None:
    # the sandboxes' programs, files and streams, and the connections, each hold descriptors: take what may be had
    descriptors = raise_descriptor_limit()
    name = backend if backend not in (None, "auto") else await choose_default_backend(options=backend_options)
    opts = build_options(name, load_backend(name), backend_options)
    # the server's one tracer (the caller's, or the OTEL_* variables'): its requests' spans and its engines'
    async with audited_and_traced(options.audit_log, own_tracer=opts.tracer is None) as (audit, own_tracer):
        if own_tracer is not None:
            opts = replace(opts, tracer=own_tracer)
        listener = None if audit is None else ServerAudit(audit, None if node is None else {"node": node})
        await _serve_engines(sock, options, name, opts, on_ready, tls, descriptors, builds, listener)


@contextlib.asynccontextmanager
async def audited_and_traced(
    audit_log: Path | None, *, own_tracer: bool = True
) -> AsyncIterator[tuple[AuditLog | None, Tracer | None]]:
    """A server's audit log at ``audit_log`` (reopened on SIGHUP) and, with ``own_tracer``, its tracer of the
    ``OTEL_*`` variables (``None`` when they ask for none): both closed when the block ends, whatever failed."""
    async with contextlib.AsyncExitStack() as stack:
        tracer = from_environment("execspace-serve") if own_tracer else None
        if tracer is not None:
            stack.push_async_callback(asyncio.to_thread, tracer.close)
        audit = AuditLog(audit_log) if audit_log is not None else None
        if audit is not None:
            stack.callback(audit.close)
        stack.enter_context(reopened_on_hangup(audit))
        yield audit, tracer


async def _serve_engines(
    sock: socket.socket,
    options: ServerOptions,
    name: str,
    opts: BackendOptions,
    on_ready: Callable[[str, int], None] | None,
    tls: TLS | None,
    descriptors: int,
    builds: EnvironmentBuilds,
    audit: ServerAudit | None,
) -> None:
    if isinstance(opts, SandboxOptions):
        opts = _with_machine(opts, options.machine)
    built_at_start = _is_built(options.kernel_environment)
    python = kernel_python(options.kernel_environment) if isinstance(opts, SandboxOptions) else None
    if isinstance(opts, SandboxOptions | LocalOptions) and opts.output_rate is None:
        opts = replace(opts, output_rate=options.share.output_rate)  # each sandbox's share of the host's reading
    if isinstance(opts, SandboxOptions) and python is not None and not isinstance(python, str) and python.read_paths:
        # the kernels run in the sandboxes' sessions: their Python's tree is readable there (read-only)
        opts = replace(opts, policy=(opts.policy or SandboxPolicy()).with_read_paths(*python.read_paths))
    if isinstance(opts, SandboxOptions) and python is not None and not isinstance(python, str) and python.views:
        # as root, the kernels' Python under a directory the sandboxes' uids cannot pass: shown as views, but for
        # /root, which a machine's user cannot enter (its /root is its root's home)
        if opts.machine and any(v == "/root" or v.startswith("/root/") for v in python.views):
            python = (
                f"the kernels' Python ({python.path}) lies under /root, which the machine's user cannot enter: "
                "build the code-interpreter environment (execspace env build code-interpreter), or serve with "
                "--no-machine"
            )
        else:
            opts = replace(opts, read_views=(*opts.read_views, *python.views))
    async with TemplateEngines(options, name, opts, builds) as engines:
        engines.warn_unbuilt()
        engine = await engines.get("base")
        found = getattr(engine.manager, "root", None)  # kernels and the ledger live on the same workspace root
        root = Path(found) if found is not None else None
        sandboxes = Sandboxes(engine, options, Ledger(root), engines.get)
        if left := await sandboxes.remove_abandoned():
            _log.warning("removed %d sandboxes left on %s by an execspace serve that died", left, root)
        find_typescript = functools.partial(_typescript_node, python) if isinstance(opts, SandboxOptions) else None
        late = None if built_at_start or python is None else _built_since(options)
        interpreter = CodeInterpreter(engine.name, python, find_typescript, options.profile, late)
        metrics = _metrics(options, sandboxes, interpreter)
        listeners: list[Listener] = [metrics] if metrics is not None else []
        if audit is not None:
            listeners.append(audit)
        sandboxes.events = Events(listeners)  # before the first create
        sandboxes.on_remove.append(interpreter.end)
        sandboxes.on_take.append(interpreter.adopt)
        if options.warm_kernels and interpreter.warms_kernels():
            sandboxes.pool.warm_kernels(interpreter.warm_kernel, frozenset(KERNEL_TEMPLATES))
        app: ASGIApp = E2BApp(sandboxes, interpreter)
        if options.log_requests:
            app = RequestLog(app, options.domain)
        if metrics is not None:
            app = metrics.counting(app, options.domain, DATA_PATHS)
        app = with_metrics_endpoint(app, options, None if metrics is None else metrics.registry)
        if opts.tracer is not None and opts.tracer.enabled:
            app = TracedRequests(app, opts.tracer, options.domain, held_sandbox(sandboxes))
        watches = [asyncio.create_task(sandboxes.reap()), asyncio.create_task(IdleWatch(sandboxes).run())]
        sandboxes.pool.fill()
        try:
            await serve_app(app, sock, options, on_ready, sandboxes.close, tls, descriptors)
        finally:
            for watch in watches:
                watch.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watch
            await sandboxes.close()
            await interpreter.aclose()


async def serve_app(
    app: ASGIApp,
    sock: socket.socket,
    options: ServerOptions,
    on_ready: Callable[[str, int], None] | None,
    before_shutdown: Callable[[], Awaitable[None]],
    tls: TLS | None,
    descriptors: int,
) -> None:
    """Serve ``app`` on the listening ``sock`` until signalled: plain HTTP by uvicorn behind the connection guard,
    or HTTPS by hypercorn. ``before_shutdown`` ends what holds streams open (the sandboxes)."""
    if tls is not None:
        await _serve_tls(app, sock, tls, on_ready, before_shutdown, options.head_timeout)
        return
    guard = ConnectionGuard(
        app,
        limit=options.max_connections or max(16, descriptors // 4),
        head_timeout=options.head_timeout,
        idle_timeout=_KEEP_ALIVE,
    )
    config = uvicorn.Config(
        guard,
        lifespan="off",
        log_level="warning",
        access_log=False,
        # longer than the clients' own (httpx: 5 s), so that a client never sends on a connection the server is
        # closing at the same moment (the request would fail with a read error)
        timeout_keep_alive=_KEEP_ALIVE,
        http=guard.protocol(_http_protocol()),
    )
    await _Server(config, on_ready, before_shutdown).serve(sockets=[sock])


def _metrics(options: ServerOptions, sandboxes: Sandboxes, interpreter: CodeInterpreter) -> ServerMetrics | None:
    """The server's metrics, unless they are off (then prometheus_client is not imported)."""
    if options.metrics == "off":
        return None
    try:
        from .metrics import ServerMetrics
    except ImportError as exc:
        fix = "pip install 'execspace[serve]', or serve with --metrics off"
        raise prometheus_missing(exc, "serve", fix, "execspace serve") from None
    return ServerMetrics(sandboxes, interpreter.live_kernels)


def with_metrics_endpoint(
    app: ASGIApp,
    options: ServerOptions,
    registry: CollectorRegistry | None,
    targets: Callable[[], list[TargetGroup]] | None = None,
) -> ASGIApp:
    """``app`` behind ``GET /metrics`` of the control plane (a sandbox's ``/metrics`` is envd's: not served), and
    ``GET /metrics/targets`` where there are ``targets`` (the front door of ``serve --ray``: its nodes' servers)."""

    def control_plane(scope: MutableMapping[str, Any]) -> bool:
        return target_of(Headers(scope=scope), options.domain) is None

    def keys() -> tuple[str, ...]:
        return (*options.api_keys, *options.admin_keys)

    return MetricsEndpoint(app, registry, options.metrics, keys, control_plane, targets)


def _with_machine(opts: SandboxOptions, wanted: bool | None) -> SandboxOptions:
    """The sandbox backend's options with machine mode as the server wants it (see ``ServerOptions.machine``): when
    this host can have it and nothing said no; where it cannot, the server says so once and runs today's sandboxes
    (``user`` without a passwd entry or ``sudo``, a read-only system)."""
    if opts.machine or wanted is False:
        return opts
    if wanted is None and (why := _no_machine()) is not None:
        _log.warning(
            "sandboxes run without machine mode (no passwd entry for user, no sudo, a read-only system; "
            "pip installs need --target): %s",
            why,
        )
        return opts
    return replace(opts, machine=True)  # wanted: the engine refuses to open where it cannot (CapabilityError)


def _no_machine() -> str | None:
    """Why this host cannot give serve's sandboxes machine mode, or None."""
    if not sys.platform.startswith("linux"):
        return "machine mode runs on Linux"
    if os.geteuid() != 0:
        return (
            "machine mode maps two host uids into each sandbox's user namespace, which takes root: run execspace "
            "serve as root for E2B's machine"
        )
    return None


def _http_protocol() -> type[asyncio.Protocol]:
    """uvicorn's protocol over httptools (the serve extra has it: half the server's CPU per request, see
    docs/benchmarks.md), else over h11."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol
    return HttpToolsProtocol


def kernel_python(environment: str | None) -> Interpreter | str | None:
    """What runs the code interpreter's Python kernels, why nothing can (str), or None without jupyter_client.

    The runtime environment's Python when it is built here, else this process's own packages (from a Python the
    sandbox can run), as the ``jupyter`` backend's sandboxed kernels have it. Its tree must be readable in the
    sandbox (``Interpreter.read_paths``)."""
    try:
        import jupyter_client  # noqa: F401 - the host side of every kernel

        from ..backends.jupyter import Interpreter, environment_interpreter, find_interpreter
    except ImportError:
        return None
    if environment is not None and (built := _built(environment)) is not None:
        found = environment_interpreter(built)
        if isinstance(found, Interpreter):
            # the sandbox's programs run outside that environment: its tree is granted to them, read-only
            return Interpreter(found.path, found.site_dirs, (str(built.path),))
        return found
    return find_interpreter()


def _built(name: str) -> Environment | None:
    from ..environments import get

    try:
        return get(name)
    except EnvironmentNotFound:
        _log.warning(
            "the code interpreter's kernels run on the sandbox's system python: the environment %s is not built "
            "here (execspace env build %s gives run_code its data stack)",
            name,
            name,
        )
        return None


def _is_built(name: str | None) -> bool:
    if name is None:
        return False
    try:
        EnvironmentStore().get(name)
    except EnvironmentNotFound:
        return False
    return True


def _built_since(options: ServerOptions) -> Callable[[str], Interpreter | None]:
    """The Python of the kernels' environment once it is built (by the first create of a template in it: see
    :mod:`.builds`), for the kernels of the templates in it, whose sandboxes have its tree bound; None before, and
    for the other templates (their sandboxes keep the kernels' Python of the server's start)."""
    found: dict[str, Interpreter] = {}

    def python_of(template: str) -> Interpreter | None:
        from ..backends.jupyter import Interpreter, environment_interpreter

        name = options.kernel_environment
        if name is None or options.profile(template).environment != name:
            return None
        if name not in found:
            try:
                python = environment_interpreter(EnvironmentStore().get(name))
            except EnvironmentNotFound:
                return None
            if not isinstance(python, Interpreter):
                return None
            found[name] = python
        return found[name]

    return python_of


def _typescript_node(python: Interpreter | str | None) -> str | None:
    """The Node of TypeScript contexts: the kernels' environment's, or one beside this server's packages, or the
    host's (see :func:`.jscontext.typescript_node`)."""
    if python is None or isinstance(python, str):
        return typescript_node(None, ())
    return typescript_node(python.path, python.site_dirs)


def serve_sandbox_files(bin_dir: Path | None = None) -> tuple[tuple[str, str], ...]:
    """The sandbox backend's ``system_files`` of serve's sandboxes: their login profile (none on a system without
    ``/etc/profile``, whose login shells read none here either), with ``bin_dir`` (a runtime environment's) first
    on the ``PATH`` it sets."""
    if not os.path.isfile("/etc/profile"):
        return ()
    profile = LOGIN_PROFILE if bin_dir is None else LOGIN_PROFILE.replace('PATH="', f'PATH="{bin_dir}:', 1)
    return (("/etc/profile", profile),)


def _sandbox_template(opts: SandboxOptions, profile: Profile) -> SandboxOptions:
    """The sandbox backend's options for a profile's sandboxes: what they show of E2B's template (its home, and its
    login profile with the runtime environment's ``bin`` first on the ``PATH``), where the caller's options name
    none, the profile's environment, and in session mode its limits."""
    bin_dir = None
    if profile.environment is not None:  # EnvironmentNotFound names the command that builds it
        bin_dir = EnvironmentStore().get(profile.environment).bin_dir
    return replace(
        opts,
        # E2B's programs name their files by its home: there it is the directory SDK paths map to
        program_binds=opts.program_binds or ((HOME, HOME_DIR),),
        system_files=opts.system_files or serve_sandbox_files(bin_dir),
        environment=profile.environment if profile.environment is not None else opts.environment,
        session=_session_config(opts.session, profile) if opts.mode == "session" else opts.session,
    )


class TemplateEngines:
    """One engine per template profile (:class:`~.templates.Profile`: environment and limits), opened when a
    template first needs it and closed with the server; templates with the same profile share theirs.

    A profile's environment not built here is built by the first create that needs it (:mod:`.builds`). A profile
    that cannot be served fails the creates of its templates, not the server: an environment not built here of
    which no spec is known (``EnvironmentNotFound`` naming ``execspace env build``; a later create opens it once it
    is built), one whose build failed or still runs, a limit this backend cannot enforce (``CapabilityError``)."""

    def __init__(
        self, options: ServerOptions, backend: str, opts: BackendOptions, builds: EnvironmentBuilds | None = None
    ) -> None:
        self._options = options
        self._backend = backend
        self._opts = opts
        self._builds = builds or EnvironmentBuilds(options.environments, "this host", wait=options.build_wait)
        self._engines: dict[Profile, asyncio.Future[Engine]] = {}
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> TemplateEngines:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._builds.close()
        await self._stack.aclose()

    def warn_unbuilt(self) -> None:
        """Log each template whose environment is not built here: built by its first create, or (no spec known)
        its creates fail until it is."""
        store = EnvironmentStore()
        for template in self._options.templates.values():
            if template.environment is not None:
                try:
                    store.get(template.environment)
                except EnvironmentNotFound as exc:
                    if self._builds.spec(template.environment) is not None:
                        _log.warning(
                            "template %s: its environment %s is not built here; the first create of it builds it "
                            "(or build it ahead: execspace env build %s)",
                            template.name,
                            template.environment,
                            template.environment,
                        )
                    else:
                        _log.warning(
                            "template %s cannot be created until its environment is built: %s", template.name, exc
                        )

    async def get(self, template: str) -> Engine:
        """The engine of ``template``'s sandboxes (a snapshot's: ``base``'s), its environment built here first if
        it is not (see :mod:`.builds`)."""
        profile = self._options.profile(template)
        found = self._engines.get(profile)
        if found is None or (found.done() and (found.cancelled() or found.exception() is not None)):
            # only before its engine opens: an open engine's creates never look at the store again
            if profile.environment is not None and isinstance(self._opts, SandboxOptions):
                await self._builds.ready(profile.environment)
            found = self._engines.get(profile)  # another create may have opened it meanwhile
            if found is None or (found.done() and (found.cancelled() or found.exception() is not None)):
                found = self._engines[profile] = asyncio.ensure_future(self._open(profile))
        return await asyncio.shield(found)

    async def _open(self, profile: Profile) -> Engine:
        opts = self._opts
        if profile.limited and not (isinstance(opts, SandboxOptions) and opts.mode == "session"):
            raise CapabilityError(
                "limits per sandbox (cpus, memory, pids, disk)",
                self._backend,
                "they are the limits of each sandbox's session: use the sandbox backend in session mode",
            )
        if profile.environment is not None and not isinstance(opts, SandboxOptions):
            raise CapabilityError(
                f"a template's runtime environment {profile.environment!r}",
                self._backend,
                "serve the sandbox backend, or run code-interpreter-v1 on the host dirs: --kernel-environment none",
            )
        if isinstance(opts, SandboxOptions):
            opts = _sandbox_template(opts, profile)
        return await self._stack.enter_async_context(open_engine(self._backend, options=opts))


def _session_config(given: SessionConfig | None, profile: Profile) -> SessionConfig:
    """The sessions of a profile's sandboxes: the caller's config (``backend_options``) with the profile's limits
    over its own, so that a template's limit is never dropped."""
    # a sandbox's session lives as long as the sandbox (whose timeout the reaper enforces): an idle sandbox, a pooled
    # one included, does not lose it and pay its start on the next command
    config = given or SessionConfig(idle_timeout=None)
    memory = profile.memory_mb
    return replace(
        config,
        memory_bytes=config.memory_bytes if memory is None else memory * 1024 * 1024,
        pids=config.pids if profile.pids is None else profile.pids,
        cpus=config.cpus if profile.cpus is None else profile.cpus,
        disk_bytes=config.disk_bytes if profile.disk_mb is None else profile.disk_mb * 1024 * 1024,
    )


class _Server(uvicorn.Server):
    """uvicorn's server, telling where it listens once it does, and ending every sandbox (so their open streams)
    before it waits for the connections to close."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_ready: Callable[[str, int], None] | None,
        before_shutdown: Callable[[], Awaitable[None]],
    ) -> None:
        super().__init__(config)
        self._on_ready = on_ready
        self._before_shutdown = before_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self._before_shutdown()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            # the SIGTERM or ^C that stopped serving is done with: raised again (uvicorn's way of passing it on), it
            # would cancel serve()'s clean-up half way and leave sandboxes' workspaces behind
            self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self._on_ready is not None:
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            self._on_ready(host, port)


def _check_tls(tls: TLS) -> None:
    """Load the pair once before anything starts, so that a wrong file is a clear error, not a failed handshake."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise SetupFailed(
            "serve",
            f"cannot load the TLS certificate {tls.cert} with its key {tls.key}: {exc}",
            "give a PEM certificate chain (--tls-cert) and the PEM private key that matches it (--tls-key)",
            component="execspace serve",
        ) from None


async def _serve_tls(
    app: ASGIApp,
    sock: socket.socket,
    tls: TLS,
    on_ready: Callable[[str, int], None] | None,
    before_shutdown: Callable[[], Awaitable[None]],
    head_timeout: float,
) -> None:
    try:
        from hypercorn.asyncio import serve as serve_asgi
        from hypercorn.config import Config
    except ImportError:
        raise SetupFailed(
            "serve",
            "serving TLS and HTTP/2 needs hypercorn",
            "pip install 'execspace[serve]'",
            component="execspace serve",
        ) from None
    config = Config()
    config.certfile, config.keyfile = str(tls.cert), str(tls.key)
    config.accesslog = None
    config.errorlog = _log
    config.graceful_timeout = 5.0
    # hypercorn closes a connection that sends no complete request head within keep_alive_timeout (5 s) of its start
    # or its last response; a TLS handshake gets the head's time too (hypercorn has no connection cap of its own)
    config.ssl_handshake_timeout = head_timeout
    # hypercorn takes the listening socket by fd (bound before anything started, so port 0 is known by now)
    config.bind = [f"fd://{sock.fileno()}"]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(RuntimeError):  # not the main thread: the caller's cancellation stops it
            loop.add_signal_handler(sig, stop.set)

    async def shutdown_trigger() -> None:
        await stop.wait()
        await before_shutdown()  # every sandbox ends, so do their streams: the connections can close

    try:
        if on_ready is not None:
            on_ready(*sock.getsockname()[:2])
        await serve_asgi(app, config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(RuntimeError):
                loop.remove_signal_handler(sig)
