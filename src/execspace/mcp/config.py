"""What ``execspace mcp`` is configured with: a TOML file, then flags over it.

::

    backend = "sandbox"            # any registered backend; default: the safest that works here
    idle_timeout = 1800            # seconds a workspace may go unused before it is removed
    max_workspaces = 16
    max_file_bytes = 10485760      # read_file / write_file / upload_file cap
    upload_roots = ["/data/in"]    # host directories upload_file may read (none by default)
    skill_roots = []               # folders of skills (skill_list / skill_run)
    artifacts_dir = "/var/lib/x"   # where save_artifact keeps versions (default: this server's memory)
    reap_interval = 5              # seconds between looks for idle workspaces
    task_after = 10                # mcp 2.x, 2026-07-28: a call running this long becomes a Task (Tasks clients)
    task_ttl = 3600                # seconds a Task is kept from its creation once its call has ended

    [backend_options]              # the backend's own options (open_engine keywords)
    mode = "session"               # sandbox: a session per workspace; jupyter: "sandboxed" (default), "host", "auto"
    environment = "code-interpreter"   # sandbox, jupyter, container: run in a built runtime environment

    [policy]
    network = false                # the backend's network switch (sandbox: off by default)
    allow_commands = ["python3", "ls"]   # a command policy for workspace_exec (default: any command line)
    timeout = 300                  # a command's default deadline, seconds
    max_timeout = 3600
    memory_bytes = 1073741824      # per-run resource limits (the backend must enforce them)
    pids = 256
    cpu_seconds = 600
    file_size_bytes = 1073741824
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import tomlconfig
from ..errors import InvalidSpec
from ..models import ResourceLimits

__all__ = ["McpConfig", "PolicyConfig", "load_config"]

MiB = 1024 * 1024
#: The backends that run in a runtime environment (their ``environment`` option).
ENVIRONMENT_BACKENDS = ("sandbox", "jupyter", "container")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """What every run may do: the network, a command policy, deadlines and resource limits."""

    network: bool | None = None
    """The backend's network switch (``None``: the backend's default; the sandbox's is off)."""
    allow_commands: tuple[str, ...] | None = None
    """An allow list of programs for ``workspace_exec`` (``None``: any command line)."""
    timeout: float = 300
    max_timeout: float = 3600
    memory_bytes: int | None = None
    pids: int | None = None
    cpu_seconds: float | None = None
    file_size_bytes: int | None = None

    def limits(self) -> ResourceLimits:
        return ResourceLimits(
            memory_bytes=self.memory_bytes,
            pids=self.pids,
            cpu_seconds=self.cpu_seconds,
            file_size_bytes=self.file_size_bytes,
        )


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The MCP server's settings (see the module docstring for the TOML file)."""

    backend: str | None = None
    backend_options: Mapping[str, object] = field(default_factory=dict)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    idle_timeout: float = 1800
    """Seconds a workspace may go unused (no tool call, no background program) before it is removed."""
    max_workspaces: int = 16
    max_file_bytes: int = 10 * MiB
    """Largest file read_file returns, write_file writes or upload_file copies."""
    upload_roots: tuple[Path, ...] = ()
    skill_roots: tuple[Path, ...] = ()
    artifacts_dir: Path | None = None
    reap_interval: float = 5.0
    """Seconds between looks for workspaces gone idle."""
    task_after: float = 10.0
    """Seconds a tool call may run before it answers with a Task, for a client that declared the Tasks extension
    (``mcp`` 2.x, revision 2026-07-28); it keeps running, and ``tasks/get`` gives its result."""
    task_ttl: float = 3600.0
    """Seconds a Task is kept (from its creation) once its call has ended."""

    def __post_init__(self) -> None:
        for name in ("idle_timeout", "max_workspaces", "max_file_bytes", "reap_interval", "task_after", "task_ttl"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidSpec(f"{name} must be a positive number, got {value!r}")
        if "host_roots" in self.backend_options:
            raise InvalidSpec("set upload_roots and skill_roots, not backend_options.host_roots")
        self.policy.limits()  # a bad limit fails at start, not on the first call
        if not 0 < self.policy.timeout <= self.policy.max_timeout:
            raise InvalidSpec("policy.timeout must be positive and at most policy.max_timeout")

    def with_flags(self, *, backend: str | None, environment: str | None = None) -> McpConfig:
        """The flags given on the command line over the file's values: ``environment`` (a built runtime environment)
        goes to the backend's options, and picks the sandbox when no backend is named.

        Raises:
            InvalidSpec: ``environment`` with a backend that takes none.
        """
        config = replace(self, backend=backend) if backend is not None else self
        if environment is None:
            return config
        chosen = config.backend or "sandbox"
        if chosen not in ENVIRONMENT_BACKENDS:
            raise InvalidSpec(
                f"--environment belongs to the {', '.join(ENVIRONMENT_BACKENDS)} backends, not {chosen!r}: "
                "drop one of them"
            )
        return replace(config, backend=chosen, backend_options={**config.backend_options, "environment": environment})


def load_config(path: Path | str | None) -> McpConfig:
    """The configuration in the TOML file ``path`` (``None``: the defaults).

    Raises:
        InvalidSpec: the file is missing, is not TOML, or has an unknown key or a value of the wrong type.
    """
    if path is None:
        return McpConfig()
    return tomlconfig.load(McpConfig, Path(path), f"the mcp config {path}")
