"""What a backend really enforces, and the fail-closed check against a request."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal

from .errors import CapabilityError
from .models import NetworkPolicy, RunProgramSpec

__all__ = ["LIMIT_NAMES", "Capabilities", "Isolation", "KernelCapabilities"]

#: Every limit name a backend may declare in ``Capabilities.enforced_limits``.
LIMIT_NAMES = frozenset(
    {"timeout", "memory_bytes", "pids", "cpu_seconds", "file_size_bytes", "output_bytes", "disk_bytes"}
)


class Isolation(enum.StrEnum):
    """The boundary between the program and the host."""

    NONE = "none"
    """Runs as the caller on the host: no boundary at all."""
    PROCESS = "process"
    """OS sandbox (namespaces, seccomp, Seatbelt) around a host process."""
    CONTAINER = "container"
    MICROVM = "microvm"
    REMOTE = "remote"
    """Runs on another machine; the host is out of reach, the remote's own boundary applies."""


@dataclass(frozen=True, slots=True)
class KernelCapabilities:
    """What an engine's stateful kernels (``engine.kernels``) offer: one kernel per workspace, whose
    interpreter state lives across cells until the kernel is restarted (a timeout, a crash)."""

    languages: tuple[str, ...]
    """Code-block languages the kernels run (others go to programs)."""
    isolation: Isolation
    """Where the kernels run: ``none`` (this host, as the caller), ``process`` (the OS sandbox), ``remote``
    (a Jupyter server's kernels: its own boundary applies, nothing of theirs runs on this host)."""
    cell_limits: frozenset[str]
    """Subset of :data:`LIMIT_NAMES` a cell gets (``timeout`` interrupts, then restarts the kernel)."""
    kernel_limits: frozenset[str] = frozenset()
    """Limits of each kernel as a whole, for its lifetime (not per cell)."""
    network_control: bool = False
    """The kernels' network can be turned off (when the engine opens, not per cell)."""
    rich_output_files: int | None = None
    """Most rich-output files one cell may leave under ``out/`` (None: not capped here)."""
    rich_output_bytes: int | None = None
    """Most decoded bytes of rich output one cell may leave (None: not capped here)."""
    warm_pool: int = 0
    """Kernels started ahead for the next new workspaces."""

    def as_dict(self) -> dict[str, object]:
        return {
            "languages": list(self.languages),
            "isolation": str(self.isolation),
            "cell_limits": sorted(self.cell_limits),
            "kernel_limits": sorted(self.kernel_limits),
            "network_control": self.network_control,
            "rich_output_files": self.rich_output_files,
            "rich_output_bytes": self.rich_output_bytes,
            "warm_pool": self.warm_pool,
        }


