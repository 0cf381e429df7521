"""The ``outputSchema`` of the tools that return data: what their structured content holds when they succeed.

Clients check a result's structured content against it (an error result, ``isError``, is not checked), so each
schema names the fields a success always or sometimes has, with their types, and leaves the rest open: a field
added later must not make an older client refuse a result.
"""

from __future__ import annotations

from typing import Any

__all__ = ["output_schema"]

_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}
_FILES = {
    "type": "array",
    "description": "Files this call created or changed, relative to work/ (results are ../out/...).",
    "items": {
        "type": "object",
        "properties": {"path": _STR, "size": _INT, "mime_type": _STR, "change": _STR},
        "required": ["path"],
    },
}
_IN_WORKSPACE = {"workspace_id": {**_STR, "description": "The workspace this call ran in: pass it back."}}


def _result(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": {"status": _STR, **properties}, "required": ["status", *required]}


_SCHEMAS: dict[str, dict[str, Any]] = {
    "workspace_create": _result({"workspace_id": _STR, "created": _BOOL}, ("workspace_id", "created")),
    "workspace_list": _result(
        {
            "backend": _STR,
            "isolation": _STR,
            "workspaces": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"workspace_id": _STR, "idle_sec": {"type": "number"}},
                    "required": ["workspace_id", "idle_sec"],
                },
            },
        },
        ("backend", "isolation", "workspaces"),
    ),
    "workspace_exec": _result(
        {
            **_IN_WORKSPACE,
            "exit_code": {"type": ["integer", "null"]},
            "timed_out": _BOOL,
            "duration_sec": {"type": "number"},
            "stdout": _STR,
            "stderr": _STR,
            "session_id": _STR,
            "output": _STR,
            "files": _FILES,
        }
    ),
    "run_code": _result(
        {**_IN_WORKSPACE, "output": _STR, "output_truncated": _BOOL, "output_total_bytes": _INT, "files": _FILES},
        ("output",),
    ),
    "read_file": _result(
        {**_IN_WORKSPACE, "path": _STR, "size": _INT, "mime_type": _STR, "content": _STR, "content_base64": _STR},
        ("path", "size"),
    ),
    "list_files": _result(
        {
            **_IN_WORKSPACE,
            "entries": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"path": _STR, "kind": _STR, "size": _INT},
                    "required": ["path", "kind"],
                },
            },
        },
        ("entries",),
    ),
}


def output_schema(tool: str) -> dict[str, Any] | None:
    """The output schema of ``tool``, or ``None`` for a tool whose result is only an acknowledgement."""
    return _SCHEMAS.get(tool)
