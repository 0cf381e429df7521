"""Typed values that cross the Engine seam.

All models are frozen dataclasses with snake_case fields. Sizes are bytes, durations
seconds (floats); ``None`` means "no limit" / "not set", never ``0``.
"""

from __future__ import annotations

import enum
import ipaddress
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .errors import ExecutionTimeout, InvalidSpec, ProgramFailed

__all__ = [
    "DEFAULT_MAX_FILES",
    "DEFAULT_MAX_FILE_BYTES",
    "DEFAULT_MAX_TOTAL_BYTES",
    "DEFAULT_OUTPUT_BYTES",
    "DEFAULT_TIMEOUT",
    "BlockResult",
    "CellResult",
    "CodeBlock",
    "CodeExecutionInput",
    "CodeExecutionResult",
    "File",
    "FileEntry",
    "FileKind",
    "FileRef",
    "HeaderInjection",
    "InputSpec",
    "NetworkApprover",
    "NetworkAttempt",
    "NetworkPolicy",
    "OutputChunk",
    "OutputManifest",
    "OutputSpec",
    "Persistence",
    "ProgramInfo",
    "PtySize",
    "PutFile",
    "ResourceLimits",
    "RunProgramSpec",
    "RunResult",
    "Secret",
    "Snapshot",
    "Workspace",
    "WorkspacePolicy",
]

#: Default wall-clock deadline of one run, in seconds.
DEFAULT_TIMEOUT = 60.0
#: Default bytes kept per output stream (head + tail); the rest is counted and dropped.
DEFAULT_OUTPUT_BYTES = 1024 * 1024
#: Default caps on collection: files, bytes per file, bytes in all.
DEFAULT_MAX_FILES = 100
DEFAULT_MAX_FILE_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_TOTAL_BYTES = 64 * 1024 * 1024


def _positive(name: str, value: float | None) -> None:
    if value is not None and value <= 0:
        raise InvalidSpec(f"{name} must be positive or None (no limit), got {value!r}")


@dataclass(frozen=True, slots=True)
class ResourceLimits:
    """Per-run resource limits. ``None`` leaves a resource unlimited.

    A backend that cannot enforce a limit that is set raises
    :class:`~execspace.errors.CapabilityError` instead of running without it.
    """

    memory_bytes: int | None = None
    """Memory the program may use (address space or cgroup memory, per backend)."""
    pids: int | None = None
    """Processes/threads the program may have at once (fork bombs stop here)."""
    cpu_seconds: float | None = None
    """CPU time, summed over the program's processes where the backend can."""
    cpus: float | None = None
    """CPU bandwidth of the whole run, in CPUs (``0.5``: half of one CPU's time per wall second, ``2``: two CPUs'),
    every process together: a cgroup CPU quota where the backend has one. The run is throttled, not killed."""
    file_size_bytes: int | None = None
    """Largest file the program may write."""
    output_bytes: int | None = DEFAULT_OUTPUT_BYTES
    """Bytes kept per output stream: the first and last halves; the middle is dropped and counted."""

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "pids", "cpu_seconds", "cpus", "file_size_bytes", "output_bytes"):
            _positive(name, getattr(self, name))

    def requested(self) -> frozenset[str]:
        """Names of the limits that are set (the ones a backend must enforce)."""
        names = ("memory_bytes", "pids", "cpu_seconds", "cpus", "file_size_bytes", "output_bytes")
        return frozenset(n for n in names if getattr(self, n) is not None)


