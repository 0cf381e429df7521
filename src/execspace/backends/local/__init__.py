"""The ``local`` backend: programs run on this host as the calling user.

**No isolation.** The program can read and write every file you can, use your
network and credentials, and see your processes. Use it only for trusted code,
or when isolation is provided outside execspace. What it does give you: a
workspace layout, confined file staging and collection, an environment policy
(secret-looking variables dropped by default), output caps, timeouts that kill
the whole process tree, and rlimits for memory, CPU time and file size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...capabilities import Capabilities
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...registry import Probe
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager

__all__ = ["LocalBackend"]

DOES_NOT_PROTECT = (
    "no isolation: the program runs as your user with your files, network, credentials and processes",
    "network cannot be turned off",
    "process count (pids) is not limited",
    "read-only staging only strips write bits; the program can restore them",
)


class LocalBackend:
    name = "local"

    @classmethod
    async def probe(cls, **options: Any) -> Probe:
        return Probe(True, "always available (no isolation)")

    @classmethod
    def capabilities(cls, env_policy: EnvPolicy | None = None) -> Capabilities:
        return unisolated_capabilities("local", env_policy, DOES_NOT_PROTECT)

    @classmethod
    async def open(
        cls,
        *,
        workspace_root: Path | str | None = None,
        env_policy: EnvPolicy | None = None,
        host_roots: Any = (),
        artifacts: Any = None,
        kill_grace: float = 2.0,
    ) -> BaseEngine:
        """Open a local engine.

        Args:
            workspace_root: where workspaces are created (default: a private dir under $TMPDIR).
            env_policy: how the environment is built (default: core variables, secrets dropped).
            host_roots: host directories that ``host://`` inputs may read from.
            artifacts: an ``ArtifactService`` for ``artifact://`` inputs and saved outputs.
            kill_grace: seconds between SIGTERM and SIGKILL when a run is killed.
        """
        caps = cls.capabilities(env_policy)
        runner = HostRunner(lambda: caps, env_policy, kill_grace=kill_grace)
        root = Path(workspace_root) if workspace_root else None
        manager = HostWorkspaceManager("local", root, stop_programs=runner.stop_programs)
        fs = HostWorkspaceFS(artifacts=artifacts, host_roots=host_roots)
        return BaseEngine("local", manager, fs, runner, caps)
