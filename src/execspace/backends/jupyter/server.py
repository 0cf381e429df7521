"""The jupyter backend's server modes (:class:`~.modes.ServerKernels`), assembled in one place.

Both modes run cells in kernels of a Jupyter Server or Kernel Gateway (:mod:`.serverkernels`, over
:mod:`.serverapi`); they differ in where workspaces are:

* ``shared_filesystem=True``: on this host, seen by the server's kernels at the same paths (a server on this
  host, or ``workspace_root`` shared at the same path). Files and programs are this host's.
* ``shared_filesystem=False``: **server-side workspaces** (:mod:`.serverworkspaces`): on the server under
  ``remote_root``, files move through a file kernel, programs are refused: nothing runs on this host.

What ``describe()`` says: ``kernels.isolation`` is ``remote`` in both (the server's own boundary is what the
kernels get); the engine's ``isolation`` is about programs: ``none`` when they run on this host
(``programs="host"``), ``remote`` when nothing runs here.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...backend import HostOptions
from ...capabilities import Capabilities, Isolation, KernelCapabilities
from ...engine import KernelEngine
from ...envpolicy import EnvPolicy
from ...errors import CapabilityError, ProgramNotFound, SetupFailed
from ...models import ProgramInfo, RunProgramSpec, RunResult, Workspace
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...protocols import ProgramHandle, ProgramRunner
from ...tracing import NO_TRACER
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import default_workspace_root
from .kernels import KernelSessions, KernelWorkspaceManager
from .modes import ProgramsMode, ServerKernels
from .outputs import RichOutputLimits
from .serverapi import ServerApi
from .serverkernels import RemoteKernelSessions
from .serverworkspaces import (
    CHUNK,
    FileKernel,
    RemoteWorkspaceFS,
    RemoteWorkspaceManager,
    ServerWorkspaceKernels,
    ServerWorkspaceLauncher,
)

__all__ = ["NoPrograms", "open_server_engine", "server_capabilities"]

DOES_NOT_PROTECT = (
    "no isolation: kernels run as the server's user, with that user's files, network and processes",
    "anything running as the server's user can read its token and drive every kernel on it, including other "
    "workspaces' kernels",
    "the token and all code and outputs cross the network in clear text unless the server URL is https",
    "network cannot be turned off",
    "kernels are not limited in memory, CPU time or processes (cells get timeout and output_bytes only)",
)
#: Added with programs="host".
PROGRAMS_DO_NOT_PROTECT = ("programs run on this host as you, with no isolation (rlimits and timeout only)",)
#: Added for server-side workspaces.
SERVER_WORKSPACES_DO_NOT_PROTECT = (
    "the file API trusts the server side: it runs in a kernel as the server's user, the same principal as the "
    "workspaces' code, which can change any workspace of this engine on the server (what comes back is checked "
    "before it is written on this host)",
    "workspaces on the server have no disk quota, and are removed only by cleanup",
)

#: Why ``programs="refuse"`` refuses programs.
REFUSED = (
    "This remote engine was opened with programs='refuse': run code in the kernel (engine.kernels), "
    "or open it with programs='host' to run programs on this host without isolation."
)
#: Why server-side workspaces refuse programs: running them well needs a process API on the server.
PROGRAMS_REFUSED = (
    "This remote engine's workspaces are on the server (shared_filesystem=False): run code in the kernel "
    "(engine.kernels, or CodeExecutor for python blocks); use subprocess from a cell if you must."
)


class NoPrograms:
    """A runner that refuses every program with ``why``: code runs only in the server's kernels."""

    def __init__(self, why: str = REFUSED) -> None:
        self.why = why

    async def run_program(self, ws: Workspace, spec: RunProgramSpec) -> RunResult:
        raise CapabilityError("programs", "jupyter", self.why)

    async def start_program(self, ws: Workspace, spec: RunProgramSpec) -> ProgramHandle:
        raise CapabilityError("programs", "jupyter", self.why)

    async def list_programs(self, ws: Workspace) -> list[ProgramInfo]:
        return []

    async def get_program(self, ws: Workspace, key: int | str) -> ProgramHandle:
        raise ProgramNotFound(f"no program runs in workspace {ws.id!r}: {self.why}")


def server_capabilities(
    env_policy: EnvPolicy | None, mode: ServerKernels, url: str, language: str, rich: RichOutputLimits
) -> Capabilities:
    """What a server mode enforces: cells in the server's kernels; programs on this host, or none at all."""
    programs: ProgramsMode = mode.programs if mode.shared_filesystem else "refuse"
    where = "programs run on this host" if programs == "host" else "no programs"
    files = "shared filesystem" if mode.shared_filesystem else "workspaces on the server, no shared filesystem"
    details = {
        "mode": f"remote kernels on {url} ({files}; {where})",
        "kernel_language": language,
        "kernel_limits": "timeout (interrupt, then a fresh kernel) and output_bytes only",
        "rich_outputs": rich.describe(),
    }
    if not mode.shared_filesystem:
        chunks = f"in chunks of {CHUNK >> 20} MiB"
        details["files"] = f"through a file kernel on the server, {chunks}, with the host's path rules"
    dnp = DOES_NOT_PROTECT + (PROGRAMS_DO_NOT_PROTECT if programs == "host" else ())
    dnp += () if mode.shared_filesystem else SERVER_WORKSPACES_DO_NOT_PROTECT
    base = unisolated_capabilities("jupyter", env_policy, dnp, details)
    kernels = KernelCapabilities(
        languages=(language,),
        isolation=Isolation.REMOTE,
        cell_limits=frozenset({"timeout", "output_bytes"}),
        rich_output_files=rich.files_per_cell,
        rich_output_bytes=rich.bytes_per_cell,
    )
    if programs == "host":
        languages = base.languages if language in base.languages else (language, *base.languages)
        return dataclasses.replace(base, persistent_state=True, languages=languages, kernels=kernels)
    return dataclasses.replace(
        base,
        isolation=Isolation.REMOTE,  # nothing runs on this host
        programs=False,
        fork=base.fork if mode.shared_filesystem else None,  # server-side workspaces are neither forked nor snapshot
        persistent_state=True,
        languages=(language,),
        streaming=False,
        clean_env=False,
        # what cells get (CodeExecutor checks these before running anything); there are no programs
        enforced_limits=kernels.cell_limits,
        host_paths=mode.shared_filesystem,
        kernels=kernels,
    )


