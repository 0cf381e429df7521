"""The ``jupyter`` backend: a stateful Jupyter kernel per workspace, with rich outputs as files.

``engine.kernels`` is a :class:`KernelSessions` that runs code in one kernel per workspace (the engine is a
:class:`~execspace.protocols.SupportsKernels`; ``describe().kernels`` says what its kernels offer), and
``execspace.code_executor(backend="jupyter")`` sends the kernel's language (python) there, other languages
to programs as usual.

Where kernels run is the ``mode=`` of :meth:`JupyterBackend.open` (:mod:`.modes`):

* :class:`SandboxedKernels`: each kernel is a program of the ``sandbox`` backend (bubblewrap, same policy,
  per-workspace uid, network off by default, cgroup/rlimit limits for the whole kernel), reached over IPC
  sockets in its workspace (:mod:`.sandboxed`); workspaces, the file API and programs are the sandbox
  backend's too; a warm pool starts kernels in workspace slots that become new workspaces
  (:mod:`.sandboxpool`). Fails closed with ``SetupFailed``.
  This is the default: where the sandbox cannot run kernels, opening fails; it never falls back.
* :class:`HostKernels`: kernels and programs run on this host as the caller, with no isolation (like
  ``local``, :mod:`.hostkernels`); only for trusted code, and only when named.
* :class:`AutoKernels`: sandboxed when the sandbox works here, else on the host with a ``RuntimeWarning`` and
  Capabilities saying isolation ``none`` and why: a fallback the caller asks for by naming this mode.
* :class:`ServerKernels`: kernels on a Jupyter Server or Kernel Gateway (:mod:`.server`).

For a component that runs kernels of its own in an existing sandbox session (``execspace serve``'s code
interpreter), the package also offers its kernel machinery: :class:`ProgramKernel` starts a kernel as a program of
any :class:`~execspace.protocols.ProgramRunner`'s workspace and is a :class:`KernelConnection` (what cells drive);
:class:`Interpreter`, :func:`find_interpreter` and :func:`environment_interpreter` find the Python that runs it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ...audit import AuditSink
from ...backend import HostOptions, Probe
from ...capabilities import Capabilities, Isolation, KernelCapabilities
from ...engine import BaseEngine, KernelEngine
from ...environments import EnvironmentStore
from ...envpolicy import EnvPolicy
from ...errors import EnvironmentNotFound, SetupFailed, UnsupportedBackend
from ...models import ResourceLimits
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...tracing import NO_TRACER, Tracer
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root, private_dir
from ...workspace.slots import sweep_stale_slots
from .hostkernels import HostLauncher
from .interpreters import Interpreter, environment_interpreter, find_interpreter
from .kernels import (
    CellResult,
    KernelConnection,
    KernelLauncher,
    KernelSessions,
    KernelWorkspaceManager,
    with_kernel_frozen,
)
from .modes import AutoKernels, HostKernels, KernelMode, SandboxedKernels, ServerKernels, check_mode
from .options import JupyterOptions
from .outputs import RichOutputLimits
from .programkernel import ProgramKernel

if TYPE_CHECKING:
    from ...models import NetworkPolicy
    from ...protocols import WorkspaceFS
    from .sandboxed import SandboxKernelConfig

__all__ = [
    "AutoKernels",
    "CellResult",
    "HostKernels",
    "Interpreter",
    "JupyterBackend",
    "JupyterOptions",
    "KernelConnection",
    "KernelMode",
    "KernelSessions",
    "ProgramKernel",
    "RichOutputLimits",
    "SandboxedKernels",
    "ServerKernels",
    "environment_interpreter",
    "find_interpreter",
]

#: Staging directories of pooled kernels, under the workspace root; workspace ids never sanitise to a leading dot.
POOL_DIR = ".kernel-pool"
INSTALL_HINT = "pip install 'execspace[jupyter]'"

#: Limits of a sandboxed kernel's whole sandbox, for its lifetime (it is one long-lived program).
DEFAULT_KERNEL_LIMITS = ResourceLimits(memory_bytes=4 << 30, pids=256, output_bytes=None)

SANDBOX_DOES_NOT_PROTECT = (
    "per-cell memory/pids/CPU limits: a kernel lives across cells, so kernel_limits apply to the whole kernel "
    "for its lifetime (cells get timeout and output_bytes)",
    "reopened sessions, explicit path= workspaces and kernels after a workspace's first start cold (about 0.7 s): "
    "the warm pool only serves the first kernel of a new workspace",
    "code in the kernel shares its workspace (and its IPC sockets) with programs run in the same workspace",
)

DOES_NOT_PROTECT = (
    "no isolation: kernels and programs run as your user with your files, network, credentials and processes",
    "network cannot be turned off",
    "process count (pids) is not limited",
    "kernels are not limited in memory, CPU time or processes (only programs get rlimits)",
)


class JupyterBackend:
    name = "jupyter"

    options = JupyterOptions

    @classmethod
    async def probe(cls, options: JupyterOptions, /) -> Probe:
        mode, kernel_name = options.kernel_mode(), options.kernel_name
        if isinstance(mode, ServerKernels):  # what the server offers is checked when the engine opens
            return Probe(True, f"remote kernels on {mode.url}")
        language = _kernel_language(kernel_name)
        if isinstance(language, Probe):
            return language
        if isinstance(mode, HostKernels):
            return Probe(True, f"kernel {kernel_name!r} ({language}) on this host, no isolation")
        environment = mode.environment if isinstance(mode, SandboxedKernels) else None
        why_not = await _sandbox_unavailable(kernel_name, language, mode.bwrap, environment)
        if why_not is None:
            return Probe(True, f"kernel {kernel_name!r} ({language}) in the OS sandbox")
        if isinstance(mode, SandboxedKernels):
            return Probe(False, f"cannot sandbox kernel {kernel_name!r}: {why_not[0]}", why_not[1])
        return Probe(True, f"kernel {kernel_name!r} ({language}) on this host, NO isolation: {why_not[0]}")

    @classmethod
    async def capabilities(
        cls, env_policy: EnvPolicy | None = None, *, mode: KernelMode | None = None, kernel_name: str = "python3"
    ) -> Capabilities:
        """What an engine opened with ``mode`` (default :class:`SandboxedKernels`) on this host states, without
        starting a kernel: sandboxed modes open (and close) the sandbox, since what it enforces here is known
        only then. ``SetupFailed`` where the mode cannot work."""
        mode = check_mode(mode or SandboxedKernels())
        if isinstance(mode, ServerKernels):  # nothing to ask here: the server is reached when an engine opens
            from .server import server_capabilities

            return server_capabilities(env_policy, mode, mode.url, "python", RichOutputLimits())
        common = HostOptions(env_policy=env_policy)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the fallback is in the statement itself
            engine = await _open_local(mode, common, kernel_name, 2.0, RichOutputLimits(), False)
        try:
            return engine.describe()
        finally:
            await engine.aclose()

    @classmethod
    async def open(cls, options: JupyterOptions, /) -> KernelEngine[KernelSessions]:
        """Open a jupyter engine with ``options`` (see :class:`JupyterOptions`).

        Raises:
            InvalidSpec: ``mode`` is not one of the modes.
            SetupFailed: the mode cannot work here (the message says how to fix it).
        """
        mode = options.kernel_mode()
        kernel_name, interrupt_grace = options.kernel_name, options.interrupt_grace
        rich = options.rich_outputs or RichOutputLimits()
        if isinstance(mode, ServerKernels):
            from .server import open_server_engine

            return await open_server_engine(
                mode, options, kernel_name=kernel_name, interrupt_grace=interrupt_grace, rich_outputs=rich
            )
        return await _open_local(mode, options, kernel_name, interrupt_grace, rich, True)


@dataclasses.dataclass(frozen=True)
class _KernelSettings:
    """What every kernel of an engine is started with, whatever runs it."""

    kernel_name: str
    interrupt_grace: float
    rich_outputs: RichOutputLimits
    tracer: Tracer = NO_TRACER
    audit: AuditSink | None = None

    def sessions(self, fs: WorkspaceFS, launcher: KernelLauncher, language: str) -> KernelSessions:
        return KernelSessions(
            fs,
            launcher,
            language=language,
            kernel_name=self.kernel_name,
            interrupt_grace=self.interrupt_grace,
            rich_outputs=self.rich_outputs,
            tracer=self.tracer,
            audit=self.audit,
        )


async def _open_local(
    mode: HostKernels | SandboxedKernels | AutoKernels,
    common: HostOptions,
    kernel_name: str,
    interrupt_grace: float,
    rich: RichOutputLimits,
    start_pool: bool,
) -> KernelEngine[KernelSessions]:
    """Host, sandboxed or auto mode; ``start_pool=False`` starts no kernel (for a capability statement)."""
    language = _kernel_language(kernel_name)
    if isinstance(language, Probe):
        raise SetupFailed("jupyter", language.reason, language.fix)
    tracer = (common.tracer or NO_TRACER).bound({"execspace.backend": "jupyter"})
    kernel_opts = _KernelSettings(kernel_name, interrupt_grace, rich, tracer, common.audit)
    if isinstance(mode, HostKernels):
        return _open_host(common, kernel_opts, language, mode, None, start_pool)
    sandboxed = (
        mode
        if isinstance(mode, SandboxedKernels)
        else SandboxedKernels(bwrap=mode.bwrap, pool_size=mode.pool_size, pool_idle_timeout=mode.pool_idle_timeout)
    )
    try:
        return await _open_sandboxed(common, kernel_opts, language, sandboxed, start_pool)
    except (SetupFailed, UnsupportedBackend) as exc:
        if isinstance(mode, SandboxedKernels):  # the default: fail, never fall back
            own = exc.fix if isinstance(exc, SetupFailed) else ""
            cause = exc.cause if isinstance(exc, SetupFailed) else str(exc)
            fix = f"{own}; {_HOST_KERNELS}" if own else _SANDBOX_FIX
            raise SetupFailed("jupyter", f"cannot sandbox kernels: {cause}", fix) from exc
        fallback = str(exc)
    warnings.warn(
        f"execspace jupyter: kernels run on this host WITHOUT isolation: {fallback} "
        "(pass mode=HostKernels() to choose this, or mode=SandboxedKernels() to fail instead)",
        RuntimeWarning,
        stacklevel=3,
    )
    host = HostKernels(pool_size=mode.pool_size, pool_idle_timeout=mode.pool_idle_timeout)
    return _open_host(common, kernel_opts, language, host, fallback, start_pool)


_HOST_KERNELS = (
    "or, for trusted code only, run kernels on this host without isolation: mode=HostKernels() "
    "(CLI: exec-code --kernels host)"
)
_SANDBOX_FIX = f"see `execspace doctor`; {_HOST_KERNELS}"
_INTERPRETER_FIX = (
    "make the environment where the sandbox's uid can read it (every parent directory searchable by others, "
    "e.g. a venv under /opt made from a system-wide Python), or install this Python version system-wide"
)


def _interpreter(environment: str | None) -> Interpreter | str:
    """The kernels' interpreter (``Interpreter``): the runtime environment's, else the caller's; or why not (str)."""
    if environment is None:
        return find_interpreter()
    return environment_interpreter(EnvironmentStore().get(environment))


