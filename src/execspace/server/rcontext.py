"""R contexts of the code interpreter: one R per context, in the sandbox's own session, running each cell in its
global environment so that variables and functions carry over to the next cell.

The process is ``R`` of the host (the sandbox shows ``/usr``), its cells read from a descriptor of their own (the
cell's code and its children read ``/dev/null``), driven by ``rrepl.R``, which the bootstrap on R's command line
reads from that descriptor first. R prints as it always does (``print``, ``cat``, ``message`` are the cell's
stdout and stderr as they come); the driver adds what is not plain output as records (:mod:`.recordprocess`): each
visible value of the cell's top-level expressions as R prints it (the last one the cell's result), its error, and
its end.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from importlib import resources

from ..errors import UsageError
from ..protocols import ProgramRunner
from .recordprocess import RecordProcess, message
from .sandboxes import Sandbox

__all__ = ["RContext", "r_available"]

_SOURCE = resources.files(__package__).joinpath("rrepl.R").read_text(encoding="utf-8")
#: Moves the cells' channel to fd 3 and gives R and its children /dev/null, then R, whose bootstrap reads the driver's
#: text from the channel and runs it with the channel in hand. R opens no descriptor by its number (and the
#: session's are sockets, which /dev/fd cannot reopen): a ``cat`` that ignores SIGINT (an interrupt is the cell's)
#: carries the channel to R through a pipe.
_SHELL = 'exec 3<&0 0</dev/null; exec R "$@"'
_BOOTSTRAP = (
    "local({channel <- pipe(\"trap '' INT; exec cat <&3\", 'rb'); "
    "size <- as.integer(rawToChar(readBin(channel, 'raw', 10L))); "
    "source <- rawToChar(readBin(channel, 'raw', size)); "
    "eval(parse(text = source, keep.source = FALSE), list(channel = channel), globalenv())})"
)
_TAG = "execspace-r-context"


def r_available() -> bool:
    """Whether the host has R, which the sandbox shows from the host's system directories."""
    return shutil.which("R") is not None


class RContext(RecordProcess):
    """A started R and what it writes."""

    DIED = (
        "the R context's process ended (quit() ends it; one that could not start says why in its output); "
        "the next cell starts a fresh one, state lost"
    )

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str) -> RContext:
        args = ("-c", _SHELL, "R", "--no-echo", "--no-save", "--no-restore", "-e", _BOOTSTRAP)
        handle = await runner.start_program(sandbox.workspace, sandbox.context_process("/bin/sh", args, cwd, _TAG))
        context = cls(handle)
        await context._send(b"%010d" % len(_SOURCE.encode()) + _SOURCE.encode())  # if it failed, so does the cell
        return context

    def _message(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        for name in env_vars:
            if not name or "=" in name:
                raise UsageError(f"env var name {name!r} cannot be set in R: use a name without '='")
        return message(cell_id, code, *(part for pair in env_vars.items() for part in pair))
