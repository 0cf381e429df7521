"""A node agent's server: ``python -m execspace.server.cluster.nodeserve``, the child a node agent starts.

It reads its configuration from its stdin (:func:`.nodeconfig.write_node_server`), serves, prints ``READY host
port`` on its stdout once it listens, and ends as ``execspace serve`` ends on SIGTERM (its sandboxes killed) when
its stdin closes: the agent holds that pipe open for as long as its process lives, so a dead agent (the actor
killed) leaves no server behind. When the node's raylet dies, it dies at once with its sandboxes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import sys
import threading

from ..builds import LOGGER as BUILDS_LOGGER
from ..serve import serve
from .nodeconfig import read_node_server


def _end_with_stdin() -> None:
    """SIGTERM this process once its stdin reaches its end (the agent is gone)."""
    while sys.stdin.buffer.read(65536):
        pass
    os.kill(os.getpid(), signal.SIGTERM)


def _end_with_raylet(pid: int) -> None:
    """SIGKILL this process the moment the node's raylet exits: a node Ray lost is a dead node, and its sandboxes
    (bwrap's ``--die-with-parent``) and this server's port go with it at once, as they would with its machine. A
    graceful end would keep answering for its sandboxes while they are being closed."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already, or a kernel without pidfds (before Linux 5.3): the agent's pipe still holds
        if not os.path.exists(f"/proc/{pid}"):
            os.kill(os.getpid(), signal.SIGKILL)
        return
    select.select([fd], [], [])
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    config = read_node_server(sys.stdin.buffer)
    # the agent's stderr is its Ray worker's, which Ray forwards to the front doors' logs
    logging.basicConfig(format=f"execspace serve ({config.where}): %(message)s", level=logging.WARNING)
    logging.getLogger(BUILDS_LOGGER).setLevel(logging.INFO)  # each step of an environment's build on this node
    threading.Thread(target=_end_with_stdin, name="agent-watch", daemon=True).start()
    if config.raylet is not None:
        threading.Thread(target=_end_with_raylet, args=(config.raylet,), name="raylet-watch", daemon=True).start()

    def ready(host: str, port: int) -> None:
        print(f"READY {host} {port}", flush=True)

    asyncio.run(
        serve(
            config.options,
            host=config.host,
            port=0,
            backend=config.backend,
            backend_options=config.backend_options,
            on_ready=ready,
            where=config.where,
            node=config.node_id,
        )
    )


if __name__ == "__main__":
    main()
