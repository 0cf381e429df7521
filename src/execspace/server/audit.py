"""The audit log of ``execspace serve`` (``--audit-log FILE``, docs/operations.md "Audit log"): a listener of the
server's events (:mod:`.events`) writing one line per event to an :class:`~execspace.audit.AuditSink`, at once,
so the line is written before the action's answer goes back.

Every line names its ``sandbox`` and the ``key_id`` of the API key that created it (an admin's kill: the
killer's is not known here, the sandbox's owner is named). A node's server of ``serve --ray`` adds its ``node``
(docs/cluster.md)."""

from __future__ import annotations

from collections.abc import Mapping

from ..audit import AuditSink, AuditValue
from .events import (
    CellExecuted,
    CommandEnded,
    CommandStarted,
    EgressAttempted,
    FileChanged,
    Refused,
    SandboxChanged,
    ServerEvent,
)

__all__ = ["ServerAudit"]


class ServerAudit:
    """Call it with each event (:class:`.events.Events` listener)."""

    def __init__(self, sink: AuditSink, extra: Mapping[str, AuditValue] | None = None) -> None:
        """``extra``: fields of every line (a node's server: its Ray ``node`` id)."""
        self._sink = sink
        self._extra = dict(extra or {})

    def __call__(self, event: ServerEvent) -> None:
        name, fields = _line(event)
        self._sink.record(name, {**fields, **self._extra} if self._extra else fields)


def _line(event: ServerEvent) -> tuple[str, dict[str, AuditValue]]:
    match event:
        case CommandStarted():
            started: dict[str, AuditValue] = {"pid": event.pid, "argv": list(event.argv), "user": event.user}
            started.update(cwd=event.cwd, env_names=list(event.env_names))
            return "command.start", _of(event.sandbox, event.key_id, started)
        case CommandEnded():
            ended: dict[str, AuditValue] = {"pid": event.pid, "argv": list(event.argv), "exit_code": event.exit_code}
            ended.update(outcome=event.outcome, duration_s=round(event.duration, 6), limit_hit=event.limit_hit)
            return "command.end", _of(event.sandbox, event.key_id, ended)
        case FileChanged():
            changed: dict[str, AuditValue] = {"path": event.path}
            if event.size is not None:
                changed["size"] = event.size
            if event.to is not None:
                changed["to"] = event.to
            return f"file.{event.kind}", _of(event.sandbox, event.key_id, changed)
        case EgressAttempted():
            attempt: dict[str, AuditValue] = {"pid": event.pid, "host": event.host, "port": event.port}
            attempt["reason"] = event.reason
            return f"egress.{'allowed' if event.allowed else 'denied'}", _of(event.sandbox, event.key_id, attempt)
        case Refused():
            return "policy.refusal", _of(event.sandbox, event.key_id, {"what": event.what, "reason": event.reason})
        case CellExecuted():
            cell: dict[str, AuditValue] = {"context": event.context, "language": event.language}
            cell["code_bytes"] = event.code_bytes
            return "cell.execute", _of(event.sandbox, event.key_id, cell)
        case SandboxChanged():
            return f"sandbox.{event.kind}", _of(event.sandbox, event.key_id, {"template": event.template})


def _of(sandbox: str | None, key: str, fields: dict[str, AuditValue]) -> dict[str, AuditValue]:
    return {"sandbox": sandbox, "key_id": key, **fields}