async def _sandbox_unavailable(
    kernel_name: str, language: str, bwrap: str | None, environment: str | None = None
) -> tuple[str, str] | None:
    """Why kernels cannot run sandboxed here (cause, fix), or None."""
    from ..sandbox import SandboxBackend, SandboxOptions

    if not _ipykernel_spec(kernel_name, language):
        return f"kernel {kernel_name!r} is not an ipykernel (Python) kernel", "use a python kernel spec"
    try:
        interpreter = _interpreter(environment)
    except EnvironmentNotFound as exc:
        return str(exc), f"execspace env build {environment}"
    if isinstance(interpreter, str):
        return interpreter, _INTERPRETER_FIX
    probe = await SandboxBackend.probe(SandboxOptions(bwrap=bwrap))
    return None if probe.ok else (probe.reason, probe.fix)


async def _open_sandboxed(
    common: HostOptions,
    kernel_opts: _KernelSettings,
    language: str,
    mode: SandboxedKernels,
    start_pool: bool,
) -> KernelEngine[KernelSessions]:
    from ..sandbox import KernelSeccompFilters, SandboxBackend, SandboxOptions, SandboxPolicy, sandbox_of
    from .sandboxed import SandboxKernelConfig

    if not _ipykernel_spec(kernel_opts.kernel_name, language):
        raise SetupFailed("jupyter", f"kernel {kernel_opts.kernel_name!r} is not an ipykernel kernel", "")
    interpreter = _interpreter(mode.environment)
    if isinstance(interpreter, str):
        raise SetupFailed("jupyter", interpreter, _INTERPRETER_FIX)
    policy = mode.policy or SandboxPolicy()
    if not policy.managed:
        raise SetupFailed("jupyter", f"the sandbox policy {policy.profile} runs no sandbox", "use a managed profile")
    if interpreter.read_paths:
        policy = policy.with_read_paths(*interpreter.read_paths)
    own = SandboxOptions(
        workspace_root=common.workspace_root,
        env_policy=common.env_policy,
        host_roots=common.host_roots,
        artifacts=common.artifacts,
        kill_grace=common.kill_grace,
        policy=policy,
        network=mode.network,
        bwrap=mode.bwrap,
        environment=mode.environment,
        program_binds=mode.program_binds,
        read_views=interpreter.views,
        tracer=kernel_opts.tracer,
        audit=common.audit,
    )
    sb = await SandboxBackend.open(own)
    sandbox = sandbox_of(sb.runner)
    sb_caps = sb.describe()
    limits = _kernel_limits(mode.kernel_limits, sb_caps.enforced_limits)
    seccomp = KernelSeccompFilters()
    rich = kernel_opts.rich_outputs
    cfg = SandboxKernelConfig(sandbox, seccomp, interpreter, limits, sandbox.network_default, rich.message_bytes)
    # no-access globs are judged against a workspace's files when its sandbox starts: a slot has none yet
    pool_size = 0 if policy.no_access_globs else mode.pool_size
    manager, kernels = _slot_workspaces(sb, cfg, language, kernel_opts, pool_size, mode.pool_idle_timeout)
    await asyncio.to_thread(sweep_stale_slots, manager.root)  # a crashed engine's pool, on this root
    caps = _sandboxed_capabilities(sb_caps, language, cfg, (mode.pool_size, pool_size), rich)
    if start_pool:
        kernels.start_pool()
    return KernelEngine("jupyter", manager, sb.fs, sb.runner, caps, kernels, on_close=kernels.aclose)


