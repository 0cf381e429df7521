"""envd's plain HTTP file API: ``GET /files`` downloads, ``POST /files`` uploads (multipart, one part per file, or
a raw octet-stream body, gzip allowed), both binary-safe, and the signatures of pre-signed file URLs.

A signed URL (``Sandbox.download_url``/``upload_url`` of a secured sandbox) carries no sandbox id: its signature,
a hash over the path, operation, user, expiry and the sandbox's access token, is what names the sandbox.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import posixpath
import time
import zlib
from collections.abc import Iterable
from typing import Literal

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import PathDenied, UsageError
from ..models import PutFile
from .control import error_response
from .paths import check_user, to_sdk, to_workspace
from .sandboxes import Sandbox, Sandboxes

__all__ = ["FilesAPI", "SignatureError", "signature_matches", "signed_sandbox"]

Operation = Literal["read", "write"]
_MAX_PARTS = 1000


class SignatureError(Exception):
    """A signed file URL that no live sandbox signed, or one past its expiry."""


class TooLarge(Exception):
    pass


def signature_matches(
    signature: str, path: str, operation: Operation, user: str, token: str, expiration: str | None
) -> bool:
    raw = f"{path}:{operation}:{user}:{token}" + (f":{expiration}" if expiration else "")
    digest = base64.b64encode(hashlib.sha256(raw.encode()).digest()).rstrip(b"=").decode()
    return hmac.compare_digest(signature.encode(), f"v1_{digest}".encode())


def signed_sandbox(request: Request, candidates: Iterable[Sandbox]) -> Sandbox:
    """The sandbox whose token signed this file URL; raise :class:`SignatureError` if none did or it expired."""
    query = request.query_params
    operation: Operation = "read" if request.method == "GET" else "write"
    expiration = query.get("signature_expiration")
    signature = query.get("signature", "")
    args = (query.get("path", ""), operation, query.get("username", ""))
    for sandbox in candidates:
        assert sandbox.access_token is not None
        if signature_matches(signature, *args, sandbox.access_token, expiration):
            if expiration is not None and (not expiration.isdigit() or int(expiration) < time.time()):
                raise SignatureError("signature is already expired")
            return sandbox
    raise SignatureError("invalid signature: no live sandbox signed this URL (it may have been killed)")


class FilesAPI:
    def __init__(self, sandboxes: Sandboxes) -> None:
        self.sandboxes = sandboxes

    async def download(self, request: Request, sandbox: Sandbox) -> Response:
        path = request.query_params.get("path")
        if not path:
            return error_response(400, "GET /files needs a path query parameter")
        try:
            check_user(request.query_params.get("username"))
            found = await sandbox.engine.fs.read_file(sandbox.workspace, to_workspace(path))
        except FileNotFoundError:
            return error_response(404, f"file {path!r} does not exist")
        except (IsADirectoryError, NotADirectoryError):
            return error_response(400, f"path {path!r} is a directory, not a file")
        except (UsageError, PathDenied) as exc:
            return error_response(400, str(exc))
        return Response(found.content, media_type="application/octet-stream")

    async def upload(self, request: Request, sandbox: Sandbox) -> Response:
        try:
            check_user(request.query_params.get("username"))
            content_type = request.headers.get("content-type", "")
            if content_type.startswith("multipart/form-data"):
                files = await self._multipart(request)
            else:
                path = request.query_params.get("path")
                if not path:
                    return error_response(400, "an octet-stream upload needs a path query parameter")
                files = [(path, await self._body(request))]
            if not files:
                return error_response(400, "the upload holds no file (multipart parts must be named 'file')")
            puts = [PutFile(to_workspace(path), data) for path, data in files]
            await sandbox.engine.fs.put_files(sandbox.workspace, puts)
        except TooLarge:
            return error_response(
                413, f"a file is larger than this server takes ({self.sandboxes.options.max_upload_bytes} bytes)"
            )
        except (UsageError, PathDenied, MultiPartException, zlib.error) as exc:
            return error_response(400, str(exc))
        except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
            return error_response(400, f"cannot write there: {exc.strerror}")
        written = [to_sdk(p.path) for p in puts]
        return JSONResponse([{"name": posixpath.basename(p), "type": "file", "path": p} for p in written])

    async def _multipart(self, request: Request) -> list[tuple[str, bytes]]:
        limit = self.sandboxes.options.max_upload_bytes
        single_path = request.query_params.get("path")
        async with request.form(max_files=_MAX_PARTS, max_fields=_MAX_PARTS) as form:
            parts = [v for k, v in form.multi_items() if k == "file" and isinstance(v, UploadFile)]
            files = []
            for part in parts:
                # one file: the query names its path; several: each part's filename is its full path
                path = single_path if single_path and len(parts) == 1 else part.filename
                if not path:
                    raise UsageError("a multipart file part has no filename to write it to")
                if part.size is not None and part.size > limit:
                    raise TooLarge
                files.append((path, await part.read()))
        return files

    async def _body(self, request: Request) -> bytes:
        limit = self.sandboxes.options.max_upload_bytes
        gzipped = request.headers.get("content-encoding", "").lower() == "gzip"
        inflate = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if gzipped else None
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            # bounded inflation: a small gzip body must not become more than the limit in memory
            data = inflate.decompress(chunk, limit + 1 - size) if inflate else chunk
            size += len(data)
            if size > limit or (inflate is not None and inflate.unconsumed_tail):
                raise TooLarge
            chunks.append(data)
        if inflate is not None:
            chunks.append(inflate.flush())
            if not inflate.eof:
                raise UsageError("the gzip body ended before its end of stream")
        return b"".join(chunks)
