"""Pause on real idleness: an ``autoPause`` sandbox that has been idle for its ``idle_pause`` seconds (``execspace
serve --idle-pause``, a template's ``idle_pause``) is paused with the freezer, as a pause of its owner's would be,
and its next request resumes it: the SDK sees the request take a little longer, nothing else (docs/operations.md
"Idle pausing").

Idle means all of these, for the whole span:

* its programs use no CPU: less than :data:`IDLE_CPU_SHARE` of one CPU between two looks, read through the
  runner's :class:`~execspace.protocols.SupportsCpuUsage` (one read of its cgroup's count as root, else its
  processes' times summed from ``/proc``);
* no request of it is open (a command's output stream, a cell's execution, a file transfer, a watch or a pty all
  are while their client listens: :class:`~.activity.Activity`) and none came.

One task per server looks at every sandbox each ``idle_interval`` (a second by default): no thread and no timer per
sandbox. The pause itself is :meth:`.Sandboxes.pause_idle`, which gives up if a request came since the look; a
request that comes while it is under way waits for it and resumes the sandbox. Its lifetime clock stops while it
is paused, as for any pause.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from ..errors import FreezeFailed
from ..protocols import SupportsCpuUsage, SupportsFreezing
from .sandboxes import Sandbox, Sandboxes

__all__ = ["IDLE_CPU_SHARE", "IdleWatch"]

_log = logging.getLogger("execspace.server")

#: The CPU a sandbox's programs may use between two looks, as a share of one CPU over that time, and still be idle:
#: what a process that only waits costs its kernel (timers, a heartbeat), never a program that computes.
IDLE_CPU_SHARE = 0.01


@dataclass(frozen=True, slots=True)
class _Look:
    """What one look saw of a sandbox."""

    cpu: float
    """Its programs' CPU seconds."""
    at: float
    """When (``time.monotonic``)."""
    quiet_since: float
    """Since when its programs have used no CPU, as far as the looks saw."""


class IdleWatch:
    """The server's watch over its sandboxes' idleness (see the module)."""

    def __init__(self, sandboxes: Sandboxes) -> None:
        self._sandboxes = sandboxes
        self._looks: dict[str, _Look] = {}
        self._pausing: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        """Look every ``idle_interval`` until cancelled; then wait for the pauses under way."""
        try:
            while True:
                self.look(time.monotonic())
                await asyncio.sleep(self._sandboxes.options.idle_interval)
        finally:
            await asyncio.gather(*self._pausing.values(), return_exceptions=True)

    def look(self, now: float) -> None:
        """Look at every running sandbox that may be paused for idleness; pause those idle long enough."""
        looks, self._looks = self._looks, {}
        for sandbox in self._sandboxes:
            runner = sandbox.engine.runner
            if sandbox.idle_pause is None or sandbox.paused is not None or sandbox.id in self._pausing:
                continue
            if not (isinstance(runner, SupportsCpuUsage) and isinstance(runner, SupportsFreezing)):
                continue
            look = _next_look(looks.get(sandbox.id), runner.cpu_seconds(sandbox.workspace), now)
            self._looks[sandbox.id] = look
            idle_since = max(look.quiet_since, sandbox.activity.quiet_since(now))
            if now - idle_since >= sandbox.idle_pause:
                self._pause(sandbox)

    def _pause(self, sandbox: Sandbox) -> None:
        task = asyncio.create_task(self._pause_if_idle(sandbox, sandbox.activity.served))
        self._pausing[sandbox.id] = task
        task.add_done_callback(lambda _: self._pausing.pop(sandbox.id, None))

    async def _pause_if_idle(self, sandbox: Sandbox, served: int) -> None:
        """Pause it unless a request came since the look (it had ``served`` then)."""
        activity = sandbox.activity
        try:
            if await self._sandboxes.pause_idle(sandbox, lambda: activity.served == served and not activity.serving):
                _log.info("sandbox %s paused: idle for %gs", sandbox.id, sandbox.idle_pause)
        except FreezeFailed as exc:
            # it runs on, and is looked at afresh: idle for as long again before the next try
            _log.warning("sandbox %s was idle but could not be paused, it runs on: %s", sandbox.id, exc)
        except Exception:
            _log.exception("pausing idle sandbox %s failed; it runs on", sandbox.id)


def _next_look(last: _Look | None, cpu: float, now: float) -> _Look:
    """This look, after ``last`` (None: the first, or the first since it was paused: it is watched afresh)."""
    if last is None:
        return _Look(cpu, now, now)
    used = cpu - last.cpu
    quiet = 0 <= used <= IDLE_CPU_SHARE * (now - last.at)  # a drop: a process ended, which is no idleness
    return _Look(cpu, now, last.quiet_since if quiet else now)
