"""Ready sandboxes kept per template, so that a create takes one instead of waiting for its set-up.

A ready sandbox is what a create would make, made ahead: its id, its workspace (laid out, in E2B's layout) and,
on a session engine, its started session (a ``/bin/true`` run through the engine starts it, or adopts one of
the sandbox backend's own pooled sessions). Taking one is a pop from a list: no disk work, no thread, no
namespace set-up; what the create asked for (metadata, envVars, timeout, token) is applied by the caller, which
makes the :class:`~.sandboxes.Sandbox` around it. Each template's pool is a
:class:`~execspace.process.warmpool.WarmPool` filled in the background on the event loop (the workspace's disk
work in a worker thread, the session's start asynchronous).

A pooled sandbox of a code-interpreter template may also hold a **warm kernel** (:meth:`SandboxPool.warm_kernels`):
its default Python context's ipykernel, started in its own session after the session itself, so that the first
``run_code`` of the sandbox taken does not wait for a kernel's start. It is that sandbox's, never another's; what
the create asks for reaches it when taken (see ``CodeInterpreter.adopt``). A kernel that cannot start leaves the
sandbox pooled without one.

Bounded: pooled sandboxes count toward the server's ``max_sandboxes`` (:meth:`SandboxPool.fill` sizes the
pools to the room the live ones leave), so a full server holds no more sessions than its maximum and still
answers 429. Pooled sandboxes are nobody's until taken: they never expire, and :meth:`SandboxPool.close` removes
them (server shutdown).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import BackendError
from ..models import Persistence, RunProgramSpec, Workspace, WorkspacePolicy
from ..process.warmpool import WarmPool
from ..protocols import Engine
from .ledger import Ledger

if TYPE_CHECKING:
    from ..backends.jupyter import KernelConnection

__all__ = ["KernelStarter", "ReadySandbox", "SandboxPool", "workspace_policy"]

#: Starts a pooled sandbox's warm kernel: (template, its engine, sandbox id, workspace) → the started kernel.
KernelStarter = Callable[[str, Engine, str, Workspace], Awaitable["KernelConnection"]]

_log = logging.getLogger("execspace.server")
#: Run once in each pooled workspace: on a session engine this starts (or adopts) the workspace's session.
_WARM_UP = RunProgramSpec("/bin/true", timeout=30)
#: Sandboxes one pool starts at once (two cores: more only queue behind each other).
_STARTS_AT_ONCE = 2
#: A refill starts once no take has come for this many seconds: making a pooled sandbox costs several times a
#: create's CPU and blocks the event loop while its bwrap forks, so a burst of creates is not slowed by the refill of
#: what it takes...
_QUIET = 0.05
#: ... but at most this long after the first take it refills (a steady stream of creates has no quiet moment) ...
_MAX_DELAY = 1.0
#: ... and at once when a pool is empty: the next creates would be made cold.


def workspace_policy() -> WorkspacePolicy:
    """A sandbox's workspace lives as long as the sandbox. Its id is the sandbox's, new for each create, and kept
    under that id (a session workspace), so that a dead server's are found again by the next one (ledger.py)."""
    return WorkspacePolicy(persistence=Persistence.SESSION)


@dataclass(frozen=True, slots=True)
class ReadySandbox:
    sandbox_id: str
    engine: Engine
    workspace: Workspace
    kernel: KernelConnection | None = None
    """Its warm kernel (code-interpreter templates, see the module), for the taker to adopt or stop."""


