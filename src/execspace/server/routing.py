"""Which sandbox and port a data-plane request is for.

The SDK names them in two ways: with ``E2B_SANDBOX_URL`` (and E2B's own domains) it sends the headers
``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port``; otherwise it calls ``https://<port>-<sandboxID>.<domain>`` and the
``Host`` says it (host-based routing, which needs wildcard DNS and TLS in front of the server). Signed file URLs
carry neither: their signature names the sandbox (see :mod:`.files`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CODE_INTERPRETER_PORT", "ENVD_PORT", "Target", "target_of", "user_of"]

ENVD_PORT = 49983
CODE_INTERPRETER_PORT = 49999


@dataclass(frozen=True, slots=True)
class Target:
    sandbox_id: str
    port: int


def target_of(headers: Mapping[str, str], domain: str | None) -> Target | None:
    """The sandbox and port named by the headers or the host; None for a control-plane request."""
    sandbox_id = headers.get("e2b-sandbox-id")
    if sandbox_id:
        port = headers.get("e2b-sandbox-port", "")
        return Target(sandbox_id, int(port) if port.isdigit() else ENVD_PORT)
    if domain:
        host = headers.get("host", "").split(":", 1)[0]
        label, dot, rest = host.partition(".")
        port, dash, sandbox_id = label.partition("-")
        if dot and rest == domain and dash and port.isdigit() and sandbox_id:
            return Target(sandbox_id, int(port))
    return None


def user_of(headers: Mapping[str, str]) -> str | None:
    """The user an envd call runs as (``Authorization: Basic base64("<user>:")``); None: the default user."""
    auth = headers.get("authorization", "")
    scheme, _, credentials = auth.partition(" ")
    if scheme.lower() != "basic" or not credentials:
        return None
    try:
        return base64.b64decode(credentials, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        return "<unreadable Authorization header>"
