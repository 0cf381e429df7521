"""The e2b backend's options (the ``options`` of :class:`~execspace.backends.e2b.E2BBackend`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...artifacts import ArtifactService
from ...backend import BackendOptions
from ...envpolicy import EnvPolicy
from ...errors import InvalidSpec
from ...models import NetworkPolicy
from .network import sandbox_rules

__all__ = ["E2BOptions"]


@dataclass(frozen=True, kw_only=True)
class E2BOptions(BackendOptions):
    """Where the E2B-protocol service is and how its sandboxes are made (E2B cloud, Cube Sandbox, a self-hosted
    E2B, ``execspace serve``). Unset connection options fall back to the SDK's environment variables
    (``E2B_API_KEY``, ``E2B_API_URL``, ``E2B_DOMAIN``, ``E2B_SANDBOX_URL``).

    Args:
        api_url: the control plane (``POST /v2/sandboxes``…), e.g. ``http://127.0.0.1:3000`` for ``execspace serve``.
        api_key: the service's key (sent as ``X-API-KEY``); never echoed in an error.
        domain: the sandbox domain (``<port>-<id>.<domain>`` routing), e.g. ``e2b.app`` or Cube's ``cube.app``.
        sandbox_url: one URL for every sandbox's envd (header routing), as ``execspace serve`` takes it.
        template: the template sandboxes are created from.
        sandbox_timeout: seconds a sandbox lives without being used again (each connect extends it).
        request_timeout: seconds one control-plane or file request may take before it fails.
        env_vars: environment of every process of the sandbox (given at creation).
        metadata: metadata of every sandbox we create (``execspace.*`` keys are ours).
        secure: envd access tokens (the default; off only for services that cannot issue them).
        allow_internet_access: whether programs may reach the network (off by default: secure by default).
        network: an allow-list instead: the sandbox's egress rules at creation (``allow_out`` with everything else
            denied), enforced by the service for every process of the sandbox and not audited here. Only what means
            the same there maps (domains without a port, ``*.domain``, addresses and networks with ``:*``); the rest
            is refused (``InvalidSpec``). Not with ``allow_internet_access=True``.
        persistence: ``session``: one stable sandbox per workspace id, found again by its metadata from other
            engines and after a restart (left running when the engine closes; ``cleanup`` kills it);
            ``turn``: a fresh sandbox for each ``create_workspace``, killed when the engine closes.
        sandbox_id: run every workspace in this existing sandbox; not ours, so never killed by us.
        isolation: what the service's boundary is: ``remote`` (default) or ``microvm`` when you know it runs
            each sandbox in a KVM microVM (E2B cloud, Cube Sandbox).
        env_policy: how a run's environment is built (default: core variables, secrets dropped).
        host_roots: host directories ``host://`` inputs may read from (uploaded: the sandbox never sees the host).
        artifacts: an ``ArtifactService`` for ``artifact://`` inputs and saved outputs.
        kill_grace: seconds between SIGTERM and SIGKILL when a run is killed or times out.
        code_languages: the code executor's blocks of these languages run in the template's code interpreter
            (stateful kernels, rich results under ``out/``); blocks of other languages run as programs. Names or
            aliases of python, javascript, typescript, bash, r, java. The default is what every E2B-protocol
            service's ``code-interpreter-v1`` runs, ``execspace serve`` included; E2B's and Cube's also run the others.
        pool_size: with ``persistence="turn"``, sandboxes created ahead (template, env vars and metadata as
            above, plus ``execspace.pool``) that ``create_workspace`` takes instead of waiting for a create; topped
            up in the background. Per session a sandbox is found again by the workspace named in its metadata at
            creation, so a pool cannot serve it (refused).
        pool_max_age: seconds a pooled sandbox waits before it is killed (default: half of ``sandbox_timeout``;
            must be less, so that none expires in the pool); the next ``create_workspace`` refills the pool, so
            an idle engine stops paying for sandboxes. A taken one gets a full ``sandbox_timeout`` again.
    """

    api_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    domain: str | None = None
    sandbox_url: str | None = None
    template: str = "code-interpreter-v1"
    sandbox_timeout: int = 300
    request_timeout: float = 30.0
    env_vars: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    secure: bool = True
    allow_internet_access: bool = False
    network: NetworkPolicy | None = None
    persistence: Literal["session", "turn"] = "session"
    sandbox_id: str | None = None
    isolation: Literal["remote", "microvm"] = "remote"
    env_policy: EnvPolicy | None = None
    host_roots: Sequence[Path | str] = ()
    artifacts: ArtifactService | None = None
    kill_grace: float = 2.0
    code_languages: tuple[str, ...] = ("python",)
    pool_size: int = 0
    pool_max_age: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.network is not None:
            if self.allow_internet_access:
                raise InvalidSpec(
                    "E2BOptions: network= is an allow-list and allow_internet_access=True allows everything; give one"
                )
            sandbox_rules(self.network)  # what cannot be a sandbox's rule is refused now, not at the first create
        if self.pool_size < 0:
            raise InvalidSpec(f"pool_size must be 0 or more, got {self.pool_size}")
        if self.pool_size and (self.persistence != "turn" or self.sandbox_id is not None):
            raise InvalidSpec(
                "pool_size needs persistence='turn' without sandbox_id: a per-session sandbox is found again by the "
                "workspace named in its metadata when it is created, which a pooled one cannot know"
            )
        if self.pool_max_age is not None and not 0 < self.pool_max_age < self.sandbox_timeout:
            raise InvalidSpec(
                f"pool_max_age must be more than 0 and less than sandbox_timeout ({self.sandbox_timeout} s), so that "
                "no pooled sandbox expires before it is taken"
            )

    @property
    def pool_age(self) -> float:
        """Seconds a pooled sandbox is kept."""
        return self.pool_max_age if self.pool_max_age is not None else self.sandbox_timeout / 2