def _slot_workspaces(
    sb: BaseEngine,
    cfg: SandboxKernelConfig,
    language: str,
    kernel_opts: _KernelSettings,
    pool_size: int,
    pool_idle_timeout: float,
) -> tuple[HostWorkspaceManager, KernelSessions]:
    """The sandbox backend's workspaces (same root, layout owner and modes), made of pool slots when ready."""
    from ..sandbox import sandbox_layout_owner
    from .sandboxpool import SandboxLauncher, SlotWorkspaceManager, make_slot

    root = Path(getattr(sb.manager, "root"))  # noqa: B009 - HostWorkspaceManager's, not in the protocol
    as_root = os.geteuid() == 0
    prepare = sandbox_layout_owner() if as_root else None
    new_slot = functools.partial(make_slot, root, 0o711 if as_root else 0o700, prepare)
    launcher = SandboxLauncher(cfg, new_slot, pool_size=pool_size, pool_idle_timeout=pool_idle_timeout)
    kernels = kernel_opts.sessions(sb.fs, launcher, language)
    runner = sb.runner
    assert isinstance(runner, HostRunner)
    manager = SlotWorkspaceManager(
        root,
        launcher,
        kernels,
        prepare=prepare,
        private_root=not as_root,
        stop_programs=runner.stop_programs,
        freeze=with_kernel_frozen(kernels, runner.frozen),
        audit=kernel_opts.audit,
    )
    return manager, kernels


