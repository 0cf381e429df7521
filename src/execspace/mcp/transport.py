"""What guards the streamable HTTP endpoint beside the bearer token: the same in both SDK majors."""

from __future__ import annotations

from mcp.server.transport_security import TransportSecuritySettings

__all__ = ["security_settings"]

_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def security_settings(loopback: bool) -> TransportSecuritySettings:
    """On a loopback address, Host and Origin must name it (a web page's DNS rebinding); elsewhere the token is
    the only gate, as the names the server is reached by are not known here."""
    if not loopback:
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[f"{h}:*" for h in _LOOPBACK] + list(_LOOPBACK),
        allowed_origins=[f"http://{h}:*" for h in _LOOPBACK],
    )