async def open_server_engine(
    mode: ServerKernels,
    common: HostOptions,
    *,
    kernel_name: str,
    interrupt_grace: float,
    rich_outputs: RichOutputLimits,
) -> KernelEngine[KernelSessions]:
    """The engine of ``mode`` (``common``: the shared host options).

    Raises:
        SetupFailed: no token, a refused token (HTTP 401/403), an unknown or non-Python kernel; with a shared
            filesystem, a kernel that does not see its workspace (on its first cell).
        BackendError: the server cannot be reached.
    """
    if not mode.token:
        raise SetupFailed(
            "jupyter", "remote mode needs the server's token", "pass token=...; never run a server without one"
        )
    api = ServerApi(mode.url, mode.token, ca_file=mode.ca_file, request_timeout=mode.request_timeout)
    try:
        language = await _remote_language(api, kernel_name)
    except BaseException:
        api.close()
        raise
    caps = server_capabilities(common.env_policy, mode, api.url, language, rich_outputs)
    tracer = (common.tracer or NO_TRACER).bound({"execspace.backend": "jupyter"})
    opts: dict[str, Any] = {
        "kernel_name": kernel_name,
        "language": language,
        "start_timeout": mode.start_timeout,
        "interrupt_grace": interrupt_grace,
        "rich_outputs": rich_outputs,
        "audit": common.audit,
        "tracer": tracer,
    }
    if not mode.shared_filesystem:
        return _server_workspaces(api, mode, common, caps, opts)
    audit = common.audit
    fs = HostWorkspaceFS(artifacts=common.artifacts, host_roots=common.host_roots, tracer=tracer, audit=audit)
    server_root = Path(mode.server_root) if mode.server_root is not None else None
    kernels = RemoteKernelSessions(api, fs, common.env_policy, server_root=server_root, **opts)
    root = Path(common.workspace_root) if common.workspace_root else default_workspace_root()
    if mode.programs == "host":
        host = HostRunner(lambda: caps, common.env_policy, kill_grace=common.kill_grace, tracer=tracer, audit=audit)
        runner: ProgramRunner = host
        # cleanup stops its programs too
        manager = KernelWorkspaceManager(root, kernels, host.stop_programs, audit=audit, tracer=tracer)
    else:
        runner = NoPrograms()
        manager = KernelWorkspaceManager(root, kernels, audit=audit, tracer=tracer)
    return KernelEngine("jupyter", manager, fs, runner, caps, kernels, on_close=kernels.aclose)


def _server_workspaces(
    api: ServerApi, mode: ServerKernels, common: HostOptions, caps: Capabilities, opts: dict[str, Any]
) -> KernelEngine[KernelSessions]:
    launcher = ServerWorkspaceLauncher(api, common.env_policy, kernel_name=opts["kernel_name"])
    files = FileKernel(launcher, timeout=mode.request_timeout)
    fs = RemoteWorkspaceFS(files, common.artifacts, common.host_roots or (), common.audit, opts["tracer"])
    launcher.fs = fs
    kernels = ServerWorkspaceKernels(api, fs, launcher, **opts)
    manager = RemoteWorkspaceManager(files, kernels, mode.remote_root, common.audit)

    async def close() -> None:
        await files.aclose()
        await kernels.aclose()

    return KernelEngine("jupyter", manager, fs, NoPrograms(PROGRAMS_REFUSED), caps, kernels, on_close=close)


async def _remote_language(api: ServerApi, kernel_name: str) -> str:
    """The language of the server's kernel spec ``kernel_name``; only Python kernels can be bound to a workspace."""
    specs = (await api.kernelspecs()).get("kernelspecs") or {}
    if kernel_name not in specs:
        known = ", ".join(sorted(specs)) or "none"
        raise SetupFailed(
            "jupyter",
            f"the server at {api.url} has no kernel spec {kernel_name!r} (it has: {known})",
            "pick one of those with kernel_name=..., or install the kernel on the server",
        )
    language = str((specs[kernel_name].get("spec") or {}).get("language", "")).lower()
    if language != "python":
        raise SetupFailed(
            "jupyter",
            f"kernel {kernel_name!r} is {language or 'of unknown language'}: remote mode moves kernels into their "
            "workspace with a Python cell, so only Python kernels are supported",
            "use a Python kernel spec, or the local jupyter backend for other kernels",
        )
    return language
