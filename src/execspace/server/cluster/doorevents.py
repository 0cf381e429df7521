"""What the front door of ``serve --ray`` does that its operators watch, told to its listeners: its metrics
(:mod:`.doormetrics`) and its audit log (:class:`DoorAudit`: the refusals it makes itself). See docs/operations.md.

The nodes' servers report their own sandboxes, commands and files to their own listeners (:mod:`..events`); the
front door tells only what it decides: a create's outcome, a node's call, a 503 it answers, a node it loses. With
no listener nothing is built (:attr:`FrontDoorEvents.listening`).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from starlette.datastructures import Headers

from ...audit import AuditSink
from ..audit import ServerAudit
from ..events import Refused
from ..routing import target_of

__all__ = [
    "CLUSTER_FULL",
    "RPC_PREFIXES",
    "CreateAnswered",
    "CreateOutcome",
    "DoorAudit",
    "DoorEvent",
    "DoorListener",
    "FrontDoorEvents",
    "NodeCalled",
    "NodeLost",
    "RouteKind",
    "Unavailable",
    "UnavailableCause",
    "create_outcome",
    "route_kind",
]

#: How a create through the front door ended: a sandbox (201), every node full (the front door's 429), or anything
#: else (a node's refusal or failure, a node or the registry not answering).
CreateOutcome = Literal["created", "full", "error"]
#: Why the front door answered 503: a node's server did not answer in time (``node``), a node's agent or the
#: cluster's registry could not serve (``setup``), no node is alive (``no_node``).
UnavailableCause = Literal["node", "setup", "no_node"]

#: What a request through the front door is: the control plane, envd's Connect RPC (processes, the filesystem's
#: calls), envd's file up- and downloads, or any other port of a sandbox (its code interpreter, a program's server).
RouteKind = Literal["control", "rpc", "files", "port"]
RPC_PREFIXES = ("/process.Process/", "/filesystem.Filesystem/")

#: What the front door's own 429 says (its audit line's ``reason``).
CLUSTER_FULL = (
    "every node of the cluster runs its maximum of sandboxes (its execspace_sandbox resource, else "
    "--max-sandboxes): retry after one ends, or add nodes"
)


def route_kind(scope: MutableMapping[str, Any], domain: str | None) -> RouteKind:
    """The kind of the request of ``scope`` (``domain``: the front door's ``--domain``, for host-based routing)."""
    if target_of(Headers(scope=scope), domain) is None:
        return "control"
    path: str = scope["path"]
    if path.startswith(RPC_PREFIXES):
        return "rpc"
    return "files" if path == "/files" or path.startswith("/files/") else "port"


def create_outcome(status: int) -> CreateOutcome:
    """The outcome of a create the front door answered ``status`` (a node's 429 is never passed on: the next node
    is tried, so a 429 is the front door's own)."""
    if status == 201:
        return "created"
    return "full" if status == 429 else "error"


@dataclass(frozen=True, slots=True)
class CreateAnswered:
    outcome: CreateOutcome
    key_id: str
    """:func:`..options.key_id` of the caller's API key."""


@dataclass(frozen=True, slots=True)
class NodeCalled:
    """A control-plane call of a node's server ended (answered or failed) after ``seconds``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Unavailable:
    """The front door answered 503 with ``Retry-After``."""

    cause: UnavailableCause


@dataclass(frozen=True, slots=True)
class NodeLost:
    """A node was found gone (Ray reports it dead, or its server refuses connections), with its sandboxes."""

    node_id: str


DoorEvent = CreateAnswered | NodeCalled | Unavailable | NodeLost
DoorListener = Callable[[DoorEvent], None]


class FrontDoorEvents:
    """The front door's listeners, called in order with each event."""

    __slots__ = ("_listeners",)

    def __init__(self, listeners: Sequence[DoorListener] = ()) -> None:
        self._listeners = tuple(listeners)

    @property
    def listening(self) -> bool:
        return bool(self._listeners)

    def __call__(self, event: DoorEvent) -> None:
        for listener in self._listeners:
            listener(event)


class DoorAudit:
    """The front door's audit lines: a create it refuses itself (every node full) as a single-host server writes
    its own (``policy.refusal``, ``what`` ``capacity``), with ``node`` null. Everything else is a node's to write
    (each node's server, in the file on its machine)."""

    def __init__(self, sink: AuditSink) -> None:
        self._audit = ServerAudit(sink, {"node": None})

    def __call__(self, event: DoorEvent) -> None:
        if isinstance(event, CreateAnswered) and event.outcome == "full":
            self._audit(Refused("capacity", event.key_id, CLUSTER_FULL))
