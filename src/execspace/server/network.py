"""E2B's egress settings (``allow_internet_access``, ``network.allowOut`` / ``denyOut``) as a sandbox's network.

E2B's rules: an ``allowOut`` entry is an address, a CIDR block or a domain (``*.example.com`` for its subdomains);
a ``denyOut`` entry an address or a CIDR block only; allowed entries win over denied ones;
``allow_internet_access=False`` is ``denyOut: ["0.0.0.0/0"]``. A domain is matched on ports 80 (HTTP ``Host``) and
443 (TLS SNI), an address or block on every port. Here the sandbox's network is ``off`` or a policy enforced by its
egress proxy (:class:`~execspace.models.NetworkPolicy`): with all other traffic denied, an allow-list of what
``allowOut`` lists; with nothing denied, every public destination on every port (``*:*``) and what ``allowOut``
lists. A deny list with holes in it ("everything but these blocks") has no allow-list and is refused rather than
enforced loosely. Only a server started with ``--allow-host-network`` gives a sandbox with the network on the
host's own network (``on``) instead. A server without ``--allow-internet-access`` refuses a sandbox that asks for the
network (on, or an allow-list) rather than create it offline, except the ``true`` older SDKs send on every create.

``network.rules`` (E2B's per-host header transforms) become the proxy's header injection (:mod:`.egressrules`):
the values are added to the sandbox's requests to those hosts and never enter the sandbox.

A sandbox never reaches the server's host through its proxy: loopback, ``0.0.0.0``/``::`` and every address of the
host's interfaces are refused at create (an ``allowOut`` address or block that covers one, ``localhost`` or the
host's own name) and denied again by the sandbox's proxy (deny entries win, also over a name that resolves there),
except the addresses ``--resolve`` pins: the operator's own, for tests and private deployments.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..capabilities import Capabilities
from ..errors import CapabilityError, InvalidSpec, PolicyViolation
from ..models import HeaderInjection, NetworkPolicy
from .egressrules import injection_rules
from .options import ServerOptions

__all__ = ["SandboxEgress", "sandbox_egress", "sends_internet_by_default"]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

#: E2B's ``ALL_TRAFFIC`` (and its IPv6 twin): a deny entry that leaves only what ``allowOut`` lists.
_ALL_TRAFFIC = (ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0"))
#: What reaches the host whatever its interfaces: loopback, and "this host" (a connect to 0.0.0.0 or :: is one to
#: the host's own loopback).
_ALWAYS_HOST: tuple[tuple[Network, str], ...] = (
    (ipaddress.ip_network("127.0.0.0/8"), "loopback"),
    (ipaddress.ip_network("::1/128"), "loopback"),
    (ipaddress.ip_network("0.0.0.0/8"), "this host"),
    (ipaddress.ip_network("::/128"), "this host"),
)
_V4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
#: Names that always mean the host itself (RFC 6761): ``localhost`` and every name under it.
_LOCAL_NAMES = ("localhost", "*.localhost", "localhost.localdomain")


@dataclass(frozen=True, slots=True)
class SandboxEgress:
    """What a sandbox's commands may reach, and the rules it was created with (reported in its info)."""

    network: Literal["off", "on"] | NetworkPolicy = "off"
    allow_out: tuple[str, ...] | None = None
    deny_out: tuple[str, ...] | None = None
    internet: bool = False
    """Whether its commands reach the whole (public) network: its info's ``allowInternetAccess``."""
    rules: Mapping[str, list[dict[str, object]]] | None = None
    """Its ``network.rules`` as its info shows them (header values redacted), None when it was created without."""

    def info(self) -> dict[str, object] | None:
        """The ``network`` of the sandbox's info: its rules as given (header values redacted), None when it was
        created without any."""
        if self.allow_out is None and self.deny_out is None and self.rules is None:
            return None
        given = {"allowOut": self.allow_out, "denyOut": self.deny_out}
        info: dict[str, object] = {key: list(value) for key, value in given.items() if value is not None}
        if self.rules is not None:
            info["rules"] = dict(self.rules)
        return info


