"""A tool result as MCP content (the ``CallToolResult`` as it goes on the wire, the same for both SDK majors): its
JSON as text, then the images it produced as image content, small text files as embedded resources; the result
itself is the structured content too."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from ..errors import ExecspaceError
from ..models import Workspace
from ..protocols import Engine
from .paths import shown

__all__ = ["IMAGE_TYPES", "render"]

#: Image types MCP clients show to the model.
IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Images and text files attached to one result at most (newest output first is the model's concern: these are
#: the files this call created or changed, never older ones).
MAX_ATTACHED = 8
#: Largest text file attached as an embedded resource.
MAX_TEXT_ATTACHED = 64 * 1024
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml", "image/svg+xml")


Block = dict[str, Any]


async def render(
    engine: Engine, ws: Workspace | None, result: Mapping[str, Any], *, max_image_bytes: int
) -> dict[str, Any]:
    """``result`` (its paths workspace-relative) as a ``CallToolResult``, naming its paths as the tools take them."""
    named = _shown_paths(result)
    content: list[Block] = [{"type": "text", "text": json.dumps(named, ensure_ascii=False)}]
    if ws is not None:
        content.extend(await _attachments(engine, ws, result, max_image_bytes))
    return {"content": content, "structuredContent": named, "isError": result.get("status") == "error"}


def _shown_paths(result: Mapping[str, Any]) -> dict[str, Any]:
    """``result`` with the workspace paths it names (its ``path``, those of its ``files`` and ``entries``) relative
    to ``work/``, as the model gives them back."""
    out = dict(result)
    if isinstance(out.get("path"), str):
        out["path"] = shown(out["path"])
    for key in ("files", "entries"):
        listed = out.get(key)
        if isinstance(listed, list):
            out[key] = [
                {**f, "path": shown(f["path"])} if isinstance(f, Mapping) and isinstance(f.get("path"), str) else f
                for f in listed
            ]
    return out


async def _attachments(engine: Engine, ws: Workspace, result: Mapping[str, Any], max_image_bytes: int) -> list[Block]:
    files = [f for f in result.get("files", ()) if isinstance(f, Mapping) and isinstance(f.get("path"), str)]
    if isinstance(result.get("path"), str) and result.get("mime_type") in IMAGE_TYPES:
        files.append({"path": result["path"], "mime_type": result["mime_type"], "size": result.get("size", 0)})
    out: list[Block] = []
    for f in files:
        if len(out) >= MAX_ATTACHED:
            break
        block = await _attachment(engine, ws, f, max_image_bytes)
        if block is not None:
            out.append(block)
    return out


async def _attachment(engine: Engine, ws: Workspace, f: Mapping[str, Any], max_image_bytes: int) -> Block | None:
    mime = str(f.get("mime_type", ""))
    size = f.get("size", 0)
    is_image = mime in IMAGE_TYPES
    is_text = mime.startswith(_TEXT_TYPES)
    cap = max_image_bytes if is_image else MAX_TEXT_ATTACHED
    if not (is_image or is_text) or not isinstance(size, int) or size > cap:
        return None
    try:
        file = await engine.fs.read_file(ws, f["path"], max_bytes=cap)
    except (ExecspaceError, OSError):
        return None  # gone or replaced since the call: the JSON still lists it
    if file.truncated:
        return None
    if is_image:
        return {"type": "image", "data": base64.b64encode(file.content).decode("ascii"), "mimeType": mime}
    uri = f"execspace://workspace/{quote(ws.id, safe='')}/{quote(file.name)}"
    return {"type": "resource", "resource": {"uri": uri, "mimeType": mime, "text": file.text}}
