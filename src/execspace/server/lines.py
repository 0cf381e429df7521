"""The output lines of E2B's ``/execute`` stream that every kind of context makes alike."""

from __future__ import annotations

from typing import Any

__all__ = ["RESULT_FIELDS", "error_line", "result_line"]

#: Jupyter MIME type → the field of E2B's ``result`` line.
RESULT_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}


def result_line(data: dict[str, Any], *, main: bool) -> dict[str, Any]:
    """E2B's ``result`` line of one display (MIME type → payload)."""
    line: dict[str, Any] = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, payload in data.items():
        name = RESULT_FIELDS.get(mime)
        value = "".join(payload) if isinstance(payload, list) and mime != "application/json" else payload
        if name is None:
            extra[mime] = value
        elif name == "text" and isinstance(value, str) and len(value) > 1 and value[0] == value[-1] in "'\"":
            line[name] = value[1:-1]  # E2B gives a string result without its repr quotes
        else:
            line[name] = value
    if extra:
        line["extra"] = extra
    return line


def error_line(name: str, value: str, traceback: str = "") -> dict[str, Any]:
    return {"type": "error", "name": name, "value": value, "traceback": traceback or f"{name}: {value}"}