@dataclass(frozen=True, slots=True)
class PtySize:
    """A terminal's size in character cells."""

    rows: int = 24
    cols: int = 80

    def __post_init__(self) -> None:
        for name in ("rows", "cols"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 < value <= 10_000:
                raise InvalidSpec(f"pty {name} must be an integer from 1 to 10000, got {value!r}")


_LABEL = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?")


def _host_port(entry: str, what: str) -> tuple[str, int | None]:
    """``entry`` (``name``, ``*.suffix``, ``*``, an address or network, each with an optional ``:port`` or ``:*``;
    IPv6 in brackets) as a normalised (host, port; 0 for every port)."""
    text = entry.strip().lower()
    port: int | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest:
            if not rest.startswith(":"):
                raise InvalidSpec(f"{what} {entry!r}: write an IPv6 address as [ADDR] or [ADDR]:PORT")
            port = _port(rest[1:], entry, what)
    elif text.count(":") == 1:
        host, _, digits = text.partition(":")
        port = _port(digits, entry, what)
    else:
        host = text
    host = host.rstrip(".")
    if "/" in host:
        try:
            ipaddress.ip_network(host, strict=False)
        except ValueError:
            raise InvalidSpec(f"{what} {entry!r}: a network is ADDR/PREFIX, e.g. 10.0.0.0/8 or [fd00::/8]") from None
    elif _address(host) is None and host != "*":
        labels = host.removeprefix("*.").split(".")
        if not host or not all(_LABEL.fullmatch(label) for label in labels) or len(host) > 253:
            raise InvalidSpec(
                f"{what} {entry!r} is not a domain name (example.com), a wildcard (*.example.com), an address or "
                "a network (10.0.0.0/8), each with an optional :PORT"
            )
    return host, port


def _port(digits: str, entry: str, what: str) -> int:
    """The port ``digits`` names; 0 for ``*`` (every port)."""
    if digits == "*":
        return 0
    if not digits.isdigit() or not 0 < int(digits) < 65536:
        raise InvalidSpec(f"{what} {entry!r}: the port must be a number from 1 to 65535, or * for every port")
    return int(digits)


def _allows_host(entry: str, host: str) -> bool:
    """Whether the allow entry ``entry`` lets some port of ``host`` (a name or ``*.suffix``) through."""
    allowed, _ = _host_port(entry, "allowed network entry")
    if allowed == "*":
        return True
    if allowed.startswith("*."):
        return host.removeprefix("*").endswith(allowed[1:])
    return allowed == host


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


class Secret:
    """A credential's value, kept out of every text: its ``repr`` and ``str`` name where it came from, never what
    it is. Read it with :meth:`reveal` (the egress proxy does, to add it to a request). Not a dataclass, so that
    ``dataclasses.asdict`` of a policy holding one copies the object, never the value into a dict."""

    __slots__ = ("_source", "_value")
    _value: str
    _source: str

    def __init__(self, value: str, source: str = "given") -> None:
        if not isinstance(value, str) or not isinstance(source, str):
            raise InvalidSpec("Secret(value, source): both are strings")
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "_source", source)

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str] | None = None) -> Secret:
        """The value of the environment variable ``name`` (of ``environ``, else this process's); raises
        :class:`InvalidSpec` naming the variable when it is unset or empty."""
        value = (os.environ if environ is None else environ).get(name)
        if not value:
            raise InvalidSpec(f"the environment variable {name} is not set (or empty): export it before this call")
        return cls(value, f"env:{name}")

    @property
    def source(self) -> str:
        """Where the value came from (``env:VAR``), for messages."""
        return self._source

    def reveal(self) -> str:
        return self._value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("a Secret cannot be changed")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and (self._value, self._source) == (other._value, other._source)

    def __hash__(self) -> int:
        return hash((Secret, self._value, self._source))

    def __reduce__(self) -> tuple[type[Secret], tuple[str, str]]:
        return Secret, (self._value, self._source)

    def __repr__(self) -> str:
        return f"Secret(<{self._source}>)"

    __str__ = __repr__


