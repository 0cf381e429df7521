"""The host side of a session's channel against a stand-in supervisor: a listener it hands over (a run's way to
its own egress proxy) is taken, an fd sent with any other message breaks the session and is closed."""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket
import struct
from collections.abc import AsyncIterator

import pytest

from execspace.backends.sandbox import SessionConfig
from execspace.backends.sandbox.session import Session

_MSG = struct.Struct("=IIii")


@pytest.fixture
async def channel() -> AsyncIterator[tuple[Session, socket.socket]]:
    ours, supervisor = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    session = Session(ours, "channel-test", SessionConfig(request_timeout=5))
    supervisor.send(_MSG.pack(1, 0, 0, 0))  # READY
    await asyncio.wait_for(session._ready, 5)
    yield session, supervisor
    await session.close()
    supervisor.close()


async def _request(supervisor: socket.socket) -> tuple[int, int]:
    data = await asyncio.to_thread(supervisor.recv, 64)
    op, ident = struct.unpack_from("=II", data)
    return op, ident


def _send(supervisor: socket.socket, kind: int, ident: int, a: int, b: int, fd: int | None) -> None:
    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))] if fd is not None else []
    supervisor.sendmsg([_MSG.pack(kind, ident, a, b)], anc)


def _open_on(target: str) -> int:
    """How many of our fds are open on ``target``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/self/fd/{fd}") == target
    return count


async def test_a_listener_handed_over_is_taken(channel: tuple[Session, socket.socket]) -> None:
    session, supervisor = channel
    made = socket.create_server(("127.0.0.1", 0))
    asked = asyncio.ensure_future(session.listener())
    op, ident = await _request(supervisor)
    assert op == 3  # LISTEN
    _send(supervisor, 5, ident, made.getsockname()[1], 0, made.fileno())
    got = await asyncio.wait_for(asked, 5)
    try:
        assert got.getsockname() == made.getsockname()
        assert got.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    finally:
        got.close()
        made.close()


async def test_a_refused_listen_raises_its_errno(channel: tuple[Session, socket.socket]) -> None:
    session, supervisor = channel
    asked = asyncio.ensure_future(session.listener())
    _, ident = await _request(supervisor)
    _send(supervisor, 5, ident, 0, 24, None)  # EMFILE
    with pytest.raises(OSError) as refused:
        await asyncio.wait_for(asked, 5)
    assert refused.value.errno == 24


async def test_an_fd_with_another_message_breaks_the_session_and_is_closed(
    channel: tuple[Session, socket.socket],
) -> None:
    session, supervisor = channel
    before = _open_on("/dev/null")
    stray = os.open("/dev/null", os.O_RDONLY)
    _send(supervisor, 4, 7, 0, 0, stray)  # a SIGNALED answer carrying an fd
    os.close(stray)
    for _ in range(100):
        if session.broken is not None:
            break
        await asyncio.sleep(0.02)
    assert session.broken is not None and "fds" in str(session.broken)
    assert _open_on("/dev/null") == before
