"""Header injection at the egress proxy without a sandbox: the typed rules (a value that never prints), the CLI's
``--inject-header`` (values from the caller's environment only), which rules a host gets, the per-sandbox CA (its
name constraint, its key kept out), the proxy's request rewriting over real sockets (bodies framed as sent, a
program's own header dropped), and the backends that cannot inject refusing rather than ignoring the rules."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import os
import pickle
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from execspace.errors import CapabilityError, InvalidSpec, UsageError
from execspace.models import HeaderInjection, NetworkPolicy, Secret
from execspace.process.egress import EgressProxy, without_secrets
from execspace.process.egressinject import Injections, make_ca

SECRET = "Bearer unit-" + os.urandom(10).hex()
NEEDLE = SECRET.split()[1]


def _rule(host: str = "api.test", header: str = "Authorization", value: str = SECRET) -> HeaderInjection:
    return HeaderInjection(host, header, Secret(value))


def test_a_secret_never_prints_and_an_unset_variable_is_named() -> None:
    secret = Secret.from_env("INJ_UNIT", {"INJ_UNIT": SECRET})
    rule = _rule()
    policy = NetworkPolicy.allow(["api.test"], inject=[rule])
    for text in (repr(secret), str(secret), repr(rule), repr(policy), f"{policy}"):
        assert NEEDLE not in text
    assert repr(secret) == "Secret(<env:INJ_UNIT>)" and secret.reveal() == SECRET
    assert NEEDLE not in repr(dataclasses.asdict(policy))  # a Secret is copied as an object, never as its value
    assert pickle.loads(pickle.dumps(policy)) == policy
    with pytest.raises(InvalidSpec, match="INJ_UNSET is not set"):
        Secret.from_env("INJ_UNSET", {})


@pytest.mark.parametrize(
    ("host", "header", "value", "message"),
    [
        ("api.test:443", "X-Key", SECRET, "no port"),
        ("127.0.0.1", "X-Key", SECRET, "no address"),
        ("*", "X-Key", SECRET, "domain name"),
        ("api.test", "X Key", SECRET, "not an HTTP header name"),
        ("api.test", "Content-Length", SECRET, "the proxy owns"),
        ("api.test", "Host", SECRET, "the proxy owns"),
        ("api.test", "X-Key", SECRET + "\r\nX-Smuggled: 1", "control character"),
        ("api.test", "X-Key", f" {SECRET}", "whitespace"),
        ("api.test", "X-Key", SECRET + "\u2603", "not Latin-1"),
    ],
)
def test_a_bad_rule_is_refused_without_quoting_its_value(host: str, header: str, value: str, message: str) -> None:
    with pytest.raises(InvalidSpec, match=message) as caught:
        _rule(host, header, value)
    assert NEEDLE not in str(caught.value)


def test_a_rule_needs_its_host_allowed_and_one_header_once() -> None:
    NetworkPolicy.allow(["api.test:8443"], inject=[_rule()])
    NetworkPolicy.allow(["*.test"], inject=[_rule(), _rule("*.sub.test")])
    NetworkPolicy.allow(["*"], inject=[_rule("*.test")])
    for allowed, rule in ((["other.test"], _rule()), (["*.api.test"], _rule()), (["api.test"], _rule("*.api.test"))):
        with pytest.raises(InvalidSpec, match="does not allow"):
            NetworkPolicy.allow(allowed, inject=[rule])
    with pytest.raises(InvalidSpec, match="two injection rules"):
        NetworkPolicy.allow(["api.test"], inject=[_rule(), _rule(header="authorization")])


def test_a_host_gets_its_exact_rules_else_the_longest_wildcards_never_a_merge() -> None:
    exact, near, far = _rule("a.b.test", "X-Exact"), _rule("*.b.test", "X-Near"), _rule("*.test", "X-Far")
    rules = Injections((far, near, exact))
    assert rules.for_host("a.b.test") == (exact,)
    assert rules.for_host("c.b.test") == (near,)
    assert rules.for_host("b.test") == (far,)
    assert rules.for_host("test") == () and rules.for_host("a.b.test.evil") == ()


def test_a_variable_holding_a_value_is_dropped_from_the_programs_environment() -> None:
    policy = NetworkPolicy.allow(["api.test"], inject=[_rule()])
    env = {"PATH": "/bin", "MY": SECRET, "WRAPPED": f"x{SECRET}y", "PART": NEEDLE}
    assert without_secrets(env, policy) == {"PATH": "/bin", "PART": NEEDLE}  # a part is not the value
    assert without_secrets(env, NetworkPolicy.allow(["api.test"])) == env


# -- the CLI -----------------------------------------------------------------------------------------------------


def _run_args(*flags: str) -> argparse.Namespace:
    from execspace.cli.main import build_parser

    return build_parser().parse_args(["run", *flags, "--", "true"])


def test_the_cli_reads_values_from_the_environment_and_never_from_argv(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from execspace.cli.run import network_choice

    monkeypatch.setenv("INJ_CLI", SECRET)
    policy = network_choice(_run_args("--allow-domain", "api.test", "--inject-header", "api.test:X-Key=env:INJ_CLI"))
    assert isinstance(policy, NetworkPolicy) and policy.inject[0].value.reveal() == SECRET
    with pytest.raises(SystemExit):
        _run_args("--allow-domain", "api.test", "--inject-header", f"api.test:X-Key={SECRET}")
    assert NEEDLE not in capsys.readouterr().err
    cases = [
        (("--inject-header", "api.test:X-Key=env:INJ_CLI"), "give --allow-domain too"),
        (("--allow-domain", "api.test", "--inject-header", "api.test:X-Key=env:INJ_NOPE"), "INJ_NOPE is not set"),
        (("--allow-domain", "a.test", "--inject-header", "api.test:X-Key=env:INJ_CLI"), "--allow-domain api.test"),
        (("--allow-domain", "api.test", "--upstream-ca", "/nowhere.pem"), "give --inject-header too"),
    ]
    for flags, message in cases:
        with pytest.raises(UsageError, match=message) as caught:
            network_choice(_run_args(*flags))
        assert NEEDLE not in str(caught.value)


# -- the CA --------------------------------------------------------------------------------------------------------


def test_make_ca_names_the_extra_when_cryptography_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cryptography" else real(name))
    with pytest.raises(CapabilityError, match=r"pip install 'execspace\[inject\]'"):
        make_ca(["api.test"], "sandbox")


async def _handshake(context: ssl.SSLContext, ca_pem: bytes, name: str) -> str:
    """A client trusting only ``ca_pem`` against a server with ``context``: "ok" or the verification error."""
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0, ssl=context)
    client = ssl.create_default_context(cadata=ca_pem.decode())
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", server.sockets[0].getsockname()[1], ssl=client, server_hostname=name
        )
        writer.close()
        return "ok"
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message)
    finally:
        server.close()


async def test_the_ca_signs_its_hosts_only_and_hands_out_no_key() -> None:
    pytest.importorskip("cryptography")
    from execspace.process.egressca import trust_bundle

    ca = make_ca(["api.test", "*.svc.test"], "sandbox")
    assert await _handshake(ca.server_context("api.test"), ca.cert_pem, "api.test") == "ok"
    assert await _handshake(ca.server_context("a.svc.test"), ca.cert_pem, "a.svc.test") == "ok"
    # a leaf for any other name is one the CA's name constraint forbids: no client that trusts it accepts it
    assert "permitted subtree violation" in await _handshake(ca.server_context("bank.test"), ca.cert_pem, "bank.test")
    bundle = trust_bundle(ca.cert_pem)
    assert bundle.endswith(ca.cert_pem) and b"PRIVATE KEY" not in bundle


# -- the proxy over sockets ------------------------------------------------------------------------------------------


class Recorder:
    """An upstream that reads a request (up to ``until``, else to the proxy's end), answers once and ends its side,
    then keeps whatever else comes until the proxy closes: ``got`` is every byte the proxy sent it."""

    def __init__(self, until: bytes | None = None) -> None:
        self.until = until
        self.got = bytearray()
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.until is None:
            self.got += await reader.read()
        else:
            self.got += await reader.readuntil(self.until)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        writer.write_eof()
        self.got += await reader.read()
        writer.close()


@pytest.fixture
async def recorder(request: pytest.FixtureRequest) -> AsyncIterator[Recorder]:
    up = Recorder(getattr(request, "param", None))
    server = await asyncio.start_server(up.serve, "127.0.0.1", 0)
    up.port = server.sockets[0].getsockname()[1]
    yield up
    server.close()


async def _through(policy: NetworkPolicy, data: bytes) -> bytes:
    """``data`` sent to a proxy serving ``policy`` (then the client's end), and its answer."""
    proxy = EgressProxy(policy, "unit")
    listener = socket.create_server(("127.0.0.1", 0))
    await proxy.serve(listener)
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.getsockname()[1])
    writer.write(data)
    writer.write_eof()
    try:
        async with asyncio.timeout(20):
            return await reader.read()
    finally:
        writer.close()
        proxy.close()


def _policy(port: int) -> NetworkPolicy:
    return NetworkPolicy.allow([f"api.test:{port}"], resolve={"api.test": "127.0.0.1"}, inject=[_rule()])


@pytest.mark.parametrize("recorder", [b"X-Trailer: t\r\n\r\n"], indirect=True)
async def test_plain_http_forwards_one_request_with_its_chunked_body_and_the_header_replaced(
    recorder: Recorder,
) -> None:
    port, got = recorder.port, recorder.got
    host = f"api.test:{port}".encode()
    request = (
        b"POST http://%b/p HTTP/1.1\r\nHost: %b\r\nauthorization: mine\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"
        b"GET /pipelined HTTP/1.1\r\nHost: %b\r\nAuthorization: mine\r\n\r\n"
    ) % (host, host, host)
    answer = await _through(_policy(port), request)
    assert answer.endswith(b"ok")
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    assert head.startswith(b"POST /p HTTP/1.1\r\n")
    assert f"Authorization: {SECRET}".encode() in head and b"mine" not in got
    assert b"Connection: close" in head
    assert body == b"5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"  # and nothing pipelined after it


async def test_a_tunnel_to_an_injected_host_rewrites_every_request_it_carries(recorder: Recorder) -> None:
    port, got = recorder.port, recorder.got
    host = f"api.test:{port}".encode()
    request = (
        b"CONNECT %b HTTP/1.1\r\nHost: %b\r\n\r\n"
        b"POST /one HTTP/1.1\r\nHost: %b\r\nAuthorization: mine\r\nContent-Length: 3\r\n\r\nabc"
        b"GET /two HTTP/1.1\r\nHost: %b\r\nAUTHORIZATION: mine\r\nConnection: keep-alive\r\n\r\n"
    ) % (host, host, host, host)
    answer = await _through(_policy(port), request)
    assert answer.startswith(b"HTTP/1.1 200 Connection established") and answer.endswith(b"ok")
    sent = bytes(got)
    assert sent.count(f"Authorization: {SECRET}\r\n".encode()) == 2 and b"mine" not in sent
    assert b"\r\n\r\nabcGET /two HTTP/1.1\r\n" in sent and b"keep-alive" not in sent


async def test_a_request_for_another_host_in_an_injected_tunnel_is_refused(recorder: Recorder) -> None:
    port, got = recorder.port, recorder.got
    host = f"api.test:{port}".encode()
    request = b"CONNECT %b HTTP/1.1\r\nHost: %b\r\n\r\nGET / HTTP/1.1\r\nHost: evil.test\r\n\r\n" % (host, host)
    answer = await _through(_policy(port), request)
    assert b"400 Bad Request" in answer and b"does not name" in answer and NEEDLE.encode() not in answer
    assert NEEDLE.encode() not in got


# -- backends that cannot inject --------------------------------------------------------------------------------------


async def test_the_container_backend_refuses_injection_rules() -> None:
    from execspace.backends.container.egress import open_egress

    with pytest.raises(CapabilityError, match=r"NetworkPolicy\.inject"):
        await open_egress(None, "cid", Path("/nonexistent"), _policy(1), "runs/x", None)


def test_the_e2b_backend_hands_the_rules_to_the_service() -> None:
    from execspace.backends.e2b.network import sandbox_rules

    policy = NetworkPolicy.allow(["api.test"], inject=[_rule(), _rule(header="X-Key", value="k")])
    assert sandbox_rules(policy)["rules"] == {
        "api.test": [{"transform": {"headers": {"Authorization": SECRET, "X-Key": "k"}}}]
    }
    with pytest.raises(InvalidSpec, match="upstream_ca"):
        sandbox_rules(NetworkPolicy.allow(["api.test"], inject=[_rule()], upstream_ca=Path("/ca.pem")))


async def test_a_socks5_connection_to_an_injected_host_is_rewritten_too(recorder: Recorder) -> None:
    port, got = recorder.port, recorder.got
    name = b"api.test"
    greeting = b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(name)]) + name + port.to_bytes(2, "big")
    request = b"GET /s HTTP/1.1\r\nHost: api.test:%d\r\nAuthorization: mine\r\n\r\n" % port
    answer = await _through(_policy(port), greeting + request)
    assert answer.startswith(b"\x05\x00\x05\x00") and answer.endswith(b"ok")
    assert f"Authorization: {SECRET}\r\n".encode() in got and b"mine" not in got