#: Header names the proxy owns (framing, routing, hop-by-hop): an injection rule cannot set them.
_PROXY_OWNED_HEADERS = frozenset(
    {
        "host",
        "connection",
        "content-length",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "keep-alive",
        "expect",
        "proxy-authorization",
        "proxy-connection",
        "proxy-authenticate",
    }
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


@dataclass(frozen=True, slots=True)
class HeaderInjection:
    """A header the egress proxy adds to every request to ``host`` (replacing the program's own header of that
    name), with a value the program never sees.

    ``host`` is a name (``api.example.com``) or ``*.suffix`` (its subdomains at any depth, not the name itself); a
    name's exact rules win over wildcard ones, and of those the longest suffix wins (rules of one host are not merged
    with another's). The host must also be allowed by the policy. Over HTTPS the proxy terminates the program's TLS
    for such a host (the sandbox trusts a CA made for it), so the program's client must trust that CA.
    """

    host: str
    header: str
    value: Secret

    def __post_init__(self) -> None:
        host = self.host.strip().lower().rstrip(".")
        labels = host.removeprefix("*.").split(".")
        if (
            not host
            or ":" in host
            or _address(host) is not None
            or len(host) > 253
            or not all(_LABEL.fullmatch(label) for label in labels)
        ):
            raise InvalidSpec(
                f"header injection host {self.host!r}: give a domain name (api.example.com) or *.suffix, no port "
                "and no address"
            )
        object.__setattr__(self, "host", host)
        if not _TOKEN.fullmatch(self.header):
            raise InvalidSpec(f"header injection for {host}: {self.header!r} is not an HTTP header name")
        if self.header.lower() in _PROXY_OWNED_HEADERS:
            raise InvalidSpec(f"header injection for {host}: the proxy owns {self.header}; inject another header")
        if not isinstance(self.value, Secret):
            raise InvalidSpec(f"header injection {host}:{self.header}: the value must be a Secret (Secret(value))")
        value = self.value.reveal()
        # the message never quotes the value: it is the secret
        if not value or value != value.strip(" \t") or any((c < " " and c != "\t") or c == "\x7f" for c in value):
            raise InvalidSpec(
                f"header injection {host}:{self.header}: the value ({self.value.source}) is empty, has leading or "
                "trailing whitespace, or holds a control character (CR, LF, NUL…)"
            )
        try:
            value.encode("latin-1")
        except UnicodeEncodeError:
            raise InvalidSpec(
                f"header injection {host}:{self.header}: the value ({self.value.source}) is not Latin-1 text"
            ) from None

    def covers(self, host: str) -> bool:
        """Whether this rule's host pattern names ``host`` (a lower-case name)."""
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """A run's network as an allow-list of destinations, enforced by a proxy outside the sandbox: the program
    reaches nothing else (no DNS, no other socket). Make one with :meth:`allow`.

    Entries are ``example.com`` (that name only), ``*.example.com`` (its subdomains, not the name itself), ``*``
    (every name and address: the public internet, as the address check below still applies), an address or a
    network (``10.0.0.0/8``; IPv6 in brackets: ``[fd00::/8]``), each with an optional ``:PORT`` or ``:*`` for
    every port (without one: ports 80 and 443). An address or network entry matches a program that
    names an address; a denied one also refuses a name that resolves into it. A ``denied`` entry wins over every
    allowed one; without a port it denies every port. A name allowed here still may not resolve to a loopback,
    private, link-local or metadata address unless the address is pinned in ``resolve`` or allowed as an entry.
    """

    allowed: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    resolve: Mapping[str, str] = field(default_factory=dict)
    """Names pinned to an address (the proxy does not look them up); a pinned address counts as allowed."""
    inject: tuple[HeaderInjection, ...] = ()
    """Headers the proxy adds to requests to allowed hosts (credentials the program never sees): plain HTTP as it
    forwards it, HTTPS by terminating TLS for those hosts only (see :class:`HeaderInjection`)."""
    upstream_ca: Path | None = None
    """A PEM file of the CA certificates an injected host's server must chain to (default: this host's trust
    store). Only injected hosts are verified by the proxy; every other host's TLS is the program's own."""

    @classmethod
    def allow(
        cls,
        domains: Sequence[str],
        *,
        deny: Sequence[str] = (),
        resolve: Mapping[str, str] | None = None,
        inject: Sequence[HeaderInjection] = (),
        upstream_ca: Path | None = None,
    ) -> NetworkPolicy:
        """``NetworkPolicy.allow(["pypi.org", "*.pythonhosted.org", "api.example.com:8443"], deny=[...])``."""
        return cls(tuple(domains), tuple(deny), dict(resolve or {}), tuple(inject), upstream_ca)

    def __post_init__(self) -> None:
        if isinstance(self.allowed, str) or isinstance(self.denied, str):
            raise InvalidSpec("NetworkPolicy: allowed and denied are sequences of entries, not one string")
        for entry in self.allowed:
            _host_port(entry, "allowed network entry")
        for entry in self.denied:
            _host_port(entry, "denied network entry")
        for name, addr in self.resolve.items():
            host, port = _host_port(name, "resolved name")
            if port is not None or host.startswith("*."):
                raise InvalidSpec(f"resolve {name!r}: pin a plain name (no port, no wildcard)")
            if _address(addr.strip().strip("[]")) is None:
                raise InvalidSpec(f"resolve {name!r}={addr!r}: the target must be an IPv4 or IPv6 address")
        if isinstance(self.inject, HeaderInjection) or not all(isinstance(r, HeaderInjection) for r in self.inject):
            raise InvalidSpec("NetworkPolicy: inject is a sequence of HeaderInjection rules")
        object.__setattr__(self, "inject", tuple(self.inject))
        seen: set[tuple[str, str]] = set()
        for rule in self.inject:
            key = (rule.host, rule.header.lower())
            if key in seen:
                raise InvalidSpec(f"NetworkPolicy: two injection rules set {rule.header} for {rule.host}")
            seen.add(key)
            if not any(_allows_host(entry, rule.host) for entry in self.allowed):
                raise InvalidSpec(
                    f"NetworkPolicy: the injection rule for {rule.host} names a host the policy does not allow: "
                    "add it to the allowed entries"
                )
        if self.upstream_ca is not None and not isinstance(self.upstream_ca, Path):
            raise InvalidSpec("NetworkPolicy: upstream_ca is a Path to a PEM file of CA certificates")


@dataclass(frozen=True, slots=True)
class NetworkAttempt:
    """One connection a program asked the egress proxy for, and what became of it."""

    run_id: str
    time: float
    """When it was asked, in seconds since the epoch."""
    host: str
    """The name (or address) the program asked for."""
    port: int
    protocol: Literal["connect", "http", "socks5", "unknown"]
    """How it asked: HTTP CONNECT, plain HTTP proxying (``method`` says which), SOCKS5."""
    allowed: bool
    reason: str
    """Why it was allowed (the matching entry) or denied."""
    method: str = ""
    address: str = ""
    """The address connected to (allowed attempts)."""
    bytes_up: int = 0
    """Bytes from the program to the destination."""
    bytes_down: int = 0

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}


