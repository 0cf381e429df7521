"""A :class:`~execspace.models.NetworkPolicy` as the egress rules of an E2B-protocol sandbox, or why it cannot be one.

The service enforces them, at the sandbox's creation, for every process of the sandbox: ``allow_out`` entries
(addresses, networks, domains and ``*.domain`` wildcards, a domain matched on ports 80 and 443 by its HTTP ``Host`` or
TLS SNI) with ``deny_out: ["0.0.0.0/0"]`` for everything else. Only policies whose meaning is the same on both sides
map: a domain without a port (execspace's default ports are 80 and 443 too), an address or a network for every port
(``10.0.0.0/8:*``: E2B allows it on every port). A domain on another port, an address without ``:*``, a denied
entry (E2B's allowed entries win over its denied ones; execspace's denied ones win) and pinned names (the service
resolves) are refused rather than enforced loosely.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from ...errors import InvalidSpec
from ...models import NetworkPolicy
from ...process.egress import ANY_PORT, split_target

__all__ = ["ALL_TRAFFIC", "sandbox_rules"]

#: E2B's deny entry for every IPv4 destination: with it, only what ``allow_out`` lists is reached.
ALL_TRAFFIC = "0.0.0.0/0"


def sandbox_rules(policy: NetworkPolicy) -> dict[str, Any]:
    """The SDK's ``network=`` for ``policy``; raises :class:`InvalidSpec` saying what cannot be expressed. Injection
    rules become E2B's ``rules`` (header transforms its egress proxy applies): the values go to the service, never
    into the sandbox."""
    if policy.denied:
        raise _unmapped("denied entries", "E2B's allowed entries win over denied ones: list only what to allow")
    if policy.resolve:
        raise _unmapped("pinned names (resolve)", "the service resolves names itself: leave resolve out")
    if policy.upstream_ca is not None:
        raise _unmapped("upstream_ca", "the service verifies upstreams against its own trust store: leave it out")
    network: dict[str, Any] = {
        "allow_out": [_allow_entry(entry) for entry in policy.allowed],
        "deny_out": [ALL_TRAFFIC],
    }
    headers: dict[str, dict[str, str]] = {}
    for rule in policy.inject:
        headers.setdefault(rule.host, {})[rule.header] = rule.value.reveal()
    if headers:
        network["rules"] = {host: [{"transform": {"headers": given}}] for host, given in headers.items()}
    return network


def _allow_entry(entry: str) -> str:
    host, port = split_target(entry, entry=True)
    if host == "*":
        raise _unmapped("the entry '*' (every destination)", "open the engine with allow_internet_access=True")
    if _is_address(host):
        if port != ANY_PORT:
            raise _unmapped(
                f"the address entry {entry!r}",
                f"E2B allows an address or network on every port: write it {host}:* (or list a domain)",
            )
        return host
    if port is not None:
        raise _unmapped(f"the domain entry {entry!r}", "E2B matches a domain on ports 80 and 443 only: drop the port")
    return host


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_network(host.strip("[]"), strict=False)
    except ValueError:
        return False
    return True


def _unmapped(what: str, how: str) -> InvalidSpec:
    return InvalidSpec(f"E2BOptions.network: {what} cannot be an E2B sandbox's egress rule; {how}")
