"""The keywords ``open_engine`` takes, per backend, for a type checker: each is its options class's fields as a
``TypedDict`` (PEP 692), so that ``open_engine("sandbox", netwrok=False)`` is a type error naming ``netwrok`` before
it is an ``InvalidSpec`` at run time. tests/test_open_engine_typing.py keeps each in step with its options class.

The backends' types are imported for the type checker only (from each backend's face): this floor does not import a
backend at run time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypedDict

if TYPE_CHECKING:
    from .artifacts import ArtifactService
    from .audit import AuditSink
    from .backends.jupyter import KernelMode, RichOutputLimits
    from .backends.sandbox import SandboxPolicy, SessionConfig
    from .envpolicy import EnvPolicy
    from .models import NetworkApprover, NetworkPolicy
    from .tracing import Tracer

__all__ = [
    "ContainerKeywords",
    "E2BKeywords",
    "HostKeywords",
    "JupyterKeywords",
    "LocalKeywords",
    "SandboxKeywords",
]


class HostKeywords(TypedDict, total=False):
    """:class:`~execspace.backend.HostOptions`' fields: what the default backend (``open_engine()``) takes."""

    workspace_root: Path | str | None
    env_policy: EnvPolicy | None
    host_roots: Sequence[Path | str]
    artifacts: ArtifactService | None
    kill_grace: float
    tracer: Tracer | None
    audit: AuditSink | None


class LocalKeywords(HostKeywords, total=False):
    """:class:`~execspace.backends.local.LocalOptions`' fields."""

    output_rate: int | None


class SandboxKeywords(HostKeywords, total=False):
    """:class:`~execspace.backends.sandbox.SandboxOptions`' fields."""

    policy: SandboxPolicy | None
    network: bool | NetworkPolicy | None
    on_network_attempt: NetworkApprover | None
    bwrap: str | None
    mode: Literal["per-run", "session"]
    session: SessionConfig | None
    environment: str | None
    program_binds: tuple[tuple[str, str], ...]
    system_files: tuple[tuple[str, str], ...]
    output_rate: int | None
    machine: bool
    read_views: tuple[str, ...]


class ContainerKeywords(HostKeywords, total=False):
    """:class:`~execspace.backends.container.ContainerOptions`' fields."""

    image: str | None
    docker_host: str | None
    user: tuple[int, int] | None
    memory_bytes: int
    pids: int
    cpus: float
    read_only_binds: Mapping[str, str] | None
    network: str | NetworkPolicy
    on_network_attempt: NetworkApprover | None
    pool_size: int
    reap_on_open: bool
    watchdog: bool
    languages: Sequence[str] | None
    protected: Sequence[str]
    environment: str | None


class JupyterKeywords(HostKeywords, total=False):
    """:class:`~execspace.backends.jupyter.JupyterOptions`' fields."""

    mode: KernelMode | None
    kernel_name: str
    interrupt_grace: float
    rich_outputs: RichOutputLimits | None
    environment: str | None


class E2BKeywords(TypedDict, total=False):
    """:class:`~execspace.backends.e2b.E2BOptions`' fields (a remote service: not the host options)."""

    api_url: str | None
    api_key: str | None
    domain: str | None
    sandbox_url: str | None
    template: str
    sandbox_timeout: int
    request_timeout: float
    env_vars: Mapping[str, str]
    metadata: Mapping[str, str]
    secure: bool
    allow_internet_access: bool
    network: NetworkPolicy | None
    persistence: Literal["session", "turn"]
    sandbox_id: str | None
    isolation: Literal["remote", "microvm"]
    env_policy: EnvPolicy | None
    host_roots: Sequence[Path | str]
    artifacts: ArtifactService | None
    kill_grace: float
    code_languages: tuple[str, ...]
    pool_size: int
    pool_max_age: float | None
    tracer: Tracer | None
    audit: AuditSink | None
