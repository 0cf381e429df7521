"""The ``jupyter`` backend: a stateful Jupyter kernel per workspace, with rich outputs as files.

``engine.extra("kernels")`` is a :class:`KernelSessions` that runs code in one kernel per
workspace, and ``execspace.code_executor(backend="jupyter")`` sends the kernel's language
(python) there, other languages to programs as usual.

Where kernels run is ``kernel_isolation`` (see :meth:`JupyterBackend.open`):

* ``"sandbox"``: each kernel is a program of the ``sandbox`` backend (bubblewrap, same policy,
  per-workspace uid, network off by default, cgroup/rlimit limits for the whole kernel), reached
  over IPC sockets in its workspace (:mod:`.sandboxed`); workspaces, the file API and programs are
  the sandbox backend's too; a warm pool starts kernels in workspace slots that become new
  workspaces (:mod:`.sandboxpool`). Fails closed with ``SetupFailed``.
* ``"none"``: kernels and programs run on this host as the caller, with no isolation (like
  ``local``); only for trusted code.
* ``"auto"`` (default): ``"sandbox"`` when the sandbox works here, else ``"none"`` with a
  ``RuntimeWarning`` and Capabilities saying isolation ``none`` and why: never a silent fallback.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import warnings
from pathlib import Path
from typing import Any, Literal

from ...capabilities import Capabilities, Isolation
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...errors import InvalidSpec, SetupFailed, UnsupportedBackend
from ...models import ResourceLimits
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root, private_dir
from ...workspace.slots import sweep_stale_slots
from .hostkernels import HostLauncher
from .kernels import CellResult, KernelSessions, KernelWorkspaceManager
from .outputs import RichOutputLimits

__all__ = ["CellResult", "JupyterBackend", "KernelSessions", "RichOutputLimits"]

#: Staging directories of pooled kernels, under the workspace root; workspace ids never sanitise to a leading dot.
POOL_DIR = ".kernel-pool"
INSTALL_HINT = "pip install 'execspace[jupyter]'"

KernelIsolation = Literal["auto", "sandbox", "none"]

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

    @classmethod
    async def probe(
        cls, *, kernel_name: str = "python3", kernel_isolation: KernelIsolation = "auto", **options: Any
    ) -> Probe:
        if options.get("server_url"):  # what the server offers is checked when the engine opens
            return Probe(True, f"remote kernels on {options['server_url']}")
        language = _kernel_language(kernel_name)
        if isinstance(language, Probe):
            return language
        if kernel_isolation == "none":
            return Probe(True, f"kernel {kernel_name!r} ({language}) on this host, no isolation")
        why_not = await _sandbox_unavailable(kernel_name, language, options)
        if why_not is None:
            return Probe(True, f"kernel {kernel_name!r} ({language}) in the OS sandbox")
        if kernel_isolation == "sandbox":
            return Probe(False, f"cannot sandbox kernel {kernel_name!r}: {why_not[0]}", why_not[1])
        return Probe(True, f"kernel {kernel_name!r} ({language}) on this host, NO isolation: {why_not[0]}")

    @classmethod
    def capabilities(cls, env_policy: EnvPolicy | None = None, *, language: str = "python") -> Capabilities:
        """What host mode (``kernel_isolation="none"``) gives; an open engine's ``describe()`` tells its mode."""
        base = unisolated_capabilities(
            "jupyter",
            env_policy,
            DOES_NOT_PROTECT,
            {
                "mode": "kernel on this host (no sandbox)",
                "kernel_isolation": "none",
                "kernel_language": language,
                "kernel_limits": "timeout (interrupt, then restart) and output_bytes only",
            },
        )
        languages = base.languages if language in base.languages else (language, *base.languages)
        return dataclasses.replace(base, persistent_state=True, languages=languages)

    @classmethod
    async def open(
        cls,
        *,
        workspace_root: Path | str | None = None,
        env_policy: EnvPolicy | None = None,
        host_roots: Any = (),
        artifacts: Any = None,
        kill_grace: float = 2.0,
        kernel_name: str = "python3",
        interrupt_grace: float = 2.0,
        pool_size: int = 1,
        pool_idle_timeout: float = 600.0,
        kernel_isolation: KernelIsolation = "auto",
        policy: Any = None,
        network: bool | None = None,
        bwrap: str | None = None,
        kernel_limits: ResourceLimits | None = None,
        server_url: str | None = None,
        token: str | None = None,
        server_root: Path | str | None = None,
        ca_file: str | None = None,
        programs: Literal["host", "refuse"] = "host",
        shared_filesystem: bool = True,
        remote_root: str = "execspace-workspaces",
        rich_outputs: RichOutputLimits | None = None,
    ) -> BaseEngine:
        """Open a jupyter engine.

        Args:
            workspace_root, env_policy, host_roots, artifacts, kill_grace: as for the local backend;
                ``env_policy`` also builds each kernel's environment.
            kernel_name: the installed kernel spec to start for each workspace (sandboxed: ipykernel specs only).
            interrupt_grace: seconds a timed-out cell gets to stop after the interrupt before
                its kernel is restarted.
            pool_size: kernels kept started for the next new workspaces (0: none; Python kernels only). On
                the host each is bound to its workspace by a silent cell; sandboxed ones start in a workspace
                slot that is renamed into place (:mod:`.sandboxpool`), so they serve new workspaces only (not
                reopened ones, nor ``path=``), and none with a policy's no-access globs. One covers sessions
                opened one at a time (a refill takes about 0.5 s) for one idle process; raise it for bursts.
            pool_idle_timeout: seconds a pooled kernel waits for a workspace before it is stopped; the pool
                refills on the next kernel start (sandbox mode: the next workspace created).
            kernel_isolation: ``"sandbox"`` (kernels and programs in the OS sandbox; ``SetupFailed`` if it
                does not work here), ``"none"`` (on this host, no isolation) or ``"auto"`` (sandbox when it
                works, else none with a ``RuntimeWarning``; ``describe()`` says which; ``SetupFailed`` instead
                when ``policy``, ``network`` or ``kernel_limits`` is given, since the host cannot honour them).
            policy, network, bwrap: the sandbox backend's options (sandbox mode).
            kernel_limits: limits of each sandboxed kernel as a whole, for its lifetime (default
                :data:`DEFAULT_KERNEL_LIMITS`, less what this host cannot enforce).
            rich_outputs: how many files and bytes of rich output one cell may leave under ``out/``, and the
                largest message a sandboxed kernel may send (default :class:`RichOutputLimits`; remote mode
                uses the defaults).
            server_url, token, server_root, ca_file, programs, shared_filesystem, remote_root: remote mode:
                kernels on the Jupyter Server or
                Kernel Gateway at ``server_url`` (see :func:`.serverkernels.open_remote_engine` and
                docs/jupyter-remote.md); the sandbox's options do not apply there.
        """
        if server_url is not None:
            if kernel_isolation == "sandbox" or policy is not None or network is not None or kernel_limits is not None:
                raise InvalidSpec(
                    "kernel_isolation='sandbox', policy, network and kernel_limits cannot apply to "
                    "a remote server's kernels; the server's own isolation is what they get"
                )
            from .serverkernels import open_remote_engine

            return await open_remote_engine(
                server_url=server_url,
                token=token or "",
                server_root=server_root,
                ca_file=ca_file,
                programs=programs,
                shared_filesystem=shared_filesystem,
                remote_root=remote_root,
                kernel_name=kernel_name,
                interrupt_grace=interrupt_grace,
                workspace_root=workspace_root,
                env_policy=env_policy,
                host_roots=host_roots,
                artifacts=artifacts,
                kill_grace=kill_grace,
            )
        language = _kernel_language(kernel_name)
        if isinstance(language, Probe):
            raise SetupFailed("jupyter", language.reason, language.fix)
        common: dict[str, Any] = {
            "workspace_root": workspace_root,
            "env_policy": env_policy,
            "host_roots": host_roots,
            "artifacts": artifacts,
            "kill_grace": kill_grace,
        }
        kernel_opts: dict[str, Any] = {
            "kernel_name": kernel_name,
            "interrupt_grace": interrupt_grace,
            "rich_outputs": rich_outputs or RichOutputLimits(),
        }
        fallback: str | None = None
        sandbox_asked = policy is not None or network is not None or kernel_limits is not None
        if kernel_isolation == "none" and sandbox_asked:
            raise InvalidSpec("policy, network and kernel_limits apply to sandboxed kernels; kernel_isolation='none'")
        if kernel_isolation != "none":
            try:
                return await _open_sandboxed(
                    common,
                    kernel_opts,
                    language,
                    policy,
                    network,
                    bwrap,
                    kernel_limits,
                    (pool_size, pool_idle_timeout),
                    explicit=kernel_isolation,
                )
            except (SetupFailed, UnsupportedBackend) as exc:
                # a caller who set the sandbox's options asked for what the host cannot give: fail, do not fall back
                if kernel_isolation == "sandbox" or sandbox_asked:
                    raise SetupFailed("jupyter", f"cannot sandbox kernels: {exc}", _SANDBOX_FIX) from exc
                fallback = str(exc)
                warnings.warn(
                    f"execspace jupyter: kernels run on this host WITHOUT isolation: {fallback} "
                    "(pass kernel_isolation='none' to choose this, or 'sandbox' to fail instead)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return _open_host(common, kernel_opts, language, pool_size, pool_idle_timeout, fallback)


_SANDBOX_FIX = "see `execspace doctor`; or pass kernel_isolation='none' to run kernels on the host without isolation"


async def _sandbox_unavailable(kernel_name: str, language: str, options: dict[str, Any]) -> tuple[str, str] | None:
    """Why kernels cannot run sandboxed here (cause, fix), or None."""
    from ..sandbox import SandboxBackend
    from .sandboxed import find_interpreter

    if not _ipykernel_spec(kernel_name, language):
        return f"kernel {kernel_name!r} is not an ipykernel (Python) kernel", "use a python kernel spec"
    interpreter = find_interpreter()
    if isinstance(interpreter, str):
        return interpreter, "install python3 for this Python version system-wide, or a venv in a readable place"
    probe = await SandboxBackend.probe(bwrap=options.get("bwrap"))
    return None if probe.ok else (probe.reason, probe.fix)


async def _open_sandboxed(
    common: dict[str, Any],
    kernel_opts: dict[str, Any],
    language: str,
    policy: Any,
    network: bool | None,
    bwrap: str | None,
    kernel_limits: ResourceLimits | None,
    pool: tuple[int, float],
    *,
    explicit: str,
) -> BaseEngine:
    from ..sandbox import KernelSeccompFilters, SandboxBackend, SandboxPolicy, SandboxRunner
    from .sandboxed import SandboxKernelConfig, find_interpreter

    if not _ipykernel_spec(kernel_opts["kernel_name"], language):
        raise SetupFailed("jupyter", f"kernel {kernel_opts['kernel_name']!r} is not an ipykernel kernel", "")
    interpreter = find_interpreter()
    if isinstance(interpreter, str):
        raise SetupFailed("jupyter", interpreter, "install python3 for this Python version system-wide")
    policy = policy or SandboxPolicy()
    if not policy.managed:
        raise SetupFailed("jupyter", f"the sandbox policy {policy.profile} runs no sandbox", "use a managed profile")
    if interpreter.read_paths:
        policy = policy.with_read_paths(*interpreter.read_paths)
    sb = await SandboxBackend.open(**common, policy=policy, network=network, bwrap=bwrap)
    runner = sb.runner
    assert isinstance(runner, SandboxRunner)
    sb_caps = sb.describe()
    limits = _kernel_limits(kernel_limits, sb_caps.enforced_limits)
    seccomp = KernelSeccompFilters()
    rich: RichOutputLimits = kernel_opts["rich_outputs"]
    cfg = SandboxKernelConfig(runner, seccomp, interpreter, limits, runner.network_default, rich.message_bytes)
    # no-access globs are judged against a workspace's files when its sandbox starts: a slot has none yet
    pool_size = 0 if policy.no_access_globs else pool[0]
    manager, kernels = _slot_workspaces(sb, cfg, language, kernel_opts, pool_size, pool[1])
    await asyncio.to_thread(sweep_stale_slots, manager.root)  # a crashed engine's pool, on this root
    caps = _sandboxed_capabilities(sb_caps, language, cfg, _pool_detail(pool[0], pool_size), rich)
    extra = {
        "workspace_root": manager.root,
        "kernels": kernels,
        "bwrap": sb.extra("bwrap"),  # noqa: S610 - the engine's extras, not Django's
        "kernel_isolation": "sandbox",
    }
    kernels.start_pool()
    return BaseEngine("jupyter", manager, sb.fs, runner, caps, on_close=kernels.aclose, extra=extra)


def _slot_workspaces(
    sb: BaseEngine, cfg: Any, language: str, kernel_opts: dict[str, Any], pool_size: int, pool_idle_timeout: float
) -> tuple[HostWorkspaceManager, KernelSessions]:
    """The sandbox backend's workspaces (same root, layout owner and modes), made of pool slots when ready."""
    from ..sandbox import SandboxRunner, sandbox_layout_owner
    from .sandboxpool import SandboxLauncher, SlotWorkspaceManager, make_slot

    root = Path(getattr(sb.manager, "root"))  # noqa: B009 - HostWorkspaceManager's, not in the protocol
    as_root = os.geteuid() == 0
    prepare = sandbox_layout_owner() if as_root else None
    new_slot = functools.partial(make_slot, root, 0o711 if as_root else 0o700, prepare)
    launcher = SandboxLauncher(cfg, new_slot, pool_size=pool_size, pool_idle_timeout=pool_idle_timeout)
    kernels = KernelSessions(sb.fs, launcher, language=language, **kernel_opts)
    runner = sb.runner
    assert isinstance(runner, SandboxRunner)
    manager = SlotWorkspaceManager(
        root, launcher, kernels, prepare=prepare, private_root=not as_root, stop_programs=runner.stop_programs
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


def _sandboxed_capabilities(
    sb: Capabilities, language: str, cfg: Any, pool: str, rich: RichOutputLimits
) -> Capabilities:
    limits = cfg.limits
    applied = ", ".join(f"{n}={getattr(limits, n)}" for n in sorted(limits.requested())) or "none"
    details = {
        **sb.details,
        "mode": "kernel in the OS sandbox (bubblewrap), reached over IPC sockets in its workspace's runs/",
        "kernel_isolation": "sandbox",
        "kernel_language": language,
        "kernel_network": "on"
        if cfg.network
        else "off (own network namespace; socket(AF_UNIX) refused once the kernel's channels are bound)",
        "kernel_limits": f"{applied} for the kernel's whole sandbox ({sb.details.get('memory_bytes', '')}); "
        "cells: timeout (interrupt message, then restart) and output_bytes",
        "kernel_interpreter": cfg.interpreter.path,
        "rich_outputs": rich.describe(),
        "pool": pool,
    }
    languages = sb.languages if language in sb.languages else (language, *sb.languages)
    return dataclasses.replace(
        sb,
        backend="jupyter",
        persistent_state=True,
        languages=languages,
        does_not_protect=(*sb.does_not_protect, *SANDBOX_DOES_NOT_PROTECT),
        details=details,
    )


def _open_host(
    common: dict[str, Any],
    kernel_opts: dict[str, Any],
    language: str,
    pool_size: int,
    pool_idle_timeout: float,
    fallback: str | None,
) -> BaseEngine:
    env_policy = common["env_policy"]
    caps = JupyterBackend.capabilities(env_policy, language=language)
    if fallback is not None:
        caps = dataclasses.replace(
            caps, details={**caps.details, "kernel_isolation": f"none (auto: the sandbox is unavailable: {fallback})"}
        )
    assert caps.isolation is Isolation.NONE
    caps = dataclasses.replace(caps, details={**caps.details, "rich_outputs": kernel_opts["rich_outputs"].describe()})
    fs = HostWorkspaceFS(artifacts=common["artifacts"], host_roots=common["host_roots"])
    root = Path(common["workspace_root"]) if common["workspace_root"] else default_workspace_root()
    if pool_size > 0:
        private_dir(root)  # the pool stages kernels under the root: make sure it is ours first
    launcher = HostLauncher(
        env_policy,
        kernel_name=kernel_opts["kernel_name"],
        language=language,
        pool_dir=root / POOL_DIR,
        pool_size=pool_size,
        pool_idle_timeout=pool_idle_timeout,
    )
    kernels = KernelSessions(fs, launcher, language=language, **kernel_opts)
    runner = HostRunner(lambda: caps, env_policy, kill_grace=common["kill_grace"])
    manager = KernelWorkspaceManager(root, kernels, runner.stop_programs)
    kernels.start_pool()
    extra = {"workspace_root": manager.root, "kernels": kernels, "kernel_isolation": "none"}
    return BaseEngine("jupyter", manager, fs, runner, caps, on_close=kernels.aclose, extra=extra)


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
