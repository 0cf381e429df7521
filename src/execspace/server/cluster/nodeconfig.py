"""What a node agent's server runs with: the front door's server options, the agent's own key, the node's root."""

from __future__ import annotations

import os
import pickle
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO

from ...backend import BackendOptions, HostOptions
from ...backends.sandbox import SandboxOptions
from ..options import ServerOptions, key_id

__all__ = [
    "SLOT",
    "AgentConfig",
    "Endpoint",
    "NodeServer",
    "encode_node_server",
    "node_server",
    "node_slots",
    "read_node_server",
]

#: The Ray custom resource a node declares its sandbox slots with: ``ray start --resources '{"execspace_sandbox": N}'``.
SLOT = "execspace_sandbox"


def node_slots(resources: Mapping[str, float], default: int) -> int:
    """The sandboxes a node holds at most: the :data:`SLOT` resource it declares, else ``default``
    (``--max-sandboxes``). Ray drops a resource declared as 0: a node that must hold none declares nothing under a
    default of 0."""
    return int(resources[SLOT]) if SLOT in resources else default


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """What a front door starts an agent with: every node's server serves these options (templates, limits, pools,
    keys), its ``max_sandboxes`` the node's own slots (:meth:`on_node`)."""

    options: ServerOptions
    backend: str
    backend_options: BackendOptions | None
    slots: int
    """The slots of a node that declares no :data:`SLOT` resource (``--max-sandboxes``; 0: such a node holds none)."""

    def key_ids(self) -> frozenset[str]:
        return frozenset(key_id(k) for k in (*self.options.api_keys, *self.options.admin_keys))

    def on_node(self, slots: int) -> AgentConfig:
        """The configuration of a node of ``slots`` slots (at least 1: a node of none gets no agent)."""
        return replace(self, options=replace(self.options, max_sandboxes=slots))


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where a node's server answers, and the keys it takes (by their ids, never the keys)."""

    node_id: str
    url: str
    key_ids: frozenset[str]
    slots: int


@dataclass(frozen=True, slots=True)
class NodeServer:
    """The node server's whole configuration, as the agent hands it to its child over a pipe."""

    options: ServerOptions
    backend: str
    backend_options: BackendOptions | None
    host: str
    raylet: int | None
    """The pid of the node's raylet, whose death the server does not outlive (None: not known here)."""
    node_id: str = ""
    """The node's Ray id (hex), which names it in the server's log and errors."""

    @property
    def where(self) -> str:
        """How the server's log and errors name its node: its Ray id and address."""
        return f"node {self.node_id} ({self.host})"


def node_server(config: AgentConfig, host: str, agent_key: str, raylet: int | None, node_id: str) -> NodeServer:
    """The node's server: the front door's options, plus the agent's own admin key (its reports list every team's
    sandboxes), on the machine's cluster workspace root."""
    options = replace(config.options, admin_keys=(*config.options.admin_keys, agent_key), client_id=node_id)
    return NodeServer(
        options, config.backend, _node_root(config.backend, config.backend_options), host, raylet, node_id
    )


def _node_root(backend: str, given: BackendOptions | None) -> BackendOptions | None:
    """The backend options with the machine's cluster root (``ray`` beside the backends' default roots, or under the
    one given). Every node server on a machine keeps its own ledger there, so the next one to start removes what a
    server that died with its node left (a new node has a new id: a root per node id would never be swept)."""
    name = "ray"
    opts = given if given is not None else SandboxOptions() if backend == "sandbox" else HostOptions()
    if not isinstance(opts, HostOptions):
        return opts
    # beside the backends' own default roots ($TMPDIR/execspace-<uid>/<backend>), private to this user as they are
    base = (
        Path(opts.workspace_root) if opts.workspace_root else Path(tempfile.gettempdir()) / f"execspace-{os.getuid()}"
    )
    return replace(opts, workspace_root=str(base / name))


def encode_node_server(config: NodeServer) -> bytes:
    """The bytes :func:`read_node_server` reads back (sized, so that the pipe stays open after them)."""
    data = pickle.dumps(config)
    return struct.pack("!I", len(data)) + data


def read_node_server(pipe: IO[bytes]) -> NodeServer:
    (size,) = struct.unpack("!I", pipe.read(4))
    found = pickle.loads(pipe.read(size))  # noqa: S301 - our own agent's pipe, not a client's bytes
    if not isinstance(found, NodeServer):
        raise TypeError(f"the agent sent a {type(found).__name__}, not a NodeServer")
    return found