@dataclass(frozen=True, slots=True)
class Capabilities:
    """An honest statement of what one backend enforces on this host.

    Upper layers check a request against it with :meth:`require` before doing
    anything; nothing here is aspirational.
    """

    backend: str
    isolation: Isolation
    network_control: bool
    """The backend can turn the network off for a run."""
    network_default: bool
    """Whether runs reach the network when the caller does not say."""
    clean_env: bool
    """Runs can start from an empty environment (``clean_env=True`` honoured)."""
    read_only_mounts: bool
    """Staged directories can be made read-only to the program."""
    streaming: bool
    """``start_program`` streams output as it comes and accepts stdin."""
    programs: bool = True
    """The runner runs programs. False: ``run_program`` and ``start_program`` raise ``CapabilityError`` and code runs
    only in the engine's kernels (a remote Jupyter server's workspaces)."""
    binary_output: bool = True
    """A program's stdout and stderr arrive byte for byte (``raw_stdout``, ``raw_stderr``, streamed chunks). False:
    they arrive as text, and bytes that are not UTF-8 come as U+FFFD (a remote service whose SDK decodes them):
    binary output belongs in a file there, which the file API moves byte for byte."""
    pty: bool = False
    """``start_program`` runs a program on a pseudo-terminal when the spec asks (``spec.pty``)."""
    network_domains: bool = False
    """Runs may ask for a :class:`~.models.NetworkPolicy` allow-list (``network_control`` is then "domains", not
    only on/off): an egress proxy outside the boundary is the program's only way out."""
    persistent_state: bool = False
    """Interpreter state (variables, imports) persists between code executions."""
    host_paths: bool = False
    """Workspaces are host directories the caller can open."""
    enforced_limits: frozenset[str] = frozenset()
    """Subset of :data:`LIMIT_NAMES` that the backend applies when asked."""
    max_disk_bytes: int | None = None
    """Default disk cap per workspace, when the backend enforces one."""
    languages: tuple[str, ...] = ()
    """Code-block languages with a runtime on this backend."""
    does_not_protect: tuple[str, ...] = ()
    """Plain statements of what this backend does not protect against."""
    kernels: KernelCapabilities | None = None
    """The engine's stateful kernels (``engine.kernels``), or None when it has none."""
    environments: bool = False
    """Runs may name their own runtime environment (``RunProgramSpec.environment``), over the engine's."""
    fork: Literal["cow", "copy"] | None = None
    """How its manager forks and snapshots workspace files (:class:`~execspace.protocols.SupportsSnapshots`):
    ``cow`` shares unchanged files, ``copy`` copies them all; None: it cannot."""
    users: tuple[str, ...] = ()
    """The users a run may name (``RunProgramSpec.user``): a machine sandbox's ``user`` and ``root``."""
    absolute_paths: Literal["workspace", "cwd", "view"] = "workspace"
    """Which absolute paths a run's ``cwd`` and the file API take beyond ``ws.path`` and its program binds:
    ``workspace``, none (``PathDenied``); ``cwd``, a cwd anywhere the program may go (a program of the host:
    ``local``), the file API staying in the workspace; ``view``, both, anywhere in the program's view and with its
    permissions (the sandbox: its system directories, its grants; ``read_file``, ``put_files``, ``stat``,
    ``exists``, ``list_dir``, ``make_dir`` and ``remove``)."""
    details: dict[str, str] = field(default_factory=dict)
    """Backend-specific facts (versions, mode), for display only."""

    def require(self, spec: RunProgramSpec) -> None:
        """Raise :class:`CapabilityError` if ``spec`` asks for something this backend cannot enforce."""
        missing = sorted(spec.limits.requested() - self.enforced_limits)
        if missing:
            raise CapabilityError(
                f"resource limit(s) {', '.join(missing)}",
                self.backend,
                "Drop the limit, or use a backend that enforces it (see `execspace doctor`).",
            )
        if spec.timeout is not None and "timeout" not in self.enforced_limits:
            raise CapabilityError("a timeout", self.backend, "Set timeout=None or choose another backend.")
        if spec.clean_env and not self.clean_env:
            raise CapabilityError("a clean environment", self.backend)
        if spec.environment is not None and not self.environments:
            raise CapabilityError(
                f"a runtime environment per run (environment={spec.environment!r})",
                self.backend,
                "Open the engine in the environment (environment= of its options, where it takes one), or use the "
                "sandbox backend on Linux, whose runs may each name one.",
            )
        if spec.user is not None and spec.user not in self.users:
            raise CapabilityError(
                f"running as {spec.user!r}",
                self.backend,
                f"Leave user unset{f' or name one of {list(self.users)}' if self.users else ''}; a machine sandbox "
                "(the sandbox backend's machine=True, as root) runs as 'user' or 'root'.",
            )
        if spec.pty is not None and not self.pty:
            raise CapabilityError("a pseudo-terminal", self.backend, "Run without a pty, or see `execspace doctor`.")
        if spec.network == "off" and not self.network_control:
            raise CapabilityError(
                "network off",
                self.backend,
                "Use the sandbox or container backend, or allow the network explicitly (network='on').",
            )
        if isinstance(spec.network, NetworkPolicy) and not self.network_domains:
            raise CapabilityError(
                "a network allow-list (NetworkPolicy)",
                self.backend,
                "Use the sandbox backend (per-run or session mode) or the container backend as root, or choose "
                "network='off' or 'on'.",
            )

    def as_dict(self) -> dict[str, object]:
        return {
            "backend": self.backend,
            "isolation": str(self.isolation),
            "network_control": self.network_control,
            "network_default": self.network_default,
            "network_domains": self.network_domains,
            "clean_env": self.clean_env,
            "read_only_mounts": self.read_only_mounts,
            "streaming": self.streaming,
            "binary_output": self.binary_output,
            "pty": self.pty,
            "persistent_state": self.persistent_state,
            "host_paths": self.host_paths,
            "enforced_limits": sorted(self.enforced_limits),
            "max_disk_bytes": self.max_disk_bytes,
            "languages": list(self.languages),
            "does_not_protect": list(self.does_not_protect),
            "kernels": None if self.kernels is None else self.kernels.as_dict(),
            "environments": self.environments,
            "fork": self.fork,
            "users": list(self.users),
            "absolute_paths": self.absolute_paths,
            "details": dict(self.details),
        }
