"""What the MCP server tells its operators of each tool call: the metrics (:mod:`.metrics`, HTTP only) and the
audit log (``execspace mcp --audit-log FILE``, docs/operations.md "Audit log") listen to one :class:`ToolCall`
per call, told after the tool ran and before its result goes back to the client.

An audit line names the tool's action by what it did (``command.run``, ``file.write``, ``policy.refusal``…) with
the workspace, the ``key_id`` of the bearer token (HTTP; none over stdio) and what the action touched: the command
line, a path and a size, an exit code; never a file's content, an environment value, stdin, or the token.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..audit import AuditSink, AuditValue

__all__ = ["REFUSALS", "CallListener", "McpAudit", "ToolCall"]

#: The errors of a call the server's policy refused (a command not allowed, a path out of bounds, a capability the
#: backend does not enforce, a limit): told as ``policy.refusal``.
REFUSALS = frozenset({"PolicyViolation", "PathDenied", "CapabilityError", "LimitExceeded"})


@dataclass(frozen=True, slots=True)
class ToolCall:
    tool: str
    workspace: str | None
    arguments: Mapping[str, Any]
    """As the client sent them (``workspace_id`` aside): a listener takes names, paths and sizes from them."""
    result: Mapping[str, Any]
    """The tool's JSON result (``status``, ``error_type``…)."""
    duration: float
    key_id: str | None

    @property
    def outcome(self) -> str:
        return "error" if self.result.get("status") == "error" else "ok"


CallListener = Callable[[ToolCall], None]


class McpAudit:
    """Writes one line per tool call to ``sink`` (:class:`CallListener`)."""

    def __init__(self, sink: AuditSink) -> None:
        self._sink = sink

    def __call__(self, call: ToolCall) -> None:
        event, fields = _line(call)
        self._sink.record(event, {"workspace": call.workspace, "key_id": call.key_id, "tool": call.tool, **fields})


def _line(call: ToolCall) -> tuple[str, dict[str, AuditValue]]:
    args, result = call.arguments, call.result
    if call.outcome == "error":
        failed: dict[str, AuditValue] = {
            "error_type": str(result.get("error_type", "")),
            "reason": _text(result, "error"),
        }
        return ("policy.refusal" if failed["error_type"] in REFUSALS else "tool.error"), failed
    match call.tool:
        case "workspace_exec":
            env = args.get("env")
            run: dict[str, AuditValue] = {"command": _text(args, "command"), "cwd": _text(args, "cwd")}
            run["env_names"] = sorted(env) if isinstance(env, dict) else []
            run["exit_code"] = result.get("exit_code") if isinstance(result.get("exit_code"), int) else None
            run["status"] = _text(result, "status")
            return "command.run", run
        case "run_code":
            code = args.get("code")
            size = len(code.encode()) if isinstance(code, str) else 0
            return "cell.execute", {"language": _text(args, "language"), "code_bytes": size}
        case "write_file" | "upload_file":
            wrote: dict[str, AuditValue] = {"path": _text(result, "path"), "size": _int(result, "size")}
            if call.tool == "upload_file":
                wrote["host_path"] = _text(result, "host_path")
            return "file.write", wrote
        case "remove_file":
            return "file.remove", {"path": _text(result, "path")}
        case "workspace_create":
            return "workspace.create", {"created": bool(result.get("created"))}
        case "workspace_close":
            return "workspace.close", {}
        case _:
            return "tool.call", {}


def _text(found: Mapping[str, Any], key: str) -> str:
    value = found.get(key)
    return value if isinstance(value, str) else ""


def _int(found: Mapping[str, Any], key: str) -> int | None:
    value = found.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None
