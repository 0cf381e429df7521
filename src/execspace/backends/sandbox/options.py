"""The sandbox backend's options (the ``options`` of :class:`~execspace.backends.sandbox.SandboxBackend`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...backend import HostOptions
from ...errors import InvalidSpec
from ...models import NetworkApprover, NetworkPolicy
from .policy import SandboxPolicy
from .session import SessionConfig

__all__ = ["SandboxMode", "SandboxOptions"]

#: How the sandbox backend runs programs: a sandbox per run, or one per workspace (``details["mode"]`` says more).
SandboxMode = Literal["per-run", "session"]


@dataclass(frozen=True, kw_only=True)
class SandboxOptions(HostOptions):
    """The shared host options (:class:`~execspace.backend.HostOptions`), and:

    Args:
        policy: what programs may touch (default: ``SandboxPolicy()``, workspace-write with the network off).
            ``Profile.DANGER_FULL_ACCESS`` runs programs WITHOUT any sandbox (like ``local``);
            ``Profile.EXTERNAL`` runs nothing (isolation is elsewhere) and keeps the file rules.
        network: shorthand for ``policy.with_network(network)``, or a :class:`~execspace.models.NetworkPolicy`: every
            run's network is that allow-list unless the run says otherwise (in session mode the session's sandbox
            has it, with one egress proxy per session); a run may still override it.
        on_network_attempt: with an allow-list, an approval flow for the destinations it does not list (async; True
            allows, anything else refuses; asked once per host and port of a run, within 120 s).
        bwrap: path of the bwrap binary (default: found on PATH).
        mode: ``"per-run"`` (a sandbox per run, the default) or ``"session"`` (one sandbox per workspace whose
            programs outlive a call; Linux, managed profiles; builds its supervisor with a C compiler once).
        session: how session mode keeps its sessions (default :class:`SessionConfig`); only with
            ``mode="session"``.
        environment: a built runtime environment (``execspace env build NAME``, docs/environments.md) to run
            programs in: its tree is bound read-only at its host path, its ``bin`` first on PATH, ``VIRTUAL_ENV``
            and its variables set; ``details["environment"]`` names it and what it holds.
    """

    policy: SandboxPolicy | None = None
    network: bool | NetworkPolicy | None = None
    on_network_attempt: NetworkApprover | None = None
    bwrap: str | None = None
    mode: SandboxMode = "per-run"
    session: SessionConfig | None = None
    environment: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.session is not None and self.mode != "session":
            raise InvalidSpec("SandboxOptions: session= configures mode='session'; give mode='session' too")
