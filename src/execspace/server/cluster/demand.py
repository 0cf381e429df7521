"""What the cluster asks of Ray's autoscaler: slots for the sandboxes held plus the creates that wait.

Kept by the registry, the cluster's one writer of it: each front door tells the registry of a create it refused
because every node was full, and the registry keeps one standing request through Ray's public SDK
(``ray.autoscaler.sdk.request_resources``, bundles of one :data:`.nodeconfig.SLOT` each). Each call of it replaces
the standing request, so it asks for every slot wanted at once (the held ones too: the autoscaler fits a request on
the nodes as if they were idle), and withdraws it once the cluster's slots cover it and the creates that waited
were served: a new node is idle to the autoscaler until its agent (an actor, which the autoscaler counts as work)
runs, and a request withdrawn before would let the autoscaler end it at once. Where no autoscaler runs the request
is a key written in Ray's GCS that nothing reads.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from .nodeconfig import SLOT

__all__ = ["Autoscaler", "Demand", "RayAutoscaler"]

_log = logging.getLogger("execspace.server.cluster")

#: Seconds a refused create counts as waiting: the front door's 429 says ``Retry-After: 1``, so a client that waits
#: asks again about once in it and counts once.
WAITING_FOR = 1.0
#: Seconds without a refused create after which a request the cluster's slots cover is withdrawn: the creates that
#: waited were served, so the new nodes run their agents (a node is not idle to the autoscaler while one runs).
SERVED_FOR = 10.0
#: Seconds without a refused create after which a request the autoscaler has not met is withdrawn: nobody waits for
#: it any more (nodes it started still come, and end when idle).
QUIET_FOR = 60.0
#: Seconds between looks at the cluster's slots while a request stands.
_LOOK_EVERY = 1.0


class Autoscaler(Protocol):
    def request(self, slots: int) -> None:
        """Stand a request for ``slots`` slots in all (0: withdraw it)."""

    def capacity(self) -> int:
        """The slots the living nodes declare."""


class RayAutoscaler:
    """Ray's autoscaler, through its public SDK (called in a Ray worker: the registry)."""

    def request(self, slots: int) -> None:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[{SLOT: 1}] * slots)

    def capacity(self) -> int:
        import ray

        return int(ray.cluster_resources().get(SLOT, 0))  # type: ignore[no-untyped-call]


class Demand:
    """The standing request: grown by refused creates, withdrawn once met and served (or once nobody waits)."""

    def __init__(self, autoscaler: Autoscaler, clock: Callable[[], float] | None = None) -> None:
        self._autoscaler = autoscaler
        self._clock = clock or time.monotonic
        self._refusals: deque[float] = deque()
        self._standing = 0  # slots asked for; 0: no request stands
        self._looked = 0.0

    @property
    def standing(self) -> int:
        return self._standing

    def refused(self, held: int) -> None:
        """A create was refused, every node full: ask for the ``held`` slots of the nodes that declare them plus
        one for each create that waits now."""
        now = self._clock()
        self._refusals.append(now)
        while self._refusals[0] < now - WAITING_FOR:
            self._refusals.popleft()
        wanted = held + len(self._refusals)
        if wanted > self._standing:
            self._ask(wanted, f"creates waiting: {len(self._refusals)}, slots held: {held}")

    def settle(self) -> None:
        """Withdraw the standing request once the cluster's slots cover it and no create waited for
        :data:`SERVED_FOR`, or once none waited for :data:`QUIET_FOR`."""
        now = self._clock()
        if not self._standing or now - self._looked < _LOOK_EVERY:
            return
        self._looked = now
        quiet = now - self._refusals[-1] if self._refusals else QUIET_FOR
        if quiet >= QUIET_FOR:
            self._ask(0, f"no create waited for {QUIET_FOR:.0f}s")
            return
        if quiet < SERVED_FOR:
            return
        try:
            capacity = self._autoscaler.capacity()
        except Exception as exc:  # Ray's errors (the GCS does not answer now): the next look asks again
            _log.warning("cannot count the cluster's %s slots: %s", SLOT, exc)
            return
        if capacity >= self._standing:
            self._ask(0, f"the cluster has {capacity} slots now")

    def _ask(self, slots: int, why: str) -> None:
        try:
            self._autoscaler.request(slots)
        except Exception as exc:  # Ray's errors (the GCS does not answer now): the next refusal or look asks again
            _log.warning("cannot ask Ray's autoscaler for %d %s slots: %s", slots, SLOT, exc)
            return
        if slots:
            _log.warning("asked Ray's autoscaler for %d %s slots in all (%s)", slots, SLOT, why)
        else:
            _log.warning("withdrew the request for %d %s slots from Ray's autoscaler (%s)", self._standing, SLOT, why)
            self._refusals.clear()
        self._standing = slots
