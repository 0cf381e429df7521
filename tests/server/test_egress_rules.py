"""E2B's ``network.rules`` on ``execspace serve``: header transforms become the sandbox's egress-proxy injection.

The mapping is checked on its own (shapes, refusals that never quote a value, inert rules for unreachable hosts,
the redacted info), then end to end with the official SDK against a real server: a sandbox created with
``network={"rules": {...}}`` reaches a pinned loopback upstream over plain HTTP and HTTPS (the server verifies the
upstream with ``--upstream-ca``), the upstream gets the header, the sandbox's commands never see the value, and
the sandbox's info shows the rule with its value redacted."""

from __future__ import annotations

import http.server
import os
import random
import ssl
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from execspace.errors import CapabilityError, InvalidSpec
from execspace.models import NetworkPolicy
from execspace.server.egressrules import REDACTED
from execspace.server.network import sandbox_egress
from execspace.server.options import ServerOptions

SECRET = "Bearer rules-" + os.urandom(10).hex()


def _caps() -> Any:
    """What sandbox_egress asks of a backend's capabilities: a sandbox backend with an egress proxy."""
    return SimpleNamespace(backend="sandbox", network_domains=True)


def _egress(network: dict[str, Any], *, internet: bool | None = False) -> Any:
    options = ServerOptions(("k",), allow_internet_access=True, resolve={"pinned.test": "127.0.0.9"})
    return sandbox_egress(internet, network, options, _caps())


def _rules(host: str = "pinned.test", **headers: str) -> dict[str, Any]:
    return {host: [{"transform": {"headers": headers}}]}


def test_rules_become_injection_rules_of_allowed_hosts_and_the_info_redacts_them() -> None:
    egress = _egress({"allowOut": ["pinned.test", "*.api.test"], "rules": _rules(Authorization=SECRET)})
    assert isinstance(egress.network, NetworkPolicy)
    [rule] = egress.network.inject
    assert (rule.host, rule.header, rule.value.reveal()) == ("pinned.test", "Authorization", SECRET)
    info = egress.info()
    assert info["rules"] == {"pinned.test": [{"transform": {"headers": {"Authorization": REDACTED}}}]}
    assert SECRET not in repr(egress) and SECRET not in repr(info)


def test_a_hosts_rules_apply_in_order_and_a_rule_grants_no_network() -> None:
    rules = {
        "pinned.test": [
            {"transform": {"headers": {"X-Key": "one", "authorization": "first"}}},
            {"transform": {"headers": {"Authorization": SECRET}}},
            {},
        ],
        "unlisted.test": [{"transform": {"headers": {"X-Key": "never"}}}],
    }
    egress = _egress({"allowOut": ["pinned.test"], "rules": rules})
    assert isinstance(egress.network, NetworkPolicy)
    got = {(r.host, r.header, r.value.reveal()) for r in egress.network.inject}
    assert got == {("pinned.test", "X-Key", "one"), ("pinned.test", "Authorization", SECRET)}
    assert set(egress.info()["rules"]) == {"pinned.test", "unlisted.test"}  # inert, but reported as given
    on = _egress({"rules": rules}, internet=True)  # the network on: every public host, so every rule applies
    assert isinstance(on.network, NetworkPolicy) and len(on.network.inject) == 3


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ("x", "network.rules must be an object"),
        ({"*": []}, "not '*'"),
        ({"a.test": {}}, "must be a list"),
        ({"a.test": ["x"]}, "a rule is an object"),
        ({"a.test": [{"transform": {"headers": ["x"]}}]}, "headers must be an object"),
        ({"a.test": [{"transform": {"headers": {"Bad Name": SECRET}}}]}, "is not an HTTP header name"),
        ({"a.test": [{"transform": {"headers": {"Host": SECRET}}}]}, "the proxy owns Host"),
        ({"a.test": [{"transform": {"headers": {"X-Key": SECRET + "\r\nX-Evil: 1"}}}]}, "control character"),
        ({"a.test:8443": [{"transform": {"headers": {"X-Key": SECRET}}}]}, "no port"),
    ],
)
def test_a_malformed_rule_is_refused_without_quoting_its_value(rules: object, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message) as caught:
        _egress({"allowOut": ["a.test"], "rules": rules})
    assert SECRET.split()[1] not in str(caught.value)


