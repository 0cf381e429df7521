"""E2B's ``network.rules`` (per-host request transforms) as the egress proxy's header injection.

The SDK sends ``rules: {"api.example.com": [{"transform": {"headers": {"Authorization": "Bearer …"}}}]}``; a key
is a name or ``*.suffix`` (a bare ``*`` is refused), a host's rules apply in order (a later header of the same name
wins), a name's exact rules win over wildcard ones and of those the longest suffix wins. As in E2B a rule grants no
network: a host that ``allowOut`` does not allow gets no request, so its rule is inert. The headers become
:class:`~execspace.models.HeaderInjection` rules of the sandbox's proxy: added (replacing the program's own) to
every plain HTTP request to the host and, with TLS ended by the proxy, to every HTTPS one. The values are the
caller's secrets: no error message quotes them and the sandbox's info shows each header with its value redacted.
E2B's workload identity placeholders (``${e2b.identity.tokens.NAME}``) are refused (no identity is minted here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import CapabilityError, InvalidSpec
from ..models import HeaderInjection, Secret

__all__ = ["REDACTED", "injection_rules"]

#: What the sandbox's info shows for an injected header's value.
REDACTED = "<redacted>"


def injection_rules(
    value: Any, allowed: Callable[[HeaderInjection], bool]
) -> tuple[tuple[HeaderInjection, ...], dict[str, list[dict[str, object]]] | None]:
    """``network.rules`` as the injection rules of the hosts ``allowed`` lets through, and the rules as the sandbox's
    info reports them (values redacted; None when none were given). Raises :class:`InvalidSpec` for a malformed
    rule (naming its host and header, never its value) and :class:`CapabilityError` for a workload identity."""
    if value is None:
        return (), None
    if not isinstance(value, dict):
        raise InvalidSpec("network.rules must be an object: {host: [{transform: {headers: {NAME: VALUE}}}]}")
    rules: list[HeaderInjection] = []
    info: dict[str, list[dict[str, object]]] = {}
    for host, host_rules in value.items():
        headers = _headers(host, host_rules)
        made = [HeaderInjection(host, name, Secret(text, f"network.rules[{host}]")) for name, text in headers.items()]
        info[str(host).lower()] = [{"transform": {"headers": dict.fromkeys(headers, REDACTED)}}] if headers else []
        rules += [rule for rule in made if allowed(rule)]
    return tuple(rules), info


def _headers(host: object, host_rules: object) -> dict[str, str]:
    """The headers of one host's rules, in order (a later one of the same name wins)."""
    if not isinstance(host, str) or host.strip() in ("", "*"):
        raise InvalidSpec(f"network.rules key {host!r}: give a domain (api.example.com) or *.suffix, not '*'")
    if not isinstance(host_rules, list):
        raise InvalidSpec(f"network.rules[{host!r}] must be a list of rules ({{transform: {{headers: {{...}}}}}})")
    headers: dict[str, str] = {}
    for rule in host_rules:
        transform = rule.get("transform") if isinstance(rule, dict) else None
        if not isinstance(rule, dict) or not (transform is None or isinstance(transform, dict)):
            raise InvalidSpec(f"network.rules[{host!r}]: a rule is an object with an optional transform object")
        given = (transform or {}).get("headers") or {}
        if not isinstance(given, dict):
            raise InvalidSpec(f"network.rules[{host!r}].transform.headers must be an object of NAME: VALUE")
        for name, text in given.items():
            if not isinstance(name, str) or not isinstance(text, str):
                raise InvalidSpec(f"network.rules[{host!r}]: header names and values are strings")
            if "${e2b." in text:
                raise CapabilityError(
                    f"network.rules[{host!r}] header {name}: an E2B workload identity placeholder",
                    "execspace serve",
                    "Give the credential's value itself: no workload identity is minted here.",
                )
            for old in [key for key in headers if key.lower() == name.lower()]:
                del headers[old]
            headers[name] = text
    return headers
