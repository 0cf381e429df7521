"""What ``execspace mcp`` is configured with: a TOML file, then flags over it.

::

    backend = "sandbox"            # any registered backend; default: the safest that works here
    idle_timeout = 1800            # seconds a workspace may go unused before it is removed
    max_workspaces = 16
    max_file_bytes = 10485760      # read_file / write_file / upload_file cap
    upload_roots = ["/data/in"]    # host directories upload_file may read (none by default)
    skill_roots = []               # folders of skills (skill_list / skill_run)
    artifacts_dir = "/var/lib/x"   # where save_artifact keeps versions (default: this server's memory)

    [backend_options]              # the backend's own options (open_engine keywords)
    mode = "session"

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

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import InvalidSpec
from ..models import ResourceLimits

__all__ = ["McpConfig", "PolicyConfig", "load_config"]

MiB = 1024 * 1024


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
    backend_options: Mapping[str, Any] = field(default_factory=dict)
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

    def __post_init__(self) -> None:
        for name in ("idle_timeout", "max_workspaces", "max_file_bytes", "reap_interval"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise InvalidSpec(f"mcp config: {name} must be a positive number, got {value!r}")
        if "host_roots" in self.backend_options:
            raise InvalidSpec("mcp config: set upload_roots and skill_roots, not backend_options.host_roots")
        self.policy.limits()  # a bad limit fails at start, not on the first call
        if not 0 < self.policy.timeout <= self.policy.max_timeout:
            raise InvalidSpec("mcp config: policy.timeout must be positive and at most policy.max_timeout")

    def with_flags(self, *, backend: str | None) -> McpConfig:
        """The flags given on the command line over the file's values."""
        return replace(self, backend=backend) if backend is not None else self


_TOP = {f.name for f in fields(McpConfig)} - {"policy", "reap_interval"}
_POLICY = {f.name for f in fields(PolicyConfig)}


def load_config(path: Path | str | None) -> McpConfig:
    """The configuration in the TOML file ``path`` (``None``: the defaults).

    Raises:
        InvalidSpec: the file is missing, is not TOML, or has an unknown key or a value of the wrong type.
    """
    if path is None:
        return McpConfig()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise InvalidSpec(f"cannot read the mcp config {str(path)!r}: {exc.strerror}; check the path") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidSpec(f"the mcp config {str(path)!r} is not valid TOML: {exc}") from None
    return _from_mapping(data, str(path))


def _from_mapping(data: Mapping[str, Any], where: str) -> McpConfig:
    unknown = set(data) - _TOP - {"policy"}
    if unknown:
        raise InvalidSpec(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_TOP | {'policy'})}")
    policy = data.get("policy", {})
    if not isinstance(policy, Mapping):
        raise InvalidSpec(f"{where}: [policy] must be a table")
    unknown = set(policy) - _POLICY
    if unknown:
        raise InvalidSpec(f"{where}: unknown key(s) {sorted(unknown)} in [policy]; known: {sorted(_POLICY)}")
    try:
        return McpConfig(
            backend=_typed(data, "backend", str, None),
            backend_options=dict(_typed(data, "backend_options", dict, {})),
            policy=_policy(policy),
            idle_timeout=_typed(data, "idle_timeout", (int, float), 1800),
            max_workspaces=_typed(data, "max_workspaces", int, 16),
            max_file_bytes=_typed(data, "max_file_bytes", int, 10 * MiB),
            upload_roots=_paths(data, "upload_roots"),
            skill_roots=_paths(data, "skill_roots"),
            artifacts_dir=Path(_typed(data, "artifacts_dir", str, "")) if "artifacts_dir" in data else None,
        )
    except InvalidSpec as exc:
        raise InvalidSpec(f"{where}: {exc}") from None


def _policy(data: Mapping[str, Any]) -> PolicyConfig:
    allow = data.get("allow_commands")
    if allow is not None and (not isinstance(allow, list) or not all(isinstance(a, str) for a in allow)):
        raise InvalidSpec("policy.allow_commands must be a list of program names")
    return PolicyConfig(
        network=_typed(data, "network", bool, None),
        allow_commands=tuple(allow) if allow is not None else None,
        timeout=_typed(data, "timeout", (int, float), 300),
        max_timeout=_typed(data, "max_timeout", (int, float), 3600),
        memory_bytes=_typed(data, "memory_bytes", int, None),
        pids=_typed(data, "pids", int, None),
        cpu_seconds=_typed(data, "cpu_seconds", (int, float), None),
        file_size_bytes=_typed(data, "file_size_bytes", int, None),
    )


def _typed(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    if key not in data:
        return default
    value = data[key]
    wrong_bool = isinstance(value, bool) and kind is not bool
    if wrong_bool or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InvalidSpec(f"{key} must be of type {names}, got {value!r}")
    return value


def _paths(data: Mapping[str, Any], key: str) -> tuple[Path, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise InvalidSpec(f"{key} must be a list of directory paths")
    return tuple(Path(v) for v in value)
