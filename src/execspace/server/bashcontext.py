"""bash contexts of the code interpreter: one bash per context, in the sandbox's own session, running each cell in
the same shell so that its working directory, variables, functions and options carry over to the next cell.

Cells come in on the shell's stdin as NUL-terminated records (a cell's id, what sets its ``env_vars``, its code,
what restores them), which the driver reads from a descriptor of its own: the cell's commands read ``/dev/null``.
Each cell's end is a ``done`` record with its status (:mod:`.recordprocess`), written after it on both stdout and
stderr; everything else the shell writes is the cell's output.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from ..errors import UsageError
from ..protocols import ProgramRunner
from .lines import error_line
from .recordprocess import RecordProcess
from .sandboxes import Sandbox

__all__ = ["BashContext"]

#: Reads the cells from fd 3 (the commands get /dev/null), runs each with ``eval`` in the shell itself, and marks its
#: end. An interrupt (SIGINT) stops the running command; the trap keeps the shell, which goes on with the cell.
_DRIVER = r"""exec 3<&0 0</dev/null
trap ':' INT
while IFS= read -r -d '' __execspace_id <&3 && IFS= read -r -d '' __execspace_set <&3 &&
      IFS= read -r -d '' __execspace_code <&3 && IFS= read -r -d '' __execspace_reset <&3; do
  eval "$__execspace_set"
  eval "$__execspace_code"
  __execspace_status=$?
  eval "$__execspace_reset"
  printf '\036%s done %d\n' "$__execspace_id" "$__execspace_status"
  printf '\036%s done %d\n' "$__execspace_id" "$__execspace_status" >&2
done
"""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class BashContext(RecordProcess):
    """A started bash and what it writes."""

    DIED = "the bash context's shell exited (a cell's exit ends it); the next cell starts a fresh one, state lost"

    @classmethod
    async def start(cls, runner: ProgramRunner, sandbox: Sandbox, cwd: str) -> BashContext:
        args = ("--noprofile", "--norc", "-c", _DRIVER)
        return cls(await runner.start_program(sandbox.workspace, sandbox.context_process("bash", args, cwd, _TAG)))

    def _message(self, cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
        return _request(cell_id, code, env_vars)

    def _closing_lines(self) -> list[dict[str, Any]]:
        """An ``ExitCode`` error when the cell ended with a status other than 0."""
        fields = self._done["stdout"]
        status = int(fields[0]) if fields and fields[0].isdigit() else 0  # a forged end may say anything
        return [error_line("ExitCode", str(status), f"the cell exited with status {status}")] if status else []


_TAG = "execspace-bash-context"


def _request(cell_id: str, code: str, env_vars: Mapping[str, str]) -> bytes:
    """The cell's records; its ``env_vars`` are exported before it and put back as they were after it."""
    for name in env_vars:
        if not _NAME.fullmatch(name):
            raise UsageError(f"env var name {name!r} is not a shell variable name: use letters, digits and _")
    saved = {name: f"__execspace_saved_{name}" for name in env_vars}
    set_env = "".join(
        f'{keep}=("${{{name}+set}}" "${{{name}-}}"); export {name}={shlex.quote(env_vars[name])}\n'
        for name, keep in saved.items()
    )
    reset = "".join(
        f'if [ -n "${{{keep}[0]}}" ]; then export {name}="${{{keep}[1]}}"; else unset {name}; fi; unset {keep}\n'
        for name, keep in saved.items()
    )
    return b"".join(part.encode() + b"\0" for part in (cell_id, set_env, code.replace("\0", ""), reset))