def test_a_workload_identity_placeholder_and_the_hosts_own_network_are_refused() -> None:
    placeholder = _rules("a.test", Authorization="Bearer ${e2b.identity.tokens.aws}")
    with pytest.raises(CapabilityError, match="workload identity"):
        _egress({"allowOut": ["a.test"], "rules": placeholder})
    options = ServerOptions(("k",), allow_internet_access=True, host_network=True)
    with pytest.raises(CapabilityError, match=r"network\.rules on the host's network"):
        sandbox_egress(True, {"rules": _rules("a.test", X=SECRET)}, options, _caps())


# -- end to end: the official SDK against a real server ----------------------------------------------------------


def _upstream(address: str, tls: ssl.SSLContext | None, seen: list[list[str]]) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get_all("Authorization") or [])
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ruled")

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((address, 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def ruled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, int, int, list[list[str]]]]:
    """A server giving sandboxes the network, ``pinned.test`` pinned to a loopback address where a plain and a TLS
    upstream (a test CA's certificate, given to the server with --upstream-ca) listen."""
    pytest.importorskip("e2b", reason="serve is tested with the official e2b SDK")
    trustme = pytest.importorskip("trustme", reason="the upstream's test CA comes from trustme")
    pytest.importorskip("cryptography", reason="TLS injection needs pip install 'execspace[inject]'")
    from tests.server.conftest import running_server

    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randrange(2, 254, 2)}"
    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("pinned.test").configure_cert(context)
    seen: list[list[str]] = []
    plain, secure = _upstream(address, None, seen), _upstream(address, context, seen)
    flags = ("--allow-internet-access", "--resolve", f"pinned.test={address}", "--upstream-ca", str(ca_file))
    try:
        with running_server(tmp_path_factory.mktemp("serve"), *flags, "--pool-size", "0") as server:
            yield server, plain.server_address[1], secure.server_address[1], seen
    finally:
        for up in (plain, secure):
            up.shutdown()
            up.server_close()


def test_an_sdk_sandboxs_requests_get_its_rules_headers_and_never_hold_them(
    ruled: tuple[Any, int, int, list[list[str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from e2b import Sandbox

    server, plain, secure, seen = ruled
    for name, value in server.sdk_env().items():
        monkeypatch.setenv(name, value)
    rules = {"pinned.test": [{"transform": {"headers": {"Authorization": SECRET}}}]}
    sbx = Sandbox.create(allow_internet_access=True, network={"rules": rules})
    try:
        needle = SECRET.split()[1][::-1]  # reversed: the commands' own argv must not hold it
        for url in (f"http://pinned.test:{plain}/", f"https://pinned.test:{secure}/"):
            run = sbx.commands.run(f"curl -sS -H 'Authorization: mine' --max-time 20 {url}", timeout=60)
            assert run.stdout == "ruled", run.stderr
        # the needle in a file: grep's own argv would hold it
        probe = sbx.commands.run(
            f"echo {needle} | rev > /tmp/n; (env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline) 2>/dev/null "
            "| tr '\\0' '\\n' | grep -c -F -f /tmp/n || true",
            timeout=60,
        )
        info = sbx.get_info()
    finally:
        sbx.kill()
    assert seen[-2:] == [[SECRET], [SECRET]]
    assert probe.stdout.strip() == "0", probe.stdout
    shown = info.network["rules"]  # type: ignore[index]
    assert shown == {"pinned.test": [{"transform": {"headers": {"Authorization": REDACTED}}}]}