#: An approval flow ("allow this domain?") for destinations a :class:`NetworkPolicy` does not list, e.g. the sandbox's
#: ``on_network_attempt``: called with the attempt as judged so far (not allowed, ``reason`` says why); True lets it
#: through (its addresses are still checked), False or None refuses it. Asked once per host and port of a run.
NetworkApprover = Callable[[NetworkAttempt], Awaitable[bool | None]]


@dataclass(frozen=True, slots=True)
class RunProgramSpec:
    """One program to run in a workspace."""

    cmd: str
    """Program: a bare name (looked up on the *run's* PATH) or a path."""
    args: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    """Variables added on top of the backend's environment policy (workspace variables still win)."""
    clean_env: bool = False
    """Start from an empty environment: only a minimal PATH, the workspace variables and ``env``."""
    cwd: str = "work"
    """Working directory, relative to the workspace root ("" is the root)."""
    stdin: bytes | str | None = None
    timeout: float | None = DEFAULT_TIMEOUT
    """Wall-clock deadline in seconds; ``None`` for none. On expiry the whole process tree is killed."""
    limits: ResourceLimits = field(default_factory=ResourceLimits)
    network: Literal["off", "on"] | NetworkPolicy | None = None
    """Network access for this run: off, on, or only the destinations a :class:`NetworkPolicy` allows
    (``Capabilities.network_domains``); ``None`` keeps the engine's default."""
    tag: str | None = None
    """The caller's name for a started program: ``list_programs`` reports it, ``get_program`` finds it by it."""
    pty: PtySize | None = None
    """Run on a pseudo-terminal of this size: stdin, stdout and stderr are the terminal, all output comes as
    ``stdout`` chunks (raw bytes, with the terminal's echo and CR LF), ``stderr`` stays empty. A backend whose
    ``Capabilities.pty`` is false raises ``CapabilityError``."""
    environment: str | None = None
    """The built runtime environment this run's program runs in (docs/environments.md), over the engine's own;
    ``None`` keeps the engine's. A backend whose ``Capabilities.environments`` is false raises ``CapabilityError``;
    a name that is not built, ``EnvironmentNotFound``."""
    user: str | None = None
    """The sandbox's user the program runs as (E2B's ``user`` or ``root`` in a machine sandbox); ``None``: the
    backend's own. A name not in ``Capabilities.users`` raises ``CapabilityError``."""

    def __post_init__(self) -> None:
        if not self.cmd:
            raise InvalidSpec("cmd must not be empty")
        if self.user is not None and (not self.user or "\0" in self.user):
            raise InvalidSpec("user must be a non-empty name without NUL bytes (or None)")
        if self.environment is not None and (not self.environment or "\0" in self.environment):
            raise InvalidSpec("environment must be a non-empty name without NUL bytes (or None)")
        if isinstance(self.args, str):
            raise InvalidSpec("args must be a sequence of strings, not one string")
        # exec cannot carry NUL bytes or non-strings: say so here, not as a ValueError from spawn
        if "\0" in self.cmd or any(not isinstance(a, str) or "\0" in a for a in self.args):
            raise InvalidSpec("cmd and args must be strings without NUL bytes")
        _positive("timeout", self.timeout)
        if self.tag is not None and (not self.tag or "\0" in self.tag or len(self.tag) > 256):
            raise InvalidSpec("tag must be 1 to 256 characters without NUL bytes")
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key:
                raise InvalidSpec(f"invalid environment variable name {key!r}")
            if not isinstance(value, str) or "\0" in value:
                raise InvalidSpec(f"environment variable {key!r} must be a string without NUL bytes")


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a finished (or killed) run produced. A non-zero exit is data, not an error."""

    exit_code: int
    """Exit status; negative ``-N`` when killed by signal N."""
    stdout: str
    """Standard output decoded as UTF-8 (invalid bytes replaced), capped head+tail."""
    stderr: str
    duration: float
    """Wall-clock seconds from start to exit."""
    timed_out: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_total_bytes: int = 0
    """Bytes the program wrote to stdout, including the dropped part."""
    stderr_total_bytes: int = 0
    limit_hit: str | None = None
    """Which limit stopped the program, when one did: ``timeout``, ``memory_bytes``, ``cpu_seconds``…"""
    raw_stdout: bytes = b""
    """Kept stdout bytes (with the truncation marker), undecoded."""
    raw_stderr: bytes = b""
    run_dir: str = ""
    """Workspace-relative directory of this run (``runs/…``)."""
    network_audit: tuple[NetworkAttempt, ...] = ()
    """Every connection the program asked the egress proxy for (runs with a :class:`NetworkPolicy`)."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def signal(self) -> int | None:
        return -self.exit_code if self.exit_code < 0 else None

    def check(self) -> RunResult:
        """Return ``self`` when the run succeeded; raise otherwise.

        Raises:
            ExecutionTimeout: the run hit its deadline (``.result`` is this result).
            ProgramFailed: the program exited non-zero.
        """
        if self.timed_out:
            raise ExecutionTimeout(f"program timed out after {self.duration:.1f}s", self)
        if self.exit_code != 0:
            raise ProgramFailed(self)
        return self


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """A piece of output from a streaming program, as it came."""

    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True, slots=True)