def _pool_detail(asked: int, size: int) -> str:
    if size > 0:
        return f"{size} sandboxed kernel(s) started ahead, each in a workspace slot that becomes one new workspace"
    if asked > 0:
        return "off: the policy has no-access globs, which a kernel started before its workspace's files cannot apply"
    return "off (pool_size=0)"


def _kernel_limits(asked: ResourceLimits | None, enforced: frozenset[str]) -> ResourceLimits:
    """The kernel's limits: the caller's (each must be enforceable here), or the defaults this host enforces."""
    if asked is not None:
        missing = sorted(asked.requested() - enforced - {"output_bytes"})
        if missing:
            raise SetupFailed(
                "jupyter", f"kernel_limits {', '.join(missing)} cannot be enforced here", "drop these kernel_limits"
            )
        return dataclasses.replace(asked, output_bytes=None)
    keep = {n: getattr(DEFAULT_KERNEL_LIMITS, n) if n in enforced else None for n in ("memory_bytes", "pids")}
    return ResourceLimits(output_bytes=None, **keep)


def _kernel_network(on: bool, allow: NetworkPolicy | None) -> str:
    if allow is not None:
        return f"allow-list through an egress proxy per kernel ({', '.join(allow.allowed) or 'nothing listed'})"
    if on:
        return "on"
    return "off (own network namespace; socket(AF_UNIX) refused once the kernel's channels are bound)"


