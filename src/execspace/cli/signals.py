"""Where a command's signals go: SIGTERM cancels it like Ctrl-C does, or, while a program runs, Ctrl-C, SIGTERM and
SIGHUP are routed to the program instead (``execspace run`` passes them on)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["ROUTED", "CommandSignals"]

#: What a running program is sent: a terminal's ^C, a supervisor's TERM, a hang-up.
ROUTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CommandSignals:
    """Installed for one command's run on its event loop."""

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self._task = task
        self._route: Callable[[signal.Signals], None] | None = None
        self.terminated = False
        """SIGTERM cancelled the command (no program was running to take it)."""

    def __enter__(self) -> CommandSignals:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._on, signal.SIGTERM)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGTERM)

    def _on(self, sig: signal.Signals) -> None:
        if self._route is not None:
            self._route(sig)
            return
        self.terminated = True
        self._task.cancel()

    @contextlib.contextmanager
    def routed(self, to: Callable[[signal.Signals], None]) -> Iterator[None]:
        """Within the block, every signal of :data:`ROUTED` goes to ``to`` (and nothing else happens)."""
        loop = asyncio.get_running_loop()
        # asyncio.run's own ^C handler (and SIGHUP's default) come back after: the loop API would reset them
        previous = {sig: signal.getsignal(sig) for sig in ROUTED if sig != signal.SIGTERM}
        for sig in previous:
            loop.add_signal_handler(sig, self._on, sig)
        self._route = to
        try:
            yield
        finally:
            self._route = None
            for sig, handler in previous.items():
                loop.remove_signal_handler(sig)
                signal.signal(sig, handler)
