"""envd's plain HTTP file API: ``GET /files`` downloads, ``POST /files`` uploads (multipart, one part per file, or
a raw octet-stream body, gzip allowed), both binary-safe, and the signatures of pre-signed file URLs.

Nothing is held whole: a download streams from the opened file (anything but a regular file is refused before a
byte is read), an upload is parsed as it arrives and written a chunk at a time to a new file beside its target,
which replaces the target only once the file's last byte came. The size cap holds as the bytes come: past it the
answer is 413 at once and the connection is closed rather than read further. The caller was authenticated before
any of this runs (:mod:`.app`).

A signed URL (``Sandbox.download_url``/``upload_url`` of a secured sandbox) carries no sandbox id: its signature,
a hash over the path, operation, user, expiry and the sandbox's access token, is what names the sandbox. An upload
that carries a signature writes the signed path and nothing else.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import posixpath
import time
import zlib
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from typing import Literal

from python_multipart.exceptions import FormParserError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..errors import LimitExceeded, PathDenied, UsageError
from ..models import PutFile, Workspace
from ..protocols import FileReader, SupportsFileMetadata, SupportsFileStreams, WorkspaceFS
from ..workspace import check_file_metadata
from .control import error_response
from .events import Events, FileChanged
from .paths import HOME_DIR, PathOutsideHome, check_user, to_sdk
from .sandboxes import Sandbox, Sandboxes
from .shares import BODY_UNIT, SandboxShare, ShareExhausted
from .streams import CountedStream
from .uploads import MultipartBody, decoded_body, drain_body
from .wholeview import SandboxView

__all__ = ["FilesAPI", "SignatureError", "signature_matches", "signed_sandbox"]

Operation = Literal["read", "write"]
_MAX_PARTS = 1000
_METADATA_HEADER = "x-metadata-"
#: A refused upload's body may not have been read to the end: over HTTP/1 its connection goes, rather than the rest
#: being read (and thrown away) to keep it. HTTP/2 has no such header (h2 leaves it out): flow control stops there.
_CLOSE = {"Connection": "close"}


class SignatureError(Exception):
    """A signed file URL that no live sandbox signed, or one past its expiry."""


class _NotBuilt(Exception):
    """What this server's backend cannot do for an upload (501)."""


class _Forbidden(Exception):
    """An upload its credential does not admit (a signed one naming another path, or more than one file)."""


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

    def _streams(self, sandbox: Sandbox) -> SupportsFileStreams:
        fs = sandbox.engine.fs
        if isinstance(fs, SupportsFileStreams):
            return fs
        return _WholeFiles(fs, self.sandboxes.options.max_upload_bytes)

    async def download(self, request: Request, sandbox: Sandbox) -> Response:
        path = request.query_params.get("path")
        if not path:
            return error_response(400, "GET /files needs a path query parameter")
        try:
            check_user(request.query_params.get("username"))
            sandbox.share.streams.take()
        except ShareExhausted as exc:
            return error_response(429, str(exc))
        except UsageError as exc:
            return error_response(400, str(exc))
        try:
            async with sandbox.share.file_op():
                view = SandboxView(sandbox, self._streams(sandbox))
                reader = await view.open_reader(view.path(path))
        except BaseException as exc:
            sandbox.share.streams.give_back()
            return _refused_download(exc, path)
        headers = {"Content-Length": str(reader.size)}
        content = _streamed(reader, sandbox.share)
        return CountedStream(content, sandbox.share.streams, media_type="application/octet-stream", headers=headers)

    async def upload(self, request: Request, sandbox: Sandbox) -> Response:
        answer = await self._answer_upload(request, sandbox)
        if answer.status_code >= 400 and answer.status_code != 413:
            # a body refused part-way (a full disk) or before it was read (its user, the sandbox's share): read to
            # its end (bounded), or closing the connection with it unread could reset the answer away before the
            # client reads it. One past the cap is never read further (413).
            await drain_body(request, unstarted=answer.status_code != 507)
        return answer

    async def _answer_upload(self, request: Request, sandbox: Sandbox) -> Response:
        limit = self.sandboxes.options.max_upload_bytes
        try:
            check_user(request.query_params.get("username"))
            with sandbox.share.streams.holding():
                written = await self._upload(request, sandbox, limit)
        except ShareExhausted as exc:
            return error_response(429, str(exc), _CLOSE)
        except LimitExceeded:
            message = f"a file is larger than this server takes ({limit} bytes; serve's --max-upload-mb sets it)"
            return error_response(413, message, _CLOSE)
        except _Forbidden as exc:
            return error_response(403, str(exc), _CLOSE)
        except _NotBuilt as exc:
            return error_response(501, str(exc), _CLOSE)
        except PathDenied as exc:
            return error_response(400, _denied(exc), _CLOSE)
        except PermissionError as exc:  # the sandbox's user may not write there (outside the home)
            return error_response(403, f"cannot write there: {exc.strerror or exc}", _CLOSE)
        except (UsageError, FormParserError, zlib.error) as exc:
            return error_response(400, str(exc), _CLOSE)
        except (IsADirectoryError, NotADirectoryError, FileExistsError, FileNotFoundError) as exc:
            # FileNotFoundError: the directory was removed while the file was written into it
            return error_response(400, f"cannot write there: {exc.strerror or exc}", _CLOSE)
        except ClientDisconnect:
            return error_response(400, "the client went away before the upload ended: nothing was written", _CLOSE)
        except OSError as exc:
            if exc.errno == errno.EROFS:  # outside the home: a read-only part of the sandbox's system
                return error_response(403, f"cannot write there: {exc.strerror}", _CLOSE)
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            message = f"the sandbox's disk is full ({exc.strerror}): the file was not written; free some space"
            return error_response(507, message, _CLOSE)
        return JSONResponse([_written(p, m) for p, m in written])

    async def _upload(self, request: Request, sandbox: Sandbox, limit: int) -> list[tuple[str, dict[str, str]]]:
        """Write the request's files; their workspace paths, each with the metadata it was given."""
        path = request.query_params.get("path")
        signed = "signature" in request.query_params
        if signed and not path:
            raise _Forbidden("a signed upload URL names the file it writes (its path parameter); this one names none")
        view = SandboxView(sandbox, self._streams(sandbox))
        write = _Writer(sandbox, view, limit, metadata_headers(request), self.sandboxes.events)
        content_type = request.headers.get("content-type", "")
        if content_type.startswith("multipart/form-data"):
            form = MultipartBody(decoded_body(request), content_type)
            if path:
                await _write_only_part(form, write, path, signed)
            else:
                await _write_parts(form, write)
            return await write.results()
        if not path:
            raise UsageError("an octet-stream upload needs a path query parameter")
        length = request.headers.get("content-length", "")
        if "content-encoding" not in request.headers and length.isdigit() and int(length) > limit:
            raise LimitExceeded(f"the body is {length} bytes")  # refused before a byte of it is read
        await write(write.view.path(path), decoded_body(request))
        return await write.results()


