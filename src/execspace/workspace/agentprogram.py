"""The file agent (:mod:`.fileagent`) asked one question as a program of a workspace: how the sandbox's file API
beyond the workspace and serve's file API outside a sandbox's home reach what only the program's view holds, with
the program's permissions. One run per question: the agent reads the request on stdin and answers on stdout."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..errors import BackendError, LimitExceeded
from ..models import ResourceLimits, RunProgramSpec, RunResult
from .fileagent import agent_text

__all__ = ["MAX_ENTRIES", "PIECE_BYTES", "agent_answer", "agent_program"]

_AGENT = agent_text()
#: Bytes of a file one agent run reads or writes (its answer, in base64, stays under the run's output cap).
PIECE_BYTES = 768 * 1024
_OUTPUT_BYTES = 2 * 1024 * 1024
#: Seconds one agent run may take.
_TIMEOUT = 60.0
#: Entries a listing by the agent gives at most.
MAX_ENTRIES = 100_000


def agent_program(
    op: str, args: Mapping[str, object], *, env: Mapping[str, str] | None = None, cwd: str = "work"
) -> RunProgramSpec:
    """The run that asks the agent ``op`` with ``args`` (paths relative to the view's root), without network."""
    request = json.dumps({"op": op, "args": {"ws": "/", **args}}) + "\n"
    return RunProgramSpec(
        "python3",
        ("-I", "-S", "-c", _AGENT, str(_TIMEOUT)),
        env=env or {},
        cwd=cwd,
        stdin=request,
        timeout=_TIMEOUT,
        network="off",
        limits=ResourceLimits(output_bytes=_OUTPUT_BYTES),
    )


def agent_answer(result: RunResult, *, subject: str, on: str, fix: str) -> dict[str, Any]:
    """The agent's answer in ``result``: ``{"ok": value}`` or ``{"error": [kind, path, why]}``. ``subject`` and
    ``on`` say what was asked in the messages (``"for /etc"`` / ``" on /etc"``), ``fix`` what to do when the agent
    did not run.

    Raises:
        LimitExceeded: the answer was over the output cap, or the agent over its time.
        BackendError: the agent failed (no python3 where the program runs).
    """
    if result.stdout_truncated:
        raise LimitExceeded(
            f"the answer {subject} is more than {_OUTPUT_BYTES // (1024 * 1024)} MiB (the file agent's cap): "
            "list a smaller directory or fewer levels (depth)"
        )
    if result.timed_out:
        raise LimitExceeded(f"the file agent took more than {_TIMEOUT:.0f}s{on}: ask for less at once")
    lines = result.stdout.splitlines()
    if result.exit_code != 0 or not lines:
        raise BackendError(
            f"the sandbox's file agent failed{on} (exit {result.exit_code}: {result.stderr.strip()[-300:]}); {fix}"
        )
    answer: dict[str, Any] = json.loads(lines[-1])
    return answer