class ProgramInfo:
    """A program started with ``start_program`` that is still running, as ``list_programs`` reports it."""

    pid: int
    """The program's process id where it runs (inside the sandbox or container for backends with their own
    PID namespace); ``get_program`` takes it."""
    cmd: str
    args: tuple[str, ...]
    cwd: str
    """Workspace-relative working directory, as the spec gave it."""
    env: Mapping[str, str]
    """The variables the spec added (not the whole environment: policy variables are not echoed back)."""
    tag: str | None = None
    pty: PtySize | None = None


class Persistence(enum.StrEnum):
    """How long a workspace lives."""

    SESSION = "session"
    """One workspace per logical id, reused by every call with that id until cleanup."""
    TURN = "turn"
    """A fresh workspace for each creation; the caller cleans it up after the turn."""


@dataclass(frozen=True, slots=True)
class WorkspacePolicy:
    """Policy attached to a workspace at creation."""

    persistence: Persistence = Persistence.SESSION
    max_disk_bytes: int | None = None
    """Disk the workspace may use (allocated blocks); checked after each run where the backend says so, not
    stopped while a program writes."""

    def __post_init__(self) -> None:
        _positive("max_disk_bytes", self.max_disk_bytes)


@dataclass(frozen=True, slots=True)
class Workspace:
    """A handle to a workspace. Cheap to copy; the backend owns the real thing."""

    id: str
    """Logical id (e.g. ``app/user/session``), stable across calls."""
    path: str
    """The workspace root as the *program* sees it."""
    backend: str
    host_path: Path | None = None
    """The workspace root on this host, when the host can see it (local, sandbox)."""
    policy: WorkspacePolicy = field(default_factory=WorkspacePolicy)
    program_binds: tuple[tuple[str, str], ...] = ()
    """``(path, workspace directory)``: other absolute paths at which the program sees workspace directories (the
    sandbox backend's ``program_binds``, ``("/home/user", "work")``); the file API and ``cwd`` take them too."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A frozen state of a workspace's files (never of its processes), to fork or restore from."""

    id: str
    name: str | None
    workspace: str
    """The id of the workspace it was taken from."""
    parent: str | None
    """What that workspace was itself forked or restored from (a snapshot id, ``workspace:<id>``), if anything."""
    created_at: float
    size: int
    """Bytes its frozen tree takes on disk: for a copy-on-write one its own layer, what changed since the layers
    below it (which it shares)."""
    path: Path
    """Where the backend keeps its files (never change them), not a tree to read it by: on this host for ``local``
    and ``sandbox`` — a whole copy, or for a copy-on-write one only its own layer, in overlayfs' format (whiteouts
    for what it removed), over the layers below it — and the workspace's directory in its sandbox for ``e2b``. To
    read a snapshot's files, fork it (``fork(snapshot)``: a few milliseconds copy-on-write)."""