def _sandboxed_capabilities(
    sb: Capabilities, language: str, cfg: SandboxKernelConfig, pool: tuple[int, int], rich: RichOutputLimits
) -> Capabilities:
    limits = cfg.limits
    applied = ", ".join(f"{n}={getattr(limits, n)}" for n in sorted(limits.requested())) or "none"
    details = {
        **sb.details,
        "mode": "kernel in the OS sandbox (bubblewrap), reached over IPC sockets in its workspace's runs/",
        "kernel_isolation": "sandbox",
        "kernel_language": language,
        "kernel_network": _kernel_network(cfg.network, cfg.sandbox.network_allow),
        "kernel_limits": f"{applied} for the kernel's whole sandbox ({sb.details.get('memory_bytes', '')}); "
        "cells: timeout (interrupt message, then restart) and output_bytes",
        "kernel_interpreter": cfg.interpreter.path,
        "rich_outputs": rich.describe(),
        "pool": _pool_detail(*pool),
    }
    kernels = KernelCapabilities(
        languages=(language,),
        isolation=Isolation.PROCESS,
        cell_limits=frozenset({"timeout", "output_bytes"}),
        kernel_limits=limits.requested(),
        network_control=True,
        rich_output_files=rich.files_per_cell,
        rich_output_bytes=rich.bytes_per_cell,
        warm_pool=pool[1],
    )
    languages = sb.languages if language in sb.languages else (language, *sb.languages)
    return dataclasses.replace(
        sb,
        backend="jupyter",
        persistent_state=True,
        languages=languages,
        does_not_protect=(*sb.does_not_protect, *SANDBOX_DOES_NOT_PROTECT),
        details=details,
        kernels=kernels,
        fork="copy",  # files only (a kernel's state is never forked), by plain copies
    )


