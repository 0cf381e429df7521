"""Interactive program sessions: a started program, its output since the last look, and their lifetime.

A :class:`ProgramSession` pumps the program's output (stdout and stderr interleaved, as a
terminal shows them) into a bounded head+tail buffer. Each :meth:`ProgramSession.take`
returns what arrived since the previous one, with byte offsets into the whole stream;
when more arrived than the budget, the middle is dropped and counted. Memory per session
stays bounded however much the program prints and however rarely it is polled.

A :class:`SessionStore` owns the sessions of one tool instance: it caps how many run at
once, removes a session once its final output was read, and reaps exited sessions nobody
read within the TTL. Nothing is global.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

from ..errors import UsageError
from ..models import RunResult, Workspace
from ..process.capture import HeadTailBuffer
from ..protocols import ProgramHandle

__all__ = ["OutputSlice", "ProgramSession", "SessionStore", "UnknownSession"]

#: After output arrives, wait this long for more before answering (programs print in bursts).
SETTLE_SECONDS = 0.075


class UnknownSession(UsageError, LookupError):
    """No session with that id (never started, killed, or already finished and read)."""


@dataclass(frozen=True, slots=True)
class OutputSlice:
    """Output of a session between two offsets of its byte stream."""

    text: str
    offset: int
    next_offset: int
    truncated: bool


class ProgramSession:
    """One started program and the output the model has not seen yet."""

    def __init__(self, session_id: str, ws: Workspace, handle: ProgramHandle, budget: int, context: Any = None) -> None:
        self.id = session_id
        self.ws = ws
        self.handle = handle
        self.context = context
        """Whatever the owner needs back when the session ends (e.g. a file snapshot)."""
        self.exited_at: float | None = None
        self.result: RunResult | None = None
        self._budget = budget
        self._pending = HeadTailBuffer(budget)
        self._offset = 0
        # a character split across two takes is decoded whole on the second one
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._activity = asyncio.Event()
        self._done = asyncio.Event()
        self._pump_task = asyncio.create_task(self._pump(), name=f"execspace-session-{session_id}")

    async def _pump(self) -> None:
        try:
            async for chunk in self.handle.stream():
                self._pending.write(chunk.data)
                self._activity.set()
            # the streams closed: wait() reaps the program, or reports its timeout
            self.result = await self.handle.wait()
        except asyncio.CancelledError:
            # torn down from outside (loop shutdown): the program must not outlive its session
            await asyncio.shield(self.handle.kill())
            raise
        finally:
            self.exited_at = time.monotonic()
            self._done.set()
            self._activity.set()

    @property
    def exited(self) -> bool:
        return self._done.is_set()

    @property
    def unread(self) -> bool:
        return self._pending.total > 0

    def take(self) -> OutputSlice:
        """The output since the previous take (head and tail when over budget), and advance."""
        buf, self._pending = self._pending, HeadTailBuffer(self._budget)
        start, self._offset = self._offset, self._offset + buf.total
        text = self._decoder.decode(buf.getvalue(), final=self.exited)
        return OutputSlice(text, start, self._offset, buf.truncated)

    async def settle(self, wait: float) -> None:
        """Wait up to ``wait`` seconds: return at exit, or once output came and paused briefly."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while not self.exited:
            left = deadline - loop.time()
            if left <= 0:
                return
            self._activity.clear()
            try:
                async with asyncio.timeout(min(SETTLE_SECONDS, left) if self.unread else left):
                    await self._activity.wait()
            except TimeoutError:
                if self.unread:
                    return  # output came and then a quiet spell: the program waits for us

    async def write(self, data: str, *, close: bool = False) -> None:
        if data:
            await self.handle.write_stdin(data)
        if close:
            await self.handle.close_stdin()

    async def kill(self) -> None:
        """Kill the program tree and wait until its output is drained."""
        if not self.exited:
            await self.handle.kill()
        await self._done.wait()

    async def close(self) -> None:
        """Kill if needed and release everything; used when the owner goes away."""
        await self.kill()
        with contextlib.suppress(Exception):
            await self._pump_task
        with contextlib.suppress(Exception):
            await self.handle.__aexit__(None, None, None)


class SessionStore:
    """The sessions of one tool instance."""

    def __init__(self, *, ttl: float, max_running: int) -> None:
        self.ttl = ttl
        self.max_running = max_running
        self._sessions: dict[str, ProgramSession] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def ids(self) -> list[str]:
        return sorted(self._sessions)

    def check_room(self) -> None:
        running = sum(1 for s in self._sessions.values() if not s.exited)
        if running >= self.max_running:
            raise UsageError(
                f"{running} sessions are already running (the limit); kill one with workspace_kill or let it finish"
            )

    def add(self, ws: Workspace, handle: ProgramHandle, budget: int, context: Any = None) -> ProgramSession:
        session = ProgramSession(f"s-{secrets.token_hex(4)}", ws, handle, budget, context)
        self._sessions[session.id] = session
        return session

    def get(self, session_id: str) -> ProgramSession:
        session = self._sessions.get(session_id)
        if session is None:
            known = ", ".join(self.ids()) or "none"
            raise UnknownSession(f"unknown session_id {session_id!r} (open sessions: {known})")
        return session

    def discard(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def reap(self) -> list[str]:
        """Close exited sessions whose output nobody read within the TTL; return their ids."""
        now = time.monotonic()
        stale = [s for s in self._sessions.values() if s.exited_at is not None and now - s.exited_at >= self.ttl]
        for s in stale:
            self.discard(s.id)
            await s.close()
        return [s.id for s in stale]

    async def aclose(self) -> None:
        """Kill every session (the owner is going away)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