@dataclass(frozen=True, slots=True)
class PutFile:
    """A file to write into a workspace."""

    path: str
    """Workspace-relative path, or absolute under ``ws.path`` (the program's view); ``..``, other absolute paths and
    symlinked components are refused."""
    content: bytes | str
    mode: int = 0o644

    @property
    def data(self) -> bytes:
        return self.content.encode() if isinstance(self.content, str) else self.content


@dataclass(frozen=True, slots=True)
class File:
    """A file read out of a workspace."""

    name: str
    """Workspace-relative path."""
    content: bytes
    mime_type: str
    size_bytes: int
    """Size of the file in the workspace (``content`` may be shorter when truncated)."""
    truncated: bool = False
    skipped: str | None = None
    """Why a matching file could not be read (its program made it unreadable): ``content`` is empty."""

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class FileKind(enum.StrEnum):
    """What a workspace entry is, judged on the entry itself (a symlink is never followed)."""

    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    OTHER = "other"
    """A FIFO, socket or device node."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One workspace entry as a listing or ``stat`` sees it, without reading its content."""

    path: str
    """Workspace-relative path."""
    size: int
    """Bytes of a regular file, length of a symlink's target, a directory's own size as its file system reports it
    (what ``stat`` says: 4096 for a small ext4 directory; 0 where the backend cannot tell); 0 for other kinds."""
    mtime: float
    """Last modification, in seconds since the epoch (of the link itself for a symlink)."""
    kind: FileKind
    mode: int | None = None
    """Permission bits (``0o7777``: setuid, setgid, sticky and ``rwx`` for owner, group, others) as the program
    sees them; None where the backend cannot tell (a Jupyter server's contents API)."""
    link_target: str | None = None
    """A symlink's target as stored (never resolved): from ``stat`` only; None in listings and for other kinds."""


@dataclass(frozen=True, slots=True)
class InputSpec:
    """An input to stage into a workspace.

    ``src`` is one of ``artifact://name[@version]``, ``host:///abs/path`` (only under
    roots the caller allowed), ``workspace://rel/path``, ``skill://name[/rel]``, or raw
    ``bytes`` (then ``dest`` is required).
    """

    src: str | bytes
    dest: str | None = None
    """Workspace-relative target; default ``work/inputs/<basename>``."""
    mode: Literal["copy", "link"] = "copy"
    pin: bool = False
    """For artifacts without a version: reuse the version staged last time to the same dest."""

    def __post_init__(self) -> None:
        if self.mode not in ("copy", "link"):
            raise InvalidSpec(f"input mode must be 'copy' or 'link', got {self.mode!r}")
        if isinstance(self.src, bytes) and not self.dest:
            raise InvalidSpec("raw-bytes inputs need a dest path")


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """Which files to collect after a run, with caps."""

    globs: Sequence[str] = ("out/**",)
    max_files: int = DEFAULT_MAX_FILES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
    save: bool = False
    """Save each collected file as an artifact (a truncated file is refused)."""
    name_prefix: str = ""
    """Prefix of the artifact names when saving (name = prefix + workspace path)."""
    inline: bool = False
    """Put the content into each FileRef."""

    def __post_init__(self) -> None:
        for name in ("max_files", "max_file_bytes", "max_total_bytes"):
            _positive(name, getattr(self, name))