def _host_capabilities(
    env_policy: EnvPolicy | None, language: str, rich: RichOutputLimits, pool_size: int
) -> Capabilities:
    base = unisolated_capabilities(
        "jupyter",
        env_policy,
        DOES_NOT_PROTECT,
        {
            "mode": "kernel on this host (no sandbox)",
            "kernel_isolation": "none",
            "kernel_language": language,
            "kernel_limits": "timeout (interrupt, then restart) and output_bytes only",
            "rich_outputs": rich.describe(),
        },
    )
    kernels = KernelCapabilities(
        languages=(language,),
        isolation=Isolation.NONE,
        cell_limits=frozenset({"timeout", "output_bytes"}),
        rich_output_files=rich.files_per_cell,
        rich_output_bytes=rich.bytes_per_cell,
        warm_pool=pool_size,
    )
    languages = base.languages if language in base.languages else (language, *base.languages)
    # forks are files only (a kernel's state is never forked), by plain copies
    return dataclasses.replace(base, persistent_state=True, languages=languages, kernels=kernels, fork="copy")


def _open_host(
    common: HostOptions,
    kernel_opts: _KernelSettings,
    language: str,
    mode: HostKernels,
    fallback: str | None,
    start_pool: bool,
) -> KernelEngine[KernelSessions]:
    env_policy = common.env_policy
    caps = _host_capabilities(env_policy, language, kernel_opts.rich_outputs, mode.pool_size)
    if fallback is not None:
        caps = dataclasses.replace(
            caps, details={**caps.details, "kernel_isolation": f"none (auto: the sandbox is unavailable: {fallback})"}
        )
    assert caps.isolation is Isolation.NONE
    audit = kernel_opts.audit
    fs = HostWorkspaceFS(
        artifacts=common.artifacts, host_roots=common.host_roots, tracer=kernel_opts.tracer, audit=audit
    )
    root = Path(common.workspace_root) if common.workspace_root else default_workspace_root()
    if mode.pool_size > 0:
        private_dir(root)  # the pool stages kernels under the root: make sure it is ours first
    launcher = HostLauncher(
        env_policy,
        kernel_name=kernel_opts.kernel_name,
        language=language,
        pool_dir=root / POOL_DIR,
        pool_size=mode.pool_size,
        pool_idle_timeout=mode.pool_idle_timeout,
    )
    kernels = kernel_opts.sessions(fs, launcher, language)
    runner = HostRunner(lambda: caps, env_policy, kill_grace=common.kill_grace, tracer=kernel_opts.tracer, audit=audit)
    freeze = with_kernel_frozen(kernels, runner.frozen)
    manager = KernelWorkspaceManager(root, kernels, runner.stop_programs, freeze, audit, kernel_opts.tracer)
    if start_pool:
        kernels.start_pool()
    return KernelEngine("jupyter", manager, fs, runner, caps, kernels, on_close=kernels.aclose)


def _ipykernel_spec(kernel_name: str, language: str) -> bool:
    """Whether the spec starts ipykernel (the sandbox launcher runs ipykernel itself)."""
    from jupyter_client.kernelspec import KernelSpecManager

    argv = list(KernelSpecManager().get_kernel_spec(kernel_name).argv)
    return language == "python" and ("ipykernel_launcher" in argv or "ipykernel" in argv)


def _kernel_language(kernel_name: str) -> str | Probe:
    """The language of an installed kernel spec, or a failed Probe saying what is missing."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import ipykernel  # noqa: F401 - the python3 kernel spec runs it
            from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    except ImportError as exc:
        return Probe(False, f"cannot import {exc.name or 'jupyter_client'}", INSTALL_HINT)
    try:
        spec = KernelSpecManager().get_kernel_spec(kernel_name)
    except NoSuchKernel:
        return Probe(False, f"no Jupyter kernel spec named {kernel_name!r}", INSTALL_HINT)
    return str(spec.language).lower()