def sandbox_egress(
    internet: bool | None,
    network: Any,
    options: ServerOptions,
    capabilities: Capabilities,
    *,
    asked_by_default: bool = False,
) -> SandboxEgress:
    """The network of a sandbox created with ``allow_internet_access=internet`` and ``network=network``.

    The network on is the egress proxy allowing every public destination, never the server's host (unless the
    server shares its own network: ``--allow-host-network``); an allow-list is the proxy allowing what it lists.
    ``asked_by_default``: the client sends ``allow_internet_access: true`` on every create, asked or not
    (:func:`sends_internet_by_default`), so without the flag its sandbox is offline, as one that asked for nothing.

    Raises:
        InvalidSpec: a malformed rule (the message names the field), or an ``allowOut`` entry that reaches the
            server's host.
        PolicyViolation: the network (on, or an allow-list) on a server started without ``--allow-internet-access``
            (never quietly dropped: the message names the flag).
        CapabilityError: rules this server cannot enforce (a deny list that does not deny all traffic, the network
            on a backend without an egress proxy).
    """
    if network is None:
        network = {}
    if not isinstance(network, dict):
        raise InvalidSpec("network must be an object (allowOut, denyOut, ...)")
    unsupported = {
        "egressProxy": "it does not tunnel egress through a proxy of yours",
    }
    for key, why in unsupported.items():
        if network.get(key):
            raise CapabilityError(f"network.{key}", "execspace serve", f"Leave it out: {why}.")
    allow_out = _entries(network.get("allowOut"), "allowOut")
    deny_out = _entries(network.get("denyOut"), "denyOut")
    denied = [_network(entry, "denyOut") for entry in deny_out or ()]
    allowed = [_allow_entry(entry) for entry in allow_out or ()]
    # an entry that reaches the server's host is refused now, before anything else is decided
    keep_out = _host_out_of_reach(allow_out or (), options.resolve) if allowed else None
    deny_all = internet is not True or any(n in _ALL_TRAFFIC for n in denied)
    if denied and not deny_all:
        raise CapabilityError(
            "network.denyOut without denying all traffic",
            "execspace serve",
            'Egress here is an allow-list: list what may be reached in allowOut and deny "0.0.0.0/0".',
        )
    wants = bool(allowed) or not deny_all
    if wants and not options.allow_internet_access:
        if not allowed and asked_by_default:  # the SDK's default, not the caller's ask: offline, its info says so
            return SandboxEgress("off", allow_out, deny_out)
        asked = "network.allowOut" if allowed else "allow_internet_access=true"
        raise PolicyViolation(
            f"{asked}: this server keeps every sandbox offline (it was started without --allow-internet-access); "
            "start it with --allow-internet-access to give sandboxes the network, or create the sandbox without it"
        )
    inject, rules = _rules(network.get("rules"), allowed, deny_all)
    if not deny_all:
        if options.host_network:
            if inject:
                raise CapabilityError(
                    "network.rules on the host's network", "execspace serve", "Only the egress proxy injects headers."
                )
            return SandboxEgress("on", allow_out, deny_out, internet=True, rules=rules)
        # every public destination on every port, and what allowOut lists (private blocks); the host is denied below
        reach = ["*:*", *allowed]
    elif allowed:
        reach = allowed  # what is not allowed is denied, and allowed entries win: denyOut takes nothing away
    else:
        return SandboxEgress("off", allow_out, deny_out, rules=rules)
    if not capabilities.network_domains:
        raise CapabilityError(
            "the network of a sandbox (an egress proxy)",
            capabilities.backend,
            "Serve the sandbox backend (or, dangerously, give sandboxes the host's network: --allow-host-network).",
        )
    if keep_out is None:
        keep_out = _host_out_of_reach((), options.resolve)
    # the host's own addresses are denied to the proxy whatever name reaches them (deny entries win)
    policy = NetworkPolicy.allow(
        reach, deny=keep_out, resolve=options.resolve, inject=inject, upstream_ca=options.upstream_ca
    )
    return SandboxEgress(policy, allow_out, deny_out, internet=not deny_all, rules=rules)


def _rules(
    value: Any, allowed: list[str], deny_all: bool
) -> tuple[tuple[HeaderInjection, ...], dict[str, list[dict[str, object]]] | None]:
    """``network.rules`` for a sandbox that reaches ``allowed`` (and, without ``deny_all``, every public host): the
    injection rules of the hosts it reaches, and the rules as its info shows them."""

    def reached(rule: HeaderInjection) -> bool:
        if not deny_all:
            return True
        try:
            NetworkPolicy.allow(allowed, inject=[rule])
        except InvalidSpec:
            return False  # as in E2B, a rule grants nothing: the host is unreachable, the rule inert
        return True

    return injection_rules(value, reached)


#: The first release of each official SDK that sends ``allow_internet_access`` only when its caller gives it: the
#: earlier ones send ``true`` on every create (``lang`` and ``package_version`` are headers of every SDK request).
_ASKS_ONLY_WHEN_GIVEN = {"python": (2, 51), "js": (2, 51)}