class SandboxPool:
    """One :class:`WarmPool` of ready sandboxes per template with a size above 0 (see the module)."""

    def __init__(
        self,
        engine_for: Callable[[str], Awaitable[Engine]],
        sizes: Mapping[str, int],
        room: Callable[[], int],
        ledger: Ledger,
    ) -> None:
        """``engine_for(template)``: the engine of a template's sandboxes; ``room()``: how many sandboxes the
        server may add now (its maximum less the live ones)."""
        self._engine_for = engine_for
        self._ledger = ledger
        self._room = room
        self._timer: asyncio.TimerHandle | None = None
        self._first_take: float | None = None
        """When the first take since the last fill came (loop time)."""
        self._kernels: tuple[KernelStarter, frozenset[str]] | None = None
        """What starts warm kernels, and for which templates (see :meth:`warm_kernels`)."""
        self._sizes = {template: size for template, size in sizes.items() if size > 0}
        self._counts = {template: {"taken": 0, "missed": 0} for template in self._sizes}
        self._pools = {
            template: WarmPool(
                size,
                functools.partial(self._make, template),
                self._discard,
                idle_timeout=None,
                starts_at_once=_STARTS_AT_ONCE,
            )
            for template, size in self._sizes.items()
        }

    def warm_kernels(self, start: KernelStarter, templates: frozenset[str]) -> None:
        """Give each pooled sandbox of ``templates`` a warm kernel started by ``start`` (call before :meth:`fill`)."""
        self._kernels = (start, templates)

    def take(self, template: str) -> ReadySandbox | None:
        """A ready sandbox of ``template``, or None (the caller makes one cold); the caller refills."""
        pool = self._pools.get(template)
        if pool is None:
            return None
        ready = pool.take()
        self._counts[template]["taken" if ready is not None else "missed"] += 1
        return ready

    def held(self) -> int:
        """Ready sandboxes waiting, every template's."""
        return sum(pool.available() for pool in self._pools.values())

    def status(self) -> dict[str, dict[str, int]]:
        """Per template: the configured size, the size the room allows now, how many are ready, and how many
        creates took one (``taken``) or found none (``missed``: made cold) so far."""
        return {
            template: {
                "size": self._sizes[template],
                "target": pool.size,
                "ready": pool.available(),
                "kernels": sum(ready.kernel is not None for ready in pool.idle()),
                **self._counts[template],
            }
            for template, pool in self._pools.items()
        }

    def refill(self) -> None:
        """Top the pools up in the background after the takes (see ``_QUIET``, ``_MAX_DELAY``), at once when one
        is empty. Call on the event loop."""
        if any(pool.size > 0 and pool.available() == 0 for pool in self._pools.values()):
            self.fill()
            return
        if not self._pools:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._first_take is None:
            self._first_take = now
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(min(now + _QUIET, self._first_take + _MAX_DELAY), self.fill)

    def fill(self) -> None:
        """Top the pools up in the background now, to their sizes within the room (the first templates get
        theirs first)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._first_take = None
        room = self._room()
        for template, pool in self._pools.items():
            pool.size = min(self._sizes[template], max(room, 0))
            room -= pool.size
            pool.refill()

    async def close(self) -> None:
        """Stop filling and remove every pooled sandbox. Idempotent."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for pool in self._pools.values():
            await pool.close()

    async def _make(self, template: str) -> ReadySandbox:
        engine = await self._engine_for(template)
        sandbox_id = self._ledger.new_id()
        ws = await engine.manager.create_workspace(f"e2b/{sandbox_id}", workspace_policy())
        try:
            result = await engine.runner.run_program(ws, _WARM_UP)
            if result.exit_code != 0:
                raise BackendError(f"a pooled {template} sandbox could not run /bin/true (exit {result.exit_code})")
            kernel = await self._warm_kernel(template, engine, sandbox_id, ws)
        except BaseException:
            await engine.manager.cleanup(ws)
            self._ledger.forget(sandbox_id)
            raise
        return ReadySandbox(sandbox_id, engine, ws, kernel)

    async def _warm_kernel(
        self, template: str, engine: Engine, sandbox_id: str, ws: Workspace
    ) -> KernelConnection | None:
        if self._kernels is None or template not in self._kernels[1]:
            return None
        try:
            return await self._kernels[0](template, engine, sandbox_id, ws)
        except Exception:
            _log.exception(
                "the warm kernel of the pooled sandbox %s did not start: it is pooled without one", sandbox_id
            )
            return None

    async def _discard(self, ready: ReadySandbox) -> None:
        if ready.kernel is not None:
            await ready.kernel.stop()
        try:
            await ready.engine.manager.cleanup(ready.workspace)
        except Exception:
            _log.exception("removing the pooled sandbox %s failed", ready.sandbox_id)
        else:
            self._ledger.forget(ready.sandbox_id)