@dataclass(frozen=True, slots=True)
class FileRef:
    """One collected output, maybe saved as an artifact."""

    name: str
    mime_type: str
    size_bytes: int
    truncated: bool = False
    content: bytes | None = None
    saved_as: str | None = None
    """``artifact://name@version`` when saved."""
    version: int | None = None
    host_path: Path | None = None
    """Where the file is on this host, when the host can see the workspace."""
    skipped: str | None = None
    """Why the file could not be read (then it has no content and was not saved)."""


@dataclass(frozen=True, slots=True)
class OutputManifest:
    files: tuple[FileRef, ...] = ()
    limits_hit: bool = False
    """A cap (count, per-file or total bytes) cut the collection short."""


@dataclass(frozen=True, slots=True)
class CodeBlock:
    """One block of code and the language (fence tag) it is in: ``CodeBlock("python", "print(1)")``. Any tag is
    kept as given (a model's fence may say anything; running an unknown one raises ``UnsupportedLanguage``)."""

    language: str
    code: str

    def __post_init__(self) -> None:
        if not isinstance(self.language, str) or not isinstance(self.code, str):
            raise InvalidSpec("CodeBlock(language, code) takes two strings")

    def swap_hint(self) -> str | None:
        """What to write instead when the arguments look swapped (AutoGen's ``CodeBlock`` is ``(code, language)``):
        the code is a language's name and the language is none. Said when the block cannot run, not refused here:
        a model's fenced block may hold just such a word."""
        if _is_language(self.code.strip()) and not _is_language(self.language.strip()) and self.language.strip():
            return (
                f"the arguments look swapped ({self.code.strip()!r} is a language, {self.language[:30]!r} is not): "
                f"write CodeBlock(language={self.code.strip()!r}, code=...)"
            )
        return None


def _is_language(tag: str) -> bool:
    from .languages import LANGUAGES  # ground floor too; imported late, it imports nothing of ours but errors

    return any(tag.lower() in lang.aliases for lang in LANGUAGES)


@dataclass(frozen=True, slots=True)
class CodeExecutionInput:
    code_blocks: Sequence[CodeBlock]
    execution_id: str | None = None
    """Workspace id to run in (state and files persist per id); ``None`` for a fresh one."""


@dataclass(frozen=True, slots=True)
class BlockResult:
    """The result of one code block."""

    index: int
    language: str
    exit_code: int
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    error: str | None = None
    """Why the block did not run (unsupported language, setup error)."""


@dataclass(frozen=True, slots=True)
class CellResult:
    """What one cell of a workspace's kernel produced (``engine.kernels.execute``)."""

    exit_code: int
    text: str
    """stdout, stderr, ``text/plain`` results, tracebacks and execspace's notes, in the order they came."""
    stdout: str
    stderr: str
    files: tuple[str, ...]
    """Workspace paths of the rich outputs saved under ``out/``."""
    duration: float
    timed_out: bool = False
    error: tuple[str, str] | None = None
    """(exception name, value) when the cell raised."""
    kernel_died: bool = False
    state_lost: bool = False
    """The kernel's variables and imports are gone (it died or was restarted)."""
    truncated: bool = False

    def as_block(self, index: int, language: str) -> BlockResult:
        """This cell as block ``index`` of a code execution (``Kernels.run_block``)."""
        return BlockResult(index, language, self.exit_code, self.stdout, self.stderr, self.duration, self.timed_out)


@dataclass(frozen=True, slots=True)
class CodeExecutionResult:
    """Text and files of a code execution; the text is kept even when files exist."""

    output: str
    output_files: tuple[File, ...] = ()
    blocks: tuple[BlockResult, ...] = ()

    @property
    def ok(self) -> bool:
        return all(b.exit_code == 0 and not b.timed_out and b.error is None for b in self.blocks)

    def __str__(self) -> str:
        parts = ["Code execution result:"]
        parts.append(self.output.rstrip("\n") if self.output else "(no output)")
        if self.output_files:
            parts.append("Output files:")
            parts.extend(f"- {f.name} ({f.mime_type}, {f.size_bytes} bytes)" for f in self.output_files)
        return "\n".join(parts) + "\n"
