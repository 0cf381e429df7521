"""The ``local`` backend: programs run on this host as the calling user.

**No isolation.** The program can read and write every file you can, use your
network and credentials, and see your processes. Use it only for trusted code,
or when isolation is provided outside execspace. What it does give you: a
workspace layout, confined file staging and collection, an environment policy
(secret-looking variables dropped by default), output caps, timeouts that kill
the whole process tree, and rlimits for memory, CPU time and file size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...backend import HostOptions, Probe
from ...capabilities import Capabilities
from ...engine import BaseEngine
from ...envpolicy import EnvPolicy
from ...process.hostrunner import HostRunner, unisolated_capabilities
from ...process.pacing import check_output_rate
from ...process.preparation import host_user_exists
from ...tracing import NO_TRACER
from ...workspace.hostfs import HostWorkspaceFS
from ...workspace.hostmanager import HostWorkspaceManager

__all__ = ["LocalBackend", "LocalOptions"]

DOES_NOT_PROTECT = (
    "no isolation: the program runs as your user with your files, network, credentials and processes",
    "network cannot be turned off",
    "process count (pids) is not limited",
    "read-only staging only strips write bits; the program can restore them",
)


@dataclass(frozen=True, kw_only=True)
class LocalOptions(HostOptions):
    """The local backend's options: the shared host options (:class:`~execspace.backend.HostOptions`), and:

    Args:
        output_rate: bytes a second the host reads of one workspace's programs' output, all of them together (None:
            as fast as they write); a program that writes faster is held back by its full pipe, and nothing it wrote
            is lost. A server of many tenants sets it (``execspace serve``: 32 MiB/s) so that one program printing
            without end does not take the host's CPU from the others.
    """

    output_rate: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_output_rate(self.output_rate)


class LocalBackend:
    name = "local"
    options = LocalOptions

    @classmethod
    async def probe(cls, options: LocalOptions, /) -> Probe:
        return Probe(True, "always available (no isolation)")

    @classmethod
    def capabilities(cls, env_policy: EnvPolicy | None = None) -> Capabilities:
        return unisolated_capabilities("local", env_policy, DOES_NOT_PROTECT)

    @classmethod
    async def open(cls, options: LocalOptions, /) -> BaseEngine:
        """Open a local engine with ``options`` (see :class:`LocalOptions`)."""
        caps = cls.capabilities(options.env_policy)
        tracer = options.tracer or NO_TRACER
        runner = HostRunner(
            lambda: caps,
            options.env_policy,
            kill_grace=options.kill_grace,
            output_rate=options.output_rate,
            user_exists=host_user_exists,
            tracer=tracer,
            audit=options.audit,
        )
        root = Path(options.workspace_root) if options.workspace_root else None
        manager = HostWorkspaceManager(
            "local",
            root,
            stop_programs=runner.stop_programs,
            copy_on_write=True,
            freeze=runner.frozen,
            holds=runner.holds,
            tracer=tracer,
            audit=options.audit,
        )
        fs = HostWorkspaceFS(
            artifacts=options.artifacts, host_roots=options.host_roots, tracer=tracer, audit=options.audit
        )
        return BaseEngine("local", manager, fs, runner, caps)
