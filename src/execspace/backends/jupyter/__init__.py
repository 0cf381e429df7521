"""The ``jupyter`` backend: a stateful Jupyter kernel per workspace, with rich outputs as files.

This first version runs kernels and programs **on this host as the caller, with no
isolation** (like ``local``): use it for trusted code. Workspaces, the file API and
programs are the local backend's; on top, ``engine.extra("kernels")`` is a
:class:`KernelSessions` that runs code in one kernel per workspace, and
``execspace.code_executor(backend="jupyter")`` sends the kernel's language (python)
there, other languages to programs as usual.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any

from ...capabilities import Capabilities
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...models import Workspace
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager, default_workspace_root, private_dir
from .kernels import CellResult, KernelSessions

__all__ = ["CellResult", "JupyterBackend", "KernelSessions"]

#: Staging directories of pooled kernels, under the workspace root; workspace ids never sanitise to a leading dot.
POOL_DIR = ".kernel-pool"
INSTALL_HINT = "pip install 'execspace[jupyter]'"

DOES_NOT_PROTECT = (
    "no isolation: kernels and programs run as your user with your files, network, credentials and processes",
    "network cannot be turned off",
    "process count (pids) is not limited",
    "kernels are not limited in memory, CPU time or processes (only programs get rlimits)",
)


class _KernelWorkspaceManager(HostWorkspaceManager):
    """Host-directory workspaces whose cleanup also stops their kernel."""

    def __init__(self, root: Path | None, kernels: KernelSessions) -> None:
        super().__init__("jupyter", root)
        self._kernels = kernels

    async def cleanup(self, ws: Workspace) -> None:
        await self._kernels.shutdown(ws)
        await super().cleanup(ws)


class JupyterBackend:
    name = "jupyter"

    @classmethod
    async def probe(cls, *, kernel_name: str = "python3", **options: Any) -> Probe:
        language = _kernel_language(kernel_name)
        if isinstance(language, Probe):
            return language
        return Probe(True, f"kernel {kernel_name!r} ({language}) on this host, no isolation")

    @classmethod
    def capabilities(cls, env_policy: EnvPolicy | None = None, *, language: str = "python") -> Capabilities:
        base = unisolated_capabilities(
            "jupyter",
            env_policy,
            DOES_NOT_PROTECT,
            {
                "mode": "kernel on this host (no sandbox)",
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
    ) -> BaseEngine:
        """Open a jupyter engine.

        Args:
            workspace_root, env_policy, host_roots, artifacts, kill_grace: as for the local backend;
                ``env_policy`` also builds each kernel's environment.
            kernel_name: the installed kernel spec to start for each workspace.
            interrupt_grace: seconds a timed-out cell gets to stop after the interrupt before
                its kernel is restarted.
            pool_size: kernels kept started for the next new workspaces (0: none; only for Python kernels).
                One covers sessions opened one at a time (a refill takes about 0.5 s) for one idle process;
                raise it for bursts of new sessions.
            pool_idle_timeout: seconds a pooled kernel waits for a workspace before it is stopped; the pool
                refills on the next kernel start.
        """
        from ...errors import SetupFailed

        language = _kernel_language(kernel_name)
        if isinstance(language, Probe):
            raise SetupFailed("jupyter", language.reason, language.fix)
        caps = cls.capabilities(env_policy, language=language)
        fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots)
        root = Path(workspace_root) if workspace_root else default_workspace_root()
        if pool_size > 0:
            private_dir(root)  # the pool stages kernels under the root: make sure it is ours first
        kernels = KernelSessions(
            fs,
            env_policy,
            kernel_name=kernel_name,
            language=language,
            interrupt_grace=interrupt_grace,
            pool_dir=root / POOL_DIR,
            pool_size=pool_size,
            pool_idle_timeout=pool_idle_timeout,
        )
        manager = _KernelWorkspaceManager(root, kernels)
        runner = HostRunner(lambda: caps, env_policy, kill_grace=kill_grace)
        kernels.start_pool()
        return BaseEngine(
            "jupyter",
            manager,
            fs,
            runner,
            caps,
            on_close=kernels.aclose,
            extra={"workspace_root": manager.root, "kernels": kernels},
        )


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
