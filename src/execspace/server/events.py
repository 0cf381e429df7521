"""What happens on ``execspace serve`` that its operators watch, told to whoever listens: the metrics
(:mod:`.metrics`) and the audit log (:mod:`.audit`) are two listeners (docs/operations.md).

The sandbox table, the command path, the file API and the code interpreter report an event once the action is
done and before its answer goes back, by calling :class:`Events`; a listener is called at once, on the event
loop, and must be quick (a counter, one ``write``). With no listener nothing is built: each reporter asks
:attr:`Events.listening` first, so a server without metrics or audit pays one attribute read per action.

An event carries ids, names, codes, sizes and paths: never an environment value, a file's content, a token or a
key (``key_id`` is :func:`.options.key_id` of the API key that made the sandbox).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..models import RunResult

__all__ = [
    "CellExecuted",
    "CommandEnded",
    "CommandStarted",
    "EgressAttempted",
    "Events",
    "FileChanged",
    "Listener",
    "Outcome",
    "Refused",
    "SandboxChanged",
    "ServerEvent",
    "outcome_of",
]

#: How a command ended: exit 0, another exit code, a signal, or stopped by its deadline or a resource limit.
Outcome = Literal["ok", "error", "signal", "limit"]


def outcome_of(result: RunResult) -> Outcome:
    """The class of a program's end (a limit or timeout first: the signal that ended it is the limit's)."""
    if result.timed_out or result.limit_hit is not None:
        return "limit"
    if result.exit_code == 0:
        return "ok"
    return "signal" if result.exit_code < 0 else "error"


@dataclass(frozen=True, slots=True)
class SandboxChanged:
    """A sandbox was created (a fork too), killed, expired, paused, resumed, or ended with the server."""

    kind: Literal["create", "kill", "expire", "pause", "resume", "shutdown"]
    sandbox: str
    template: str
    key_id: str


@dataclass(frozen=True, slots=True)
class CommandStarted:
    """A command of envd's process API started (its pid is the sandbox's)."""

    sandbox: str
    key_id: str
    pid: int
    argv: tuple[str, ...]
    user: str
    cwd: str
    env_names: tuple[str, ...]
    """The names of the variables the call set (their values stay out)."""


@dataclass(frozen=True, slots=True)
class CommandEnded:
    sandbox: str
    key_id: str
    pid: int
    argv: tuple[str, ...]
    exit_code: int
    outcome: Outcome
    duration: float
    limit_hit: str | None


@dataclass(frozen=True, slots=True)
class FileChanged:
    """The file API wrote (``size`` bytes), removed or moved (to ``to``) a path of the sandbox (an SDK path)."""

    kind: Literal["write", "remove", "rename"]
    sandbox: str
    key_id: str
    path: str
    size: int | None = None
    to: str | None = None


@dataclass(frozen=True, slots=True)
class EgressAttempted:
    """A connection a command asked its egress proxy for, told when the command ends (the proxy keeps them for
    its result)."""

    sandbox: str
    key_id: str
    pid: int
    host: str
    port: int
    allowed: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A request refused by the server's policy: ``capacity`` (no room for another sandbox: 429), ``network``
    (a network the server's flags forbid: 403)."""

    what: Literal["capacity", "network"]
    key_id: str
    reason: str
    sandbox: str | None = None


@dataclass(frozen=True, slots=True)
class CellExecuted:
    """A cell was given to a code context's kernel (its code stays out: its length is told)."""

    sandbox: str
    key_id: str
    context: str
    language: str
    code_bytes: int


ServerEvent = SandboxChanged | CommandStarted | CommandEnded | FileChanged | EgressAttempted | Refused | CellExecuted
Listener = Callable[[ServerEvent], None]


class Events:
    """The listeners of one server, called in order with each event."""

    __slots__ = ("_listeners",)

    def __init__(self, listeners: Sequence[Listener] = ()) -> None:
        self._listeners = tuple(listeners)

    @property
    def listening(self) -> bool:
        """Whether anyone listens: a reporter builds no event when nobody does."""
        return bool(self._listeners)

    def __call__(self, event: ServerEvent) -> None:
        for listener in self._listeners:
            listener(event)
