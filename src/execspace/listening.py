"""The listening socket of a server of ours (``execspace serve``, ``execspace mcp``): bound before anything else
starts, so that a port in use is one clear error naming the port and what to do, and nothing is left running."""

from __future__ import annotations

import errno
import ipaddress
import socket

from .errors import SetupFailed

__all__ = ["listen"]

#: Connections the kernel queues before the server accepts them (uvicorn's default).
BACKLOG = 2048


def listen(host: str, port: int, component: str) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``port`` 0: a free one); ``SetupFailed`` naming ``component``, the
    address and the fix when it cannot be had."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        family = socket.AF_INET  # a name such as localhost
    # IPPROTO_TCP said, as getaddrinfo would: asyncio turns Nagle off (TCP_NODELAY) only on connections whose socket
    # says so, and with Nagle on every small answer waits for the client's delayed ACK (40 ms a request)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        cause, fix = _why(exc, host, port)
        raise SetupFailed(component, cause, fix, component=component) from None
    return sock


def _why(exc: OSError, host: str, port: int) -> tuple[str, str]:
    other = "pick another --port (0 picks a free one)"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use by another program",
            f"stop that program (`ss -ltnp 'sport = :{port}'` names it) or {other}",
        )
    if exc.errno == errno.EACCES:
        return f"port {port} on {host} needs privileges this process lacks", f"{other} above 1023, or run as root"
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return f"{host} is not an address of this host", "give --host one of its addresses (127.0.0.1, 0.0.0.0)"
    return f"cannot listen on {host}:{port} ({exc.strerror or exc})", other
