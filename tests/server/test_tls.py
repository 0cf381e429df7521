"""``execspace serve --tls-cert/--tls-key``: HTTPS on the one port, HTTP/2 by ALPN and HTTP/1.1 for clients that do
not offer it; the official SDK works over it unchanged (trusting the certificate as a user's machine would)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .conftest import API_KEY, Server, running_server

trustme = pytest.importorskip("trustme", reason="the test CA comes from trustme (pip install 'execspace[dev]')")
pytest.importorskip("hypercorn", reason="TLS is served by hypercorn (pip install 'execspace[serve]')")
e2b = pytest.importorskip("e2b")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def tls_server(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    files = tmp_path_factory.mktemp("tls")
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(files / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(files / "cert.pem"))
    for extra in cert.cert_chain_pems[1:]:
        extra.write_to_path(str(files / "cert.pem"), append=True)
    flags = ("--tls-cert", str(files / "cert.pem"), "--tls-key", str(files / "key.pem"))
    with running_server(tmp_path_factory.mktemp("serve-tls"), *flags) as server:
        yield server


def _client(ca: trustme.CA, *, http2: bool) -> httpx.Client:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return httpx.Client(verify=context, http2=http2, headers={"X-API-KEY": API_KEY})


def test_it_listens_on_https_and_speaks_http2_by_alpn_and_http1_otherwise(tls_server: Server, ca: trustme.CA) -> None:
    assert tls_server.url.startswith("https://127.0.0.1:")
    with _client(ca, http2=True) as client:
        answer = client.get(f"{tls_server.url}/sandboxes")
        assert (answer.status_code, answer.http_version) == (200, "HTTP/2")
    with _client(ca, http2=False) as client:
        answer = client.get(f"{tls_server.url}/sandboxes")
        assert (answer.status_code, answer.http_version) == (200, "HTTP/1.1")


def test_plain_http_on_the_tls_port_gets_no_answer(tls_server: Server) -> None:
    plain = tls_server.url.replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{plain}/sandboxes", headers={"X-API-KEY": API_KEY}, timeout=5)


_SDK_OVER_TLS = """
from e2b import Sandbox
sandbox = Sandbox.create(timeout=60)
try:
    assert sandbox.commands.run("echo over tls").stdout == "over tls\\n"
    sandbox.files.write("/home/user/b.bin", bytes(range(256)))
    assert sandbox.files.read("/home/user/b.bin", format="bytes") == bytes(range(256))
finally:
    sandbox.kill()
print("ok")
"""


def test_the_official_sdk_runs_unchanged_over_https(tls_server: Server, ca: trustme.CA, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    # the SDK's HTTP client reads the CA bundle named by SSL_CERT_FILE once per process: a new process, as a user's
    env = {**os.environ, **tls_server.sdk_env(), "SSL_CERT_FILE": str(bundle)}
    done = subprocess.run([sys.executable, "-c", _SDK_OVER_TLS], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
    env.pop("SSL_CERT_FILE")
    refused = subprocess.run(
        [sys.executable, "-c", _SDK_OVER_TLS], capture_output=True, text=True, timeout=120, env=env
    )
    assert refused.returncode != 0 and "certificate" in refused.stderr  # an untrusted server is refused


def test_files_stream_and_refusals_arrive_over_http2(tls_server: Server, ca: trustme.CA) -> None:
    """A download streamed with its length, and an upload's refusal (HTTP/1's ``Connection: close`` has no place in
    HTTP/2), both over HTTP/2."""
    with _client(ca, http2=True) as client:
        created = client.post(f"{tls_server.url}/sandboxes", json={"templateID": "base", "timeout": 60})
        assert created.status_code == 201, created.text
        sandbox = created.json()
        headers = {"E2b-Sandbox-Id": sandbox["sandboxID"], "X-Access-Token": sandbox["envdAccessToken"]}
        try:
            octet = {**headers, "Content-Type": "application/octet-stream"}
            data = os.urandom(3 * 1024 * 1024)
            put = client.post(f"{tls_server.url}/files", params={"path": "d.bin"}, content=data, headers=octet)
            assert (put.status_code, put.http_version) == (200, "HTTP/2"), put.text
            got = client.get(f"{tls_server.url}/files", params={"path": "d.bin"}, headers=headers)
            assert (got.status_code, got.content, got.headers["content-length"]) == (200, data, str(len(data)))
            # on a connection of its own: hypercorn 0.18 drops a connection that brings body data for a stream
            # it already answered (a KeyError in its h2 protocol), which an early refusal can be
            with _client(ca, http2=True) as other:
                refused = other.post(f"{tls_server.url}/files", params={"path": "/etc/x"}, content=b"x", headers=octet)
            # /etc is outside the home: the sandbox's own, which its user may not write (a machine, as root), or
            # no path of the sandbox at all
            expected = 403 if os.geteuid() == 0 else 400
            assert (refused.status_code, refused.http_version) == (expected, "HTTP/2"), refused.text
            assert "connection" not in refused.headers
        finally:
            client.delete(f"{tls_server.url}/sandboxes/{sandbox['sandboxID']}")


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def _serve(*flags: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", API_KEY, *flags]
    env = {**os.environ, "EXECSPACE_DAEMON": "off"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


def test_a_certificate_without_its_key_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = _serve("--tls-cert", str(tmp_path / "cert.pem"))
    assert done.returncode == 125 and "--tls-cert and --tls-key go together" in done.stderr


def test_a_key_that_is_not_the_certificates_is_a_clear_setup_error(ca: trustme.CA, tmp_path: Path) -> None:
    ca.issue_cert("127.0.0.1").cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.issue_cert("127.0.0.1").private_key_pem.write_to_path(str(tmp_path / "other.pem"))
    done = _serve("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "other.pem"))
    assert done.returncode == 125, done.stderr
    assert "cannot load the TLS certificate" in done.stderr and "listening on" not in done.stdout