def metadata_headers(request: Request) -> dict[str, str]:
    """The metadata an upload gives its files, as envd reads it: each ``X-Metadata-<key>`` header, its key
    lower-cased, the first of a repeated one; ``UsageError`` for a pair envd's rules refuse."""
    metadata: dict[str, str] = {}
    for name, value in request.headers.raw:
        key = name.decode("latin-1").lower()
        if key.startswith(_METADATA_HEADER) and len(key) > len(_METADATA_HEADER):
            metadata.setdefault(key[len(_METADATA_HEADER) :], value.decode("latin-1"))
    check_file_metadata(metadata)
    return metadata


def _written(path: str, metadata: dict[str, str]) -> dict[str, object]:
    """One file of an upload's answer, as envd's: its metadata left out where it has none."""
    sdk = to_sdk(path)
    found: dict[str, object] = {"name": posixpath.basename(sdk), "type": "file", "path": sdk}
    if metadata:
        found["metadata"] = metadata
    return found


class _Writer:
    """Writes an upload's files one by one, wherever in the sandbox's view they are (:class:`SandboxView`): each
    with the upload's metadata, told to the watches that see it."""

    def __init__(
        self, sandbox: Sandbox, view: SandboxView, limit: int, metadata: dict[str, str], events: Events
    ) -> None:
        if metadata and not isinstance(sandbox.engine.fs, SupportsFileMetadata):
            raise _NotBuilt(
                f"file metadata: this server's {sandbox.engine.name} backend keeps none; upload without X-Metadata-* "
                "headers (the SDK's metadata=)"
            )
        self._sandbox, self.view, self.limit, self._metadata = sandbox, view, limit, metadata
        self._events = events
        self.written: list[str] = []

    async def __call__(self, target: str, chunks: AsyncIterable[bytes]) -> None:
        with self._sandbox.watches.upload(target) as upload:  # a path outside the home is no watch's
            size = await self.view.write_stream(target, chunks, max_bytes=self.limit)
            self.written.append(target)
            if self._events.listening:
                sandbox = self._sandbox
                self._events(FileChanged("write", sandbox.id, sandbox.owner, to_sdk(target), size=size))
            tagged = bool(self._metadata) and await self.view.write_metadata(target, self._metadata)
            if upload.watches:
                upload.wrote(await self.view.stat(target), tagged=tagged)

    async def results(self) -> list[tuple[str, dict[str, str]]]:
        """Each file written, with the metadata it holds now (read back: a filesystem may keep none)."""
        if not self._metadata:
            return [(p, {}) for p in self.written]
        held = await self.view.read_metadata(self.written)
        return list(zip(self.written, held, strict=True))


