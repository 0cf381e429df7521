"""E2B's egress settings (``allow_internet_access``, ``network.allowOut`` / ``denyOut``) as a sandbox's network.

E2B's rules: an ``allowOut`` entry is an address, a CIDR block or a domain (``*.example.com`` for its subdomains);
a ``denyOut`` entry an address or a CIDR block only; allowed entries win over denied ones;
``allow_internet_access=False`` is ``denyOut: ["0.0.0.0/0"]``. A domain is matched on ports 80 (HTTP ``Host``) and
443 (TLS SNI), an address or block on every port. Here the sandbox's network is ``off``, ``on`` or an allow-list
enforced by the egress proxy (:class:`~execspace.models.NetworkPolicy`), so the rules map to an allow-list when all
other traffic is denied; a deny list with holes in it ("everything but these blocks") has no allow-list and is
refused rather than enforced loosely.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Literal

from ..capabilities import Capabilities
from ..errors import CapabilityError, InvalidSpec
from ..models import NetworkPolicy
from .options import ServerOptions

__all__ = ["SandboxEgress", "sandbox_egress"]

#: E2B's ``ALL_TRAFFIC`` (and its IPv6 twin): a deny entry that leaves only what ``allowOut`` lists.
_ALL_TRAFFIC = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))


@dataclass(frozen=True, slots=True)
class SandboxEgress:
    """What a sandbox's commands may reach, and the rules it was created with (reported in its info)."""

    network: Literal["off", "on"] | NetworkPolicy = "off"
    allow_out: tuple[str, ...] | None = None
    deny_out: tuple[str, ...] | None = None

    def info(self) -> dict[str, list[str]] | None:
        """The ``network`` of the sandbox's info: its rules as given, None when it was created without any."""
        if self.allow_out is None and self.deny_out is None:
            return None
        rules = {"allowOut": self.allow_out, "denyOut": self.deny_out}
        return {key: list(value) for key, value in rules.items() if value is not None}


def sandbox_egress(
    internet: bool | None, network: Any, options: ServerOptions, capabilities: Capabilities
) -> SandboxEgress:
    """The network of a sandbox created with ``allow_internet_access=internet`` and ``network=network``.

    Raises:
        InvalidSpec: a malformed rule (the message names the field).
        CapabilityError: rules this server cannot enforce (a deny list that does not deny all traffic, an
            allow-list on a server without ``--allow-internet-access`` or on a backend without an egress proxy).
    """
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidSpec("network must be an object (allowOut, denyOut, ...)")
    unsupported = {
        "egressProxy": "it does not tunnel egress through a proxy of yours",
        "rules": "its egress proxy does not rewrite requests",
    }
    for key, why in unsupported.items():
        if network.get(key):
            raise CapabilityError(f"network.{key}", "execspace serve", f"Leave it out: {why}.")
    allow_out = _entries(network.get("allowOut"), "allowOut")
    deny_out = _entries(network.get("denyOut"), "denyOut")
    denied = [_network(entry, "denyOut") for entry in deny_out or ()]
    allowed = [_allow_entry(entry) for entry in allow_out or ()]
    deny_all = internet is not True or any(n in _ALL_TRAFFIC for n in denied)
    if denied and not deny_all:
        raise CapabilityError(
            "network.denyOut without denying all traffic",
            "execspace serve",
            'Egress here is an allow-list: list what may be reached in allowOut and deny "0.0.0.0/0".',
        )
    wants = bool(allowed) or not deny_all
    if wants and not options.allow_internet_access:
        if not allowed:  # e2b < 2.51 always asks for the network: such a sandbox is offline, its info says so
            return SandboxEgress("off", allow_out, deny_out)
        raise CapabilityError(
            "network.allowOut",
            "execspace serve",
            "This server keeps sandboxes offline: start it with --allow-internet-access.",
        )
    if not deny_all:
        return SandboxEgress("on", allow_out, deny_out)  # nothing denied: allowOut adds nothing to everything
    if not allowed:
        return SandboxEgress("off", allow_out, deny_out)
    if not capabilities.network_domains:
        raise CapabilityError(
            "network.allowOut (an egress allow-list)", capabilities.backend, "Serve the sandbox backend."
        )
    # what is not allowed is denied, and allowed entries win: denyOut has nothing left to take away
    policy = NetworkPolicy.allow(allowed, resolve=options.resolve)
    return SandboxEgress(policy, allow_out, deny_out)


def _entries(value: Any, field: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise InvalidSpec(f"network.{field} must be a list of non-empty strings, got {value!r}")
    return tuple(v.strip() for v in value)


def _network(entry: str, field: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(entry, strict=False)
    except ValueError:
        raise InvalidSpec(
            f"network.{field} entry {entry!r} is not an IP address or CIDR block (e.g. 10.0.0.0/8)"
            + ("; domains are allowed in allowOut only" if field == "denyOut" else "")
        ) from None


def _allow_entry(entry: str) -> str:
    """``entry`` of ``allowOut`` as a :class:`NetworkPolicy` entry: an address or block on every port, a domain on
    80 and 443 (an entry without a port)."""
    try:
        block = ipaddress.ip_network(entry, strict=False)
    except ValueError:
        pass
    else:
        return f"[{block}]:*" if block.version == 6 else f"{block}:*"
    try:
        if ":" in entry or "/" in entry:
            raise InvalidSpec(entry)
        NetworkPolicy.allow([entry])
    except InvalidSpec:
        raise InvalidSpec(
            f"network.allowOut entry {entry!r} is not an IP address, a CIDR block or a domain (example.com, "
            "*.example.com; no port: a domain is reached on 80 and 443)"
        ) from None
    return entry.lower()
