"""The file tools of the MCP server: write, read, list and remove workspace files, upload a host file."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import InvalidSpec, LimitExceeded, PathDenied
from ..models import FileKind, InputSpec, PutFile, Workspace
from ..protocols import Engine
from ..tools import ToolSpec, WorkspaceIO
from ..workspace.hostroots import HostRoots
from ..workspace.metadata import refuse_record
from .content import IMAGE_TYPES
from .paths import BASE_RULE, in_workspace

__all__ = ["FileTools"]

#: Entries list_files returns at most.
MAX_LISTED = 500

_PATH = {
    "type": "string",
    "minLength": 1,
    "maxLength": 4096,
    "description": "Path relative to work/, where commands run (what ls shows there), e.g. inputs/data.csv, "
    "data.csv or ../out/plot.png for a result; or the program's absolute path (/workspace/out/plot.png).",
}
_ENCODING = {
    "type": "string",
    "enum": ["text", "base64"],
    "default": "text",
    "description": "text: UTF-8 text; base64: the bytes, base64-encoded (for binary files).",
}


class FileTools:
    """write_file, read_file, list_files, remove_file and upload_file over one engine, with a size cap."""

    def __init__(self, engine: Engine, *, max_file_bytes: int, upload_roots: Sequence[Path]) -> None:
        self.engine = engine
        self.max_file_bytes = max_file_bytes
        self.upload_roots = HostRoots(upload_roots)

    def specs(self) -> list[ToolSpec]:
        cap = self.max_file_bytes
        specs = [
            ToolSpec(
                "write_file",
                f"Write a file into the workspace (parent directories are made; an existing file is replaced). "
                f"Paths are relative to work/, where commands run: inputs/x.csv is what ls shows as inputs/. "
                f"At most {cap} bytes.",
                _object(
                    {
                        "path": _PATH,
                        "content": {"type": "string", "description": "The content, as `encoding` says."},
                        "encoding": _ENCODING,
                        "executable": {"type": "boolean", "default": False, "description": "Make it executable."},
                    },
                    ["path", "content"],
                ),
            ),
            ToolSpec(
                "read_file",
                f"Read a workspace file as UTF-8 text or base64 bytes; an image also comes back as an image. "
                f"At most {cap} bytes: give max_bytes to read the start of a larger file.",
                _object(
                    {
                        "path": _PATH,
                        "encoding": _ENCODING,
                        "max_bytes": {
                            "type": "integer",
                            "minimum": 0,
                            "maximum": cap,
                            "description": "Read only the first max_bytes bytes (the result says truncated).",
                        },
                    },
                    ["path"],
                ),
            ),
            ToolSpec(
                "list_files",
                f"List workspace entries (path, kind, size) matching glob patterns (** crosses directories), "
                f"at most {MAX_LISTED}. Default: everything under work/ (where commands run) and ../out/.",
                _object(
                    {
                        "patterns": {
                            "type": "array",
                            "items": {"type": "string", "minLength": 1},
                            "maxItems": 32,
                            "description": "Globs relative to work/, e.g. ['*.csv', 'inputs/**', '../out/**'].",
                        }
                    },
                    [],
                ),
            ),
            ToolSpec(
                "remove_file",
                "Remove a file, a link or a whole directory tree from the workspace.",
                _object({"path": _PATH}, ["path"]),
            ),
        ]
        if self.upload_roots.roots:
            roots = ", ".join(str(r) for r in self.upload_roots.roots)
            specs.append(
                ToolSpec(
                    "upload_file",
                    f"Copy a file from the host into the workspace (default inputs/<name> under work/). Only files "
                    f"under these host directories may be read: {roots}. At most {cap} bytes.",
                    _object(
                        {
                            "host_path": {"type": "string", "minLength": 1, "description": "Absolute host path."},
                            "path": {**_PATH, "description": "Destination, relative to work/ (default inputs/)."},
                        },
                        ["host_path"],
                    ),
                )
            )
        return specs

    async def write_file(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        data = _decode(args["content"], args["encoding"])
        self._check_size(len(data), args["path"])
        mode = 0o755 if args["executable"] else 0o644
        path = in_workspace(ws, args["path"])
        refuse_record(path)
        _writable(path, args["path"])
        await self.engine.fs.put_files(ws, [PutFile(path, data, mode)])
        return {"status": "ok", "path": path, "size": len(data)}

    async def read_file(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        limit = args.get("max_bytes")
        file = await self.engine.fs.read_file(
            ws, in_workspace(ws, args["path"]), max_bytes=self.max_file_bytes if limit is None else limit
        )
        if limit is None and file.size_bytes > self.max_file_bytes:
            raise LimitExceeded(
                f"{args['path']!r} is {file.size_bytes} bytes, more than read_file's {self.max_file_bytes}-byte cap: "
                "give max_bytes to read its start, or look into it with workspace_exec (head, tail, grep)"
            )
        out: dict[str, Any] = {"status": "ok", "path": file.name, "size": file.size_bytes, "mime_type": file.mime_type}
        if args["encoding"] == "text" and file.mime_type in IMAGE_TYPES and not file.truncated:
            out["note"] = "an image: its bytes come back as image content (encoding=base64 gives them as text)"
        elif args["encoding"] == "base64":
            out["content_base64"] = base64.b64encode(file.content).decode("ascii")
        else:
            try:
                out["content"] = file.content.decode("utf-8")
            except UnicodeDecodeError:
                if not file.truncated:
                    raise InvalidSpec(f"{args['path']!r} is not UTF-8 text; read it with encoding=base64") from None
                # a cut may split the last character: keep the whole ones
                out["content"] = file.content.decode("utf-8", errors="ignore")
        out["truncated"] = file.truncated
        return out

    async def list_files(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        patterns = [in_workspace(ws, p) for p in args.get("patterns") or ["**", "../out/**"]]
        entries = await self.engine.fs.list(ws, patterns)
        listed = [
            {"path": e.path, "kind": e.kind.value, **({"size": e.size} if e.kind is FileKind.FILE else {})}
            for e in entries[:MAX_LISTED]
        ]
        out: dict[str, Any] = {"status": "ok", "entries": listed}
        if len(entries) > MAX_LISTED:
            out["entries_not_listed"] = len(entries) - MAX_LISTED
        return out

    async def remove_file(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        path = in_workspace(ws, args["path"])
        refuse_record(path)
        _writable(path, args["path"])
        await self.engine.fs.remove(ws, path)
        return {"status": "ok", "path": path, "removed": True}

    async def upload_file(self, ws: Workspace, args: Mapping[str, Any]) -> dict[str, Any]:
        raw = args["host_path"]
        if not os.path.isabs(raw):
            raise PathDenied(raw, "host_path must be absolute")
        real = self.upload_roots.check(raw)
        size = os.stat(real).st_size
        self._check_size(size, raw)
        dest = in_workspace(ws, args["path"]) if args.get("path") else None
        # the engine opens the source again by walking from its host roots, never through a link
        staged = await WorkspaceIO(self.engine, ws).stage_inputs([InputSpec(f"host://{real}", dest)])
        return {"status": "ok", "host_path": raw, "path": staged[0] if staged else dest, "size": size}

    def _check_size(self, size: int, what: str) -> None:
        if size > self.max_file_bytes:
            raise LimitExceeded(
                f"{what!r} is {size} bytes, more than the {self.max_file_bytes}-byte file cap of this server "
                "(max_file_bytes in its config)"
            )


def _writable(rel: str, given: str) -> None:
    """Refuse the workspace's own top level (read-only to programs and tools alike), saying what paths are."""
    if "/" not in rel:
        raise PathDenied(given, f"that is the workspace's top level, which only execspace writes: {BASE_RULE}")


def _decode(content: str, encoding: str) -> bytes:
    if encoding == "text":
        return content.encode("utf-8")
    try:
        return base64.b64decode(content, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSpec("content is not valid base64 (standard alphabet, with padding)") from None


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