async def _write_only_part(form: MultipartBody, write: _Writer, path: str, signed: bool) -> None:
    """The upload whose query names its one file: the body's only part, named ``file``, is written there (its own
    file name is not used). Signed, the part must not name another path; any second part is refused, and with
    it the first, which is never written."""
    part = await form.next_part()
    if part is None or part.name != "file":
        if signed:
            raise _Forbidden(f"a signed upload URL writes one file ({path!r}): its body must be one part, named 'file'")
        raise UsageError("the upload holds no file: its multipart part must be named 'file'")
    target = write.view.path(path)
    if signed and not _names_target(write.view, part.filename, target):
        raise _Forbidden(
            f"the upload URL is signed for {path!r} only, and its part names {part.filename!r}: send the file as "
            "that path, or sign a URL for the other one"
        )

    async def only() -> AsyncIterator[bytes]:
        async for chunk in form.data():
            yield chunk
        if await form.next_part() is not None:
            message = f"the upload names one file ({path!r}) but its body holds more than one part"
            if signed:
                raise _Forbidden(f"{message}: a signed URL writes its own path only; sign a URL per file")
            raise UsageError(f"{message}: send several files without the path parameter, each named by its part")

    await write(target, only())


async def _write_parts(form: MultipartBody, write: _Writer) -> None:
    """Each part named ``file`` written to its file name (a path), as it ends; other parts are read past."""
    for _ in range(_MAX_PARTS):
        part = await form.next_part()
        if part is None:
            if not write.written:
                raise UsageError("the upload holds no file (multipart parts must be named 'file')")
            return
        if part.name != "file":
            await _read_past(form.data(), write.limit)
            continue
        if not part.filename:
            raise UsageError("a multipart file part has no filename to write it to")
        await write(write.view.path(part.filename), form.data())
    raise UsageError(f"the upload has more than {_MAX_PARTS} parts; send the files in several uploads")


def _names_target(view: SandboxView, filename: str | None, target: str) -> bool:
    """Whether a signed upload's part names its signed path: none, that path, or only its file name (what a
    browser's form and ``curl -F file=@name`` send)."""
    if not filename or filename == posixpath.basename(target):
        return True
    try:
        return view.path(filename) == target
    except PathOutsideHome:
        return False


def _denied(exc: PathDenied) -> str:
    """A refusal naming the path as the SDK does (``/home/user/...``)."""
    inside = exc.path == HOME_DIR or exc.path.startswith(HOME_DIR + "/")
    return f"path {to_sdk(exc.path) if inside else exc.path!r} denied: {exc.reason}"


async def _read_past(chunks: AsyncIterable[bytes], limit: int) -> None:
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise LimitExceeded(f"a form field is larger than {limit} bytes")


def _refused_download(exc: BaseException, path: str) -> Response:
    """The answer to a download whose file could not be opened (``exc`` raised again if it is no refusal)."""
    if isinstance(exc, FileNotFoundError):
        return error_response(404, f"file {path!r} does not exist")
    if isinstance(exc, IsADirectoryError | NotADirectoryError):
        return error_response(400, f"path {path!r} is a directory, not a file")
    if isinstance(exc, ShareExhausted):
        return error_response(429, str(exc))
    if isinstance(exc, LimitExceeded):
        return error_response(413, str(exc))
    if isinstance(exc, PathDenied):
        return error_response(400, _denied(exc))
    if isinstance(exc, PermissionError):
        return error_response(403, f"cannot read {path!r}: {exc.strerror or exc}")
    if isinstance(exc, UsageError):
        return error_response(400, str(exc))
    raise exc


async def _streamed(reader: FileReader, share: SandboxShare) -> AsyncIterator[bytes]:
    """The file's chunks, each read as one of its sandbox's file operations and sent in its pace (a download takes
    its share of the server, however fast the file reads)."""
    chunks = reader.chunks()
    try:
        while True:
            async with share.file_op():
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            await share.pace(len(chunk) / BODY_UNIT, queued=False)
            yield chunk
    finally:
        await reader.aclose()


class _WholeFiles:
    """File streams over a :class:`WorkspaceFS` without them (the e2b backend's, a remote Jupyter server's): each
    file is held whole, so only up to ``limit`` bytes of it, both ways."""

    def __init__(self, fs: WorkspaceFS, limit: int) -> None:
        self._fs, self._limit = fs, limit

    async def open_reader(self, ws: Workspace, path: str) -> FileReader:
        found = await self._fs.read_file(ws, path, max_bytes=self._limit)
        if found.truncated:
            raise LimitExceeded(
                f"{to_sdk(path)!r} is larger than the {self._limit} bytes this server holds for a download from a "
                "backend without file streams; read it in parts with a command, or serve the sandbox backend"
            )
        return _Held(found.content)

    async def write_stream(
        self, ws: Workspace, path: str, chunks: AsyncIterable[bytes], *, max_bytes: int, mode: int = 0o644
    ) -> int:
        data = bytearray()
        async for chunk in chunks:
            if len(data) + len(chunk) > min(max_bytes, self._limit):
                raise LimitExceeded(f"the file is larger than {min(max_bytes, self._limit)} bytes")
            data += chunk
        await self._fs.put_files(ws, [PutFile(path, bytes(data), mode)])
        return len(data)


class _Held:
    """A file read whole, handed out as a reader."""

    def __init__(self, content: bytes) -> None:
        self.size = len(content)
        self._content = content

    async def chunks(self) -> AsyncIterator[bytes]:
        for start in range(0, self.size, 256 * 1024):
            yield self._content[start : start + 256 * 1024]

    async def aclose(self) -> None:
        self._content = b""
