"""The control plane's request bodies as typed values: each JSON object (read with its bound, bodies.py) is parsed
once into a frozen dataclass, and a field of the wrong type or out of range is a :class:`BadRequest` (400) in E2B's
words, before the handler does anything. What depends on the server's state (a template or snapshot that exists,
what the backend can do, the network rules, parsed by network.py) is the handler's."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

__all__ = [
    "MAX_FORKS",
    "BadRequest",
    "ConnectBody",
    "CreateBody",
    "ForkBody",
    "NetworkBody",
    "PauseBody",
    "SnapshotBody",
    "TimeoutBody",
    "Timeouts",
]

#: Forks one request may ask for (the SDK sends 1..20; the manager makes up to 100).
MAX_FORKS = 100


class BadRequest(Exception):
    """A request body or query the control plane cannot take (answered 400)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """A sandbox's lifetime when a request names none, and the most one may ask for (the server's options)."""

    default: int
    maximum: int

    def of(self, value: object) -> int:
        """``value`` as a sandbox's lifetime in seconds: 0 ends it (or pauses it, with auto-pause) now, as E2B's."""
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRequest(f"timeout must be a whole number of seconds, 0 or more, got {value!r}")
        if value > self.maximum:
            raise BadRequest(f"timeout {value}s is above this server's maximum of {self.maximum}s")
        return value


@dataclass(frozen=True, slots=True)
class CreateBody:
    """``POST /sandboxes`` (v1) and ``POST /v2/sandboxes``."""

    template: str
    """A template's name or a snapshot's id or name: which one, if either, is for the handler to find."""
    timeout: int
    metadata: Mapping[str, str] = field(default_factory=dict)
    env_vars: Mapping[str, str] = field(default_factory=dict)
    secure: bool = True
    auto_pause: bool = False
    auto_resume: bool = False
    files_only_pause: bool = False
    """``autoPauseMemory: false``: a pause that keeps the files but not the processes."""
    allow_internet_access: bool | None = None
    network: Mapping[str, object] | None = None

    @classmethod
    def parse(
        cls, body: Mapping[str, object], *, v1: bool, templates: Collection[str], timeouts: Timeouts
    ) -> CreateBody:
        template = body.get("templateID")
        if not isinstance(template, str):
            raise BadRequest(f"templateID must be one of {', '.join(templates)} or a snapshot id, got {template!r}")
        auto_pause, auto_resume = _auto_pause(body)
        return cls(
            template=template,
            timeout=timeouts.of(body.get("timeout", timeouts.default)),
            metadata=_strings(body.get("metadata"), "metadata"),
            env_vars=_strings(body.get("envVars"), "envVars"),
            secure=bool(body.get("secure", True)) if v1 else True,  # v2 sandboxes are always secured
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            files_only_pause=body.get("autoPauseMemory") is False,
            allow_internet_access=_internet(body.get("allow_internet_access")),
            network=_network(body.get("network")),
        )


@dataclass(frozen=True, slots=True)
class NetworkBody:
    """``PUT /sandboxes/{id}/network``: the sandbox's egress rules as a whole (what it leaves out is cleared)."""

    allow_internet_access: bool | None
    network: Mapping[str, object]
    """The rest of the body: ``allowOut``, ``denyOut``…, as a create's ``network``."""

    @classmethod
    def parse(cls, body: Mapping[str, object]) -> NetworkBody:
        rules = {k: v for k, v in body.items() if k != "allow_internet_access"}
        return cls(_internet(body.get("allow_internet_access")), rules)


@dataclass(frozen=True, slots=True)
class ConnectBody:
    """``POST /sandboxes/{id}/connect`` (v1 and v2) and the older ``/resume``."""

    timeout: int | None = None
    """None: a resumed sandbox keeps the lifetime it had left, a running one's is not extended."""
    files_only: bool = False
    """``memory: false``: a resume from the files alone (a reboot)."""

    @classmethod
    def parse(cls, body: Mapping[str, object], timeouts: Timeouts) -> ConnectBody:
        timeout = timeouts.of(body["timeout"]) if "timeout" in body else None
        return cls(timeout, files_only=body.get("memory") is False)


@dataclass(frozen=True, slots=True)
class TimeoutBody:
    """``POST /sandboxes/{id}/timeout``."""

    timeout: int

    @classmethod
    def parse(cls, body: Mapping[str, object], timeouts: Timeouts) -> TimeoutBody:
        return cls(timeouts.of(body.get("timeout")))


@dataclass(frozen=True, slots=True)
class PauseBody:
    """``POST /sandboxes/{id}/pause``."""

    files_only: bool = False
    """``memory: false``: a pause that keeps the files but not the processes."""

    @classmethod
    def parse(cls, body: Mapping[str, object]) -> PauseBody:
        return cls(files_only=body.get("memory") is False)


@dataclass(frozen=True, slots=True)
class SnapshotBody:
    """``POST /sandboxes/{id}/snapshots``."""

    name: str | None = None
    memory: bool = False
    """A snapshot of the processes too (refused: files only here)."""

    @classmethod
    def parse(cls, body: Mapping[str, object]) -> SnapshotBody:
        name = body.get("name")
        if name is not None and not isinstance(name, str):
            raise BadRequest(f"name must be a string, got {name!r}")
        return cls(name, memory=bool(body.get("memory")))


@dataclass(frozen=True, slots=True)
class ForkBody:
    """``POST /sandboxes/{id}/fork``."""

    count: int
    timeout: int

    @classmethod
    def parse(cls, body: Mapping[str, object], timeouts: Timeouts) -> ForkBody:
        count = body.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise BadRequest(f"count must be an integer from 1 to {MAX_FORKS}, got {count!r}")
        return cls(count, timeouts.of(body.get("timeout", timeouts.default)))


def _auto_pause(body: Mapping[str, object]) -> tuple[bool, bool]:
    """``autoPause`` (a boolean) and ``autoResume`` (``{"enabled": bool}``) of a create body."""
    auto_pause, auto_resume = body.get("autoPause", False), body.get("autoResume") or {}
    if not isinstance(auto_pause, bool):
        raise BadRequest(f"autoPause must be a boolean, got {auto_pause!r}")
    enabled = auto_resume.get("enabled", False) if isinstance(auto_resume, dict) else None
    if not isinstance(enabled, bool):
        raise BadRequest(f'autoResume must be {{"enabled": <boolean>}}, got {body.get("autoResume")!r}')
    return auto_pause, enabled


def _internet(value: object) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise BadRequest("allow_internet_access must be a boolean")
    return value


def _network(value: object) -> Mapping[str, object] | None:
    if value is not None and not isinstance(value, dict):
        raise BadRequest("network must be an object (allowOut, denyOut, ...)")
    return value


def _strings(value: object, name: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise BadRequest(f"{name} must be an object of strings")
    return dict(value)
