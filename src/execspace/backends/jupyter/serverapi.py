"""The REST and WebSocket calls remote mode makes to a Jupyter Server or Kernel Gateway, with clear errors.

HTTP and WebSocket go through tornado (installed with jupyter_client and ipykernel). Every request
carries ``Authorization: token …`` (never a ``?token=`` query, which ends up in access logs). Failures
become execspace errors that say what to do: a refused token is :class:`SetupFailed`; a server that
cannot be reached or fails is :class:`BackendError`.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import WebSocketClientConnection, websocket_connect

from ...errors import BackendError, SetupFailed, UsageError

__all__ = ["ServerApi"]

#: Rich outputs (a large PNG in base64) arrive as one message; tornado's default cap is 10 MiB.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class ServerApi:
    """One Jupyter Server or Kernel Gateway at ``url`` (``http(s)://host:port[/base_url]``)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ca_file: str | None = None,
        validate_cert: bool = True,
        request_timeout: float = 30.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UsageError(f"the server URL must be http(s)://host:port[/base_url], got {url!r}")
        self.url = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._ws_url = urlunsplit(
            ("wss" if parts.scheme == "https" else "ws", parts.netloc, parts.path.rstrip("/"), "", "")
        )
        self._token = token
        self._tls: dict[str, Any] = {"validate_cert": validate_cert, "ca_certs": ca_file}
        self._timeout = request_timeout
        self._http = AsyncHTTPClient(force_instance=True)

    def close(self) -> None:
        self._http.close()

    # -- REST ------------------------------------------------------------------------------

    async def kernelspecs(self) -> dict[str, Any]:
        """``GET /api/kernelspecs``: ``{"default": name, "kernelspecs": {name: {"spec": {...}}}}``."""
        body = await self._call("GET", "/api/kernelspecs")
        return body if isinstance(body, dict) else {}

    async def start_kernel(self, name: str, path: str | None = None) -> str:
        """``POST /api/kernels``; ``path`` (relative to the server's root_dir) becomes the kernel's cwd."""
        model: dict[str, Any] = {"name": name}
        if path is not None:
            model["path"] = path
        body = await self._call("POST", "/api/kernels", model)
        if not isinstance(body, dict) or not isinstance(body.get("id"), str):
            raise BackendError(f"the Jupyter server at {self.url} answered POST /api/kernels without a kernel id")
        return str(body["id"])

    async def kernel_ids(self) -> list[str]:
        """The ids of the server's kernels (all clients'; a Kernel Gateway lists them only if configured to)."""
        body = await self._call("GET", "/api/kernels")
        return [str(k["id"]) for k in body or () if isinstance(k, dict) and "id" in k]

    async def kernel(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel's model, or None if the server no longer has it."""
        try:
            body = await self._call("GET", f"/api/kernels/{quote(kernel_id)}")
        except _NotFound:
            return None
        return body if isinstance(body, dict) else None

    async def interrupt(self, kernel_id: str) -> None:
        """``POST /api/kernels/{id}/interrupt``; a kernel the server no longer has shows up as a closed channel."""
        with contextlib.suppress(_NotFound):
            await self._call("POST", f"/api/kernels/{quote(kernel_id)}/interrupt", {})

    async def delete(self, kernel_id: str) -> None:
        """``DELETE /api/kernels/{id}``; a kernel the server no longer has is already gone."""
        with contextlib.suppress(_NotFound):
            await self._call("DELETE", f"/api/kernels/{quote(kernel_id)}")

    async def status_without_token(self) -> int:
        """The HTTP status of an unauthenticated ``GET /api/kernels`` (a locked server says 401 or 403)."""
        request = HTTPRequest(self.url + "/api/kernels", request_timeout=self._timeout, **self._tls)
        try:
            response = await self._http.fetch(request, raise_error=False)
        except OSError as exc:
            raise self._unreachable(exc) from exc
        return int(response.code)

    # -- WebSocket -------------------------------------------------------------------------

    async def connect_channels(self, kernel_id: str, session_id: str) -> WebSocketClientConnection:
        """Open ``/api/kernels/{id}/channels`` (the JSON protocol: one message per text frame)."""
        url = f"{self._ws_url}/api/kernels/{quote(kernel_id)}/channels?session_id={quote(session_id)}"
        request = HTTPRequest(url, headers=self._headers(), request_timeout=self._timeout, **self._tls)
        try:
            conn = await websocket_connect(request, max_message_size=MAX_MESSAGE_BYTES)
        except HTTPClientError as exc:
            raise self._http_error(exc, "GET", "/api/kernels/{id}/channels") from exc
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        if conn.protocol is not None:
            conn.protocol.set_nodelay(True)  # our requests are small and latency-bound: no Nagle delay
        return conn

    # -- plumbing --------------------------------------------------------------------------

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self._token}", "Content-Type": "application/json"}

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        request = HTTPRequest(
            self.url + path,
            method=method,
            headers=self._headers(),
            body=json.dumps(body) if body is not None else None,
            request_timeout=self._timeout,
            **self._tls,
        )
        try:
            response = await self._http.fetch(request)
        except HTTPClientError as exc:
            raise self._http_error(exc, method, path) from exc
        except (OSError, TimeoutError) as exc:
            raise self._unreachable(exc) from exc
        if not response.body:
            return None
        try:
            return json.loads(response.body)
        except ValueError as exc:
            raise BackendError(f"the Jupyter server at {self.url} answered {method} {path} with non-JSON") from exc

    def _http_error(self, exc: HTTPClientError, method: str, path: str) -> Exception:
        if exc.code in (401, 403):
            return SetupFailed(
                "jupyter",
                f"the Jupyter server at {self.url} refused the token (HTTP {exc.code} on {method} {path})",
                "pass the server's token (token=...; `jupyter server list` shows it on the server's host)",
            )
        if exc.code == 404:
            return _NotFound(f"the Jupyter server at {self.url} has no {path} (HTTP 404): the kernel is gone")
        if exc.code == 599:  # tornado's code for a connection that failed or timed out
            return self._unreachable(exc)
        return BackendError(
            f"the Jupyter server at {self.url} failed {method} {path}: HTTP {exc.code} {_reason(exc)}; "
            "see the server's log"
        )

    def _unreachable(self, exc: BaseException) -> BackendError:
        why = "TLS certificate not trusted" if isinstance(exc, ssl.SSLError) else f"{type(exc).__name__}: {exc}"
        return BackendError(
            f"cannot reach the Jupyter server at {self.url} ({why}); check that it is running and that the URL's "
            "scheme, host and port are right (https needs a certificate this host trusts: pass ca_file=...)"
        )


class _NotFound(BackendError):
    pass


def _reason(exc: HTTPClientError) -> str:
    body = exc.response.body if exc.response is not None else b""
    try:
        message = json.loads(body or b"{}").get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message or exc.message or "")