def sends_internet_by_default(headers: Mapping[str, str]) -> bool:
    """Whether the request comes from an official SDK that sends ``allow_internet_access: true`` on every create,
    so that its ``true`` says nothing of what its caller wants. Any other client (a newer SDK, one without these
    headers) is taken at its word."""
    first = _ASKS_ONLY_WHEN_GIVEN.get(headers.get("lang", ""))
    if first is None:
        return False
    try:
        version = tuple(int(part) for part in headers.get("package_version", "").split(".")[:2])
    except ValueError:
        return False
    return len(version) == 2 and version < first


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


def _host_out_of_reach(allow_out: Iterable[str], pins: Mapping[str, str]) -> list[str]:
    """The deny entries that keep a sandbox's proxy off the server's host: every address that reaches it, less
    those ``pins`` pin. Raises :class:`InvalidSpec` for an ``allowOut`` entry that reaches the host anyway (an
    address or block that covers one, a name that is the host's own), naming the entry and the rule."""
    pinned = {_plain(ipaddress.ip_address(value.strip().strip("[]"))) for value in pins.values()}
    found: list[tuple[Network, str]] = []
    for net, what in [*_ALWAYS_HOST, *((net, "the host's address") for net in _interface_networks())]:
        if not any(net.network_address in seen and net.broadcast_address in seen for seen, _ in found):
            found.append((net, f"{what} {net}"))
    host = [(part, what) for net, what in found for part in _without(net, pinned)]
    own_names = {*_LOCAL_NAMES, socket.gethostname().lower()} - {name.lower() for name in pins}
    for entry in allow_out:
        try:
            block = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            name = entry.lower().rstrip(".")
            if any(name == own or (own.startswith("*.") and name.endswith(own[1:])) for own in own_names):
                raise InvalidSpec(_refusal(entry, f"{name!r} names the host itself")) from None
            continue
        blocks = [block, *_as_v4(block)]
        for net, what in host:
            if any(b.version == net.version and b.overlaps(net) for b in blocks):
                raise InvalidSpec(_refusal(entry, f"it covers {what}"))
    return [f"[{net}]" if net.version == 6 else str(net) for net, _ in host]


def _refusal(entry: str, why: str) -> str:
    return (
        f"network.allowOut entry {entry!r} reaches the server's host ({why}): a sandbox never reaches the host's "
        "loopback or its own addresses; to reach a test server there, start the server with --resolve NAME=ADDR "
        "and allow NAME"
    )


def _plain(addr: Address) -> Address:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _as_v4(block: Network) -> Iterator[ipaddress.IPv4Network]:
    """The IPv4 addresses an IPv6 block names in their IPv4-mapped form (the proxy reads them as IPv4)."""
    if isinstance(block, ipaddress.IPv6Network) and block.overlaps(_V4_MAPPED):
        if block.prefixlen <= 96:
            yield ipaddress.IPv4Network("0.0.0.0/0")
        else:
            yield ipaddress.IPv4Network((int(block.network_address) & 0xFFFFFFFF, block.prefixlen - 96))


def _without(net: Network, pinned: Iterable[Address]) -> list[Network]:
    """``net`` less the pinned addresses in it (as the fewest blocks)."""
    parts: list[Network] = [net]
    for addr in pinned:
        parts = [rest for part in parts for rest in _exclude(part, addr)]
    return parts


def _exclude(net: Network, addr: Address) -> Iterator[Network]:
    if addr not in net:
        yield net
    elif isinstance(net, ipaddress.IPv4Network) and isinstance(addr, ipaddress.IPv4Address):
        yield from net.address_exclude(ipaddress.IPv4Network(addr))
    elif isinstance(net, ipaddress.IPv6Network) and isinstance(addr, ipaddress.IPv6Address):
        yield from net.address_exclude(ipaddress.IPv6Network(addr))


def _interface_networks() -> Iterator[Network]:
    """Every address of this host's interfaces (in its network namespace): the kernel's IPv4 local routes (an
    address reaches the host whichever interface carries it) and the IPv6 interface addresses."""
    try:
        trie = Path("/proc/net/fib_trie").read_text()
    except OSError as exc:  # without it the host's addresses are unknown: refuse rather than guess
        raise CapabilityError(
            "an egress allow-list that keeps the server's host out of reach", "execspace serve", f"{exc}"
        ) from None
    address = ""
    for line in trie.splitlines():
        words = line.split()
        if words[:1] == ["|--"] and len(words) > 1:
            address = words[1]
        elif len(words) >= 3 and words[0].startswith("/") and words[2] == "LOCAL" and address:
            yield ipaddress.ip_network(f"{address}{words[0]}", strict=False)
    try:
        inet6 = Path("/proc/net/if_inet6").read_text()
    except FileNotFoundError:
        return  # no IPv6 here
    for line in inet6.splitlines():
        if words := line.split():
            yield ipaddress.ip_network(ipaddress.IPv6Address(int(words[0], 16)))
