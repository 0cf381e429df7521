"""The sandbox backend's options (the ``options`` of :class:`~execspace.backends.sandbox.SandboxBackend`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import HostOptions
from .policy import SandboxPolicy

__all__ = ["SandboxOptions"]


@dataclass(frozen=True, kw_only=True)
class SandboxOptions(HostOptions):
    """The shared host options (:class:`~execspace.backend.HostOptions`), and:

    Args:
        policy: what programs may touch (default: ``SandboxPolicy()``, workspace-write with the network off).
            ``Profile.DANGER_FULL_ACCESS`` runs programs WITHOUT any sandbox (like ``local``);
            ``Profile.EXTERNAL`` runs nothing (isolation is elsewhere) and keeps the file rules.
        network: shorthand for ``policy.with_network(network)``; a run may still override it.
        bwrap: path of the bwrap binary (default: found on PATH).
    """

    policy: SandboxPolicy | None = None
    network: bool | None = None
    bwrap: str | None = None
