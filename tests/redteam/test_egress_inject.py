"""Credentials injected by the egress proxy (``NetworkPolicy.inject``), from inside real sandboxes (both modes)
against loopback upstreams on the host: the upstream gets the header over plain HTTP and HTTPS (the sandbox's
programs trust the run's CA through the usual variables), the program's own header of that name never gets there,
the value is nowhere the program can read, a host without a rule is tunnelled untouched (its TLS is the
program's own), and a request that names another host through an injected host's connection is refused."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import ssl
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.models import HeaderInjection, NetworkPolicy, RunResult, Secret
from execspace.registry import probe_backend
from tests.support import CLI, make_traversable

trustme = pytest.importorskip(
    "trustme", reason="the upstream's test CA comes from trustme (pip install 'execspace[dev]')"
)
pytest.importorskip("cryptography", reason="the sandbox's CA needs pip install 'execspace[inject]'")

pytestmark = pytest.mark.timeout(180)

TOKEN = "Bearer inj-" + os.urandom(12).hex()
#: A part of the token the program searches for: the value without its scheme word.
NEEDLE = TOKEN.split()[1]


@dataclass
class Upstream:
    """One loopback server (plain HTTP or TLS with a test CA's certificate for allowed.test and other.test): what
    each request carried."""

    port: int
    seen: list[dict[str, Any]] = field(default_factory=list)


def _serve(tls: ssl.SSLContext | None) -> Iterator[Upstream]:
    up = Upstream(0)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: several requests per connection

        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            up.seen.append(
                {
                    "path": self.path,
                    "host": self.headers.get("Host"),
                    "auth": self.headers.get_all("Authorization") or [],
                    "body": body.decode(errors="replace"),
                }
            )
            data = f"ok {self.path}".encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    up.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield up
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def test_ca() -> Any:
    return trustme.CA()


@pytest.fixture(scope="module")
def ca_file(test_ca: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ca") / "upstream-ca.pem"
    test_ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def plain() -> Iterator[Upstream]:
    yield from _serve(None)


@pytest.fixture
def secure(test_ca: Any) -> Iterator[Upstream]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    test_ca.issue_cert("allowed.test", "other.test").configure_cert(context)
    yield from _serve(context)


@pytest.fixture
async def engine(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[execspace.BaseEngine]:
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as opened:
        if not opened.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        yield opened


def _policy(*ports: int, upstream_ca: Path | None = None, other: bool = False) -> NetworkPolicy:
    allowed = [f"allowed.test:{p}" for p in ports] + ([f"other.test:{p}" for p in ports] if other else [])
    return NetworkPolicy.allow(
        allowed,
        resolve={"allowed.test": "127.0.0.1", "other.test": "127.0.0.1"},
        inject=[HeaderInjection("allowed.test", "Authorization", Secret(TOKEN))],
        upstream_ca=upstream_ca,
    )


async def _run(engine: execspace.BaseEngine, argv: list[str], policy: NetworkPolicy) -> tuple[RunResult, Any]:
    ws = await engine.manager.create_workspace(f"inject-{os.urandom(3).hex()}")
    spec = RunProgramSpec(argv[0], argv[1:], network=policy, timeout=90)
    result = await engine.runner.run_program(ws, spec)
    return result, ws


def _py(code: str) -> list[str]:
    return ["python3", "-c", code]


def _no_secret_in(result: RunResult, ws: Any) -> None:
    """The value is in neither the run's output, its result's audit, nor the audit file."""
    assert ws.host_path is not None
    audit = (ws.host_path / result.run_dir / "network.jsonl").read_text()
    assert NEEDLE not in audit and NEEDLE not in repr(result.network_audit)
    assert NEEDLE not in result.stdout + result.stderr


async def test_plain_http_gets_the_header_and_the_programs_own_is_replaced(
    engine: execspace.BaseEngine, plain: Upstream
) -> None:
    code = f"""
import urllib.request
for i in range(2):
    req = urllib.request.Request('http://allowed.test:{plain.port}/p%d' % i, headers={{'Authorization': 'mine'}})
    print(urllib.request.urlopen(req, timeout=20).read().decode())
"""
    curl = f"curl -sS -H 'Authorization: mine' -d body=1 http://allowed.test:{plain.port}/c"
    result, ws = await _run(engine, ["sh", "-c", f'python3 -c "{code}" && {curl}'], _policy(plain.port))
    assert result.exit_code == 0, result.stderr
    assert "ok /p0" in result.stdout and "ok /c" in result.stdout
    assert [s["path"] for s in plain.seen] == ["/p0", "/p1", "/c"]
    assert all(s["auth"] == [TOKEN] for s in plain.seen), plain.seen
    assert plain.seen[-1]["body"] == "body=1"
    _no_secret_in(result, ws)


async def test_https_is_ended_with_the_runs_ca_and_verified_upstream(
    engine: execspace.BaseEngine, secure: Upstream, ca_file: Path
) -> None:
    """Python's urllib (SSL_CERT_FILE) and curl (CURL_CA_BUNDLE) trust the run's CA; the proxy verifies the
    upstream against the test CA it was given. Three requests on one kept-alive connection each get the header."""
    code = f"""
import http.client, os, ssl, urllib.request
print(urllib.request.urlopen(urllib.request.Request('https://allowed.test:{secure.port}/u',
      headers={{'Authorization': 'mine'}}), timeout=20).read().decode())
conn = http.client.HTTPSConnection('127.0.0.1', 3128, context=ssl.create_default_context(), timeout=20)
conn.set_tunnel('allowed.test', {secure.port})
for i in range(3):
    conn.request('GET', '/k%d' % i, headers={{'Authorization': 'mine'}})
    print(conn.getresponse().read().decode())
print('issuer', dict(x[0] for x in conn.sock.getpeercert()['issuer'])['commonName'])
"""
    curl = f"curl -sS -H 'Authorization: mine' https://allowed.test:{secure.port}/c"
    policy = _policy(secure.port, upstream_ca=ca_file)
    result, ws = await _run(engine, ["sh", "-c", f'python3 -c "{code}" && {curl}'], policy)
    assert result.exit_code == 0, result.stderr
    assert "ok /u" in result.stdout and "ok /k2" in result.stdout and "ok /c" in result.stdout
    assert "issuer execspace egress proxy" in result.stdout  # the program's TLS ended at the proxy
    assert [s["path"] for s in secure.seen] == ["/u", "/k0", "/k1", "/k2", "/c"]
    assert all(s["auth"] == [TOKEN] for s in secure.seen), secure.seen
    assert any("TLS ended by the proxy" in a.reason for a in result.network_audit)
    _no_secret_in(result, ws)


async def test_a_host_without_a_rule_keeps_the_programs_own_tls_and_gets_no_header(
    engine: execspace.BaseEngine, secure: Upstream, ca_file: Path
) -> None:
    """other.test is allowed but has no rule: the program, trusting only the upstream's test CA (copied into the
    workspace), verifies the upstream's own certificate through a plain tunnel."""
    code = f"""
import http.client, os, ssl
ca = os.path.join(os.environ['WORKSPACE_DIR'], 'upstream-ca.pem')
conn = http.client.HTTPSConnection('127.0.0.1', 3128, timeout=20, context=ssl.create_default_context(cafile=ca))
conn.set_tunnel('other.test', {secure.port})
conn.request('GET', '/o', headers={{'Authorization': 'mine'}})
print(conn.getresponse().read().decode())
print('issuer', dict(x[0] for x in conn.sock.getpeercert()['issuer'])['organizationName'])
"""
    ws = await engine.manager.create_workspace("inject-other")
    assert ws.host_path is not None
    (ws.host_path / "upstream-ca.pem").write_bytes(ca_file.read_bytes())
    spec = RunProgramSpec("python3", ["-c", code], network=_policy(secure.port, upstream_ca=ca_file, other=True))
    result = await engine.runner.run_program(ws, spec)
    assert result.exit_code == 0, result.stderr
    assert "ok /o" in result.stdout and "issuer trustme" in result.stdout
    assert secure.seen == [{"path": "/o", "host": f"other.test:{secure.port}", "auth": ["mine"], "body": ""}]
    assert not any("injected" in a.reason for a in result.network_audit)


async def test_the_value_is_nowhere_the_program_can_read(engine: execspace.BaseEngine, plain: Upstream) -> None:
    """The program reads every file of its view that is not a host system directory bound read-only (/etc, the
    root, /tmp, /dev, the workspace, the trust bundle…), every process's environ and cmdline, and its own
    environment, after a request that got the header."""
    code = f"""
import os, urllib.request
urllib.request.urlopen('http://allowed.test:{plain.port}/', timeout=20).read()
needle = {NEEDLE[::-1]!r}[::-1].encode()  # reversed: the program's own argv must not hold it
hits, read = [], 0
skip = {{'proc', 'sys', 'usr', 'bin', 'sbin', 'lib', 'lib32', 'lib64', 'libx32', 'opt', 'var', 'nix', 'snap'}}
tops = ['/' + e for e in os.listdir('/') if e not in skip]
for top in tops:
    for root, dirs, files in os.walk(top) if os.path.isdir(top) else [('/', [], [top[1:]])]:
        for name in files:
            path = os.path.join(root, name)
            try:
                if not os.path.isfile(path):
                    continue
                with open(path, 'rb') as f:
                    data = f.read(4 << 20)
            except OSError:
                continue
            read += 1
            if needle in data:
                hits.append(path)
for pid in [p for p in os.listdir('/proc') if p.isdigit()] + ['self']:
    for what in ('environ', 'cmdline'):
        try:
            with open(f'/proc/{{pid}}/{{what}}', 'rb') as f:
                if needle in f.read():
                    hits.append(f'/proc/{{pid}}/{{what}}')
        except OSError:
            pass
if any(needle.decode() in v for v in os.environ.values()):
    hits.append('os.environ')
print('read', read, 'hits', hits)
"""
    result, ws = await _run(engine, _py(code), _policy(plain.port))
    assert result.exit_code == 0, result.stderr
    assert plain.seen and plain.seen[0]["auth"] == [TOKEN]
    assert "hits []" in result.stdout, result.stdout
    assert int(result.stdout.split()[1]) > 50  # it did read the view (/etc, the bundle, the workspace…)
    _no_secret_in(result, ws)


async def test_the_callers_own_variable_holding_the_value_is_not_passed_on(
    engine: execspace.BaseEngine, plain: Upstream
) -> None:
    """A run that sets a variable to the value (an inherited or explicit one) does not get it: what the proxy
    adds, the program never holds."""
    ws = await engine.manager.create_workspace("inject-env")
    code = "import os; print(sorted(k for k, v in os.environ.items() if 'inj-' in v))"
    spec = RunProgramSpec("python3", ["-c", code], env={"PLAIN_NAME": TOKEN}, network=_policy(plain.port))
    result = await engine.runner.run_program(ws, spec)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "[]"


async def test_a_request_naming_another_host_through_an_injected_connection_is_refused(
    engine: execspace.BaseEngine, plain: Upstream, secure: Upstream, ca_file: Path
) -> None:
    """Domain fronting: a tunnel to allowed.test whose request says Host: other.test (plain and in TLS), and a
    plain proxy request whose second, pipelined request would go out unread: none reaches an upstream with the
    value or the program's own header."""
    code = f"""
import socket, ssl
def ask(data, tls=False, port={plain.port}):
    s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
    s.sendall(b'CONNECT allowed.test:%d HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n' % port)
    assert s.recv(4096).startswith(b'HTTP/1.1 200')
    if tls:
        s = ssl.create_default_context().wrap_socket(s, server_hostname='allowed.test')
    s.sendall(data)
    out = b''
    while chunk := s.recv(65536):
        out += chunk
    print(out.split(b'\\r\\n')[0].decode())
ask(b'GET /front HTTP/1.1\\r\\nHost: other.test:{plain.port}\\r\\n\\r\\n')
ask(b'GET /front HTTP/1.1\\r\\nHost: other.test:{secure.port}\\r\\n\\r\\n', tls=True, port={secure.port})
s = socket.create_connection(('127.0.0.1', 3128), timeout=20)
host = b'allowed.test:{plain.port}'
s.sendall(b'GET http://%s/one HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\nGET /two HTTP/1.1\\r\\nHost: %s\\r\\n'
          b'Authorization: mine\\r\\n\\r\\n' % (host, host, host))
out = b''
while chunk := s.recv(65536):
    out += chunk
print(out.count(b'HTTP/1.1 200'), 'answers')
"""
    policy = _policy(plain.port, secure.port, upstream_ca=ca_file, other=True)
    result, ws = await _run(engine, _py(code), policy)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["HTTP/1.1 400 Bad Request"] * 2 and lines[2] == "1 answers", result.stdout
    assert [s["path"] for s in plain.seen] == ["/one"] and plain.seen[0]["auth"] == [TOKEN]
    assert secure.seen == []
    assert sum("the Host header does not name" in a.reason for a in result.network_audit) == 2
    _no_secret_in(result, ws)


async def test_an_upstream_that_does_not_verify_gets_no_request(engine: execspace.BaseEngine, secure: Upstream) -> None:
    """Without the test CA the proxy verifies the upstream against this machine's trust store: the handshake fails,
    the program gets a 502 naming it, and the upstream never sees a request (nor the value)."""
    code = f"""
import urllib.error, urllib.request
try:
    urllib.request.urlopen('https://allowed.test:{secure.port}/x', timeout=20)
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"""
    result, ws = await _run(engine, _py(code), _policy(secure.port))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("502") and "certificate verify failed" in result.stdout, result.stdout
    assert secure.seen == []
    audit = [a for a in result.network_audit if a.port == secure.port]
    assert audit and not audit[0].allowed and "certificate verify failed" in audit[0].reason
    _no_secret_in(result, ws)


def test_the_cli_injects_from_the_callers_environment(tmp_path: Path, plain: Upstream) -> None:
    """``execspace run --inject-header allowed.test:Authorization=env:VAR``: the upstream sees the value; the
    program's environ and /proc do not hold it."""
    code = f"""
import os, urllib.request
print(urllib.request.urlopen('http://allowed.test:{plain.port}/cli', timeout=20).read().decode())
env = open('/proc/self/environ', 'rb').read().decode(errors='replace')
needle = {NEEDLE[::-1]!r}[::-1]
print('LEAK' if needle in env or any(needle in v for v in os.environ.values()) else 'NOLEAK')
"""
    make_traversable(tmp_path)
    argv = [
        *CLI,
        "run",
        "--backend",
        "sandbox",
        "--workspace",
        str(tmp_path / "ws"),
        "--allow-domain",
        f"allowed.test:{plain.port}",
        "--resolve",
        "allowed.test=127.0.0.1",
        "--inject-header",
        "allowed.test:Authorization=env:INJ_TEST_TOKEN",
        "--json",
        "--",
        *_py(code),
    ]
    env = dict(os.environ, EXECSPACE_DAEMON="off", INJ_TEST_TOKEN=TOKEN)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=150, cwd=tmp_path)
    if "sandbox unavailable" in done.stderr or "no C compiler" in done.stderr:
        pytest.skip(done.stderr[-200:])
    assert done.returncode == 0, done.stderr[-800:]
    out = json.loads(done.stdout)
    assert "ok /cli" in out["stdout"] and "NOLEAK" in out["stdout"], out["stdout"]
    assert plain.seen[-1]["auth"] == [TOKEN]
    assert NEEDLE not in done.stdout + done.stderr


async def test_an_engines_own_policy_injects_for_every_run(
    tmp_path: Path, sandbox_mode: Mapping[str, Any], secure: Upstream, ca_file: Path
) -> None:
    """The policy given to the engine (``network=``) rather than to a run: each run gets its own CA and the header
    (in session mode such a run gets a sandbox of its own, its CA with it)."""
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    policy = _policy(secure.port, upstream_ca=ca_file)
    code = f"import urllib.request; print(urllib.request.urlopen('https://allowed.test:{secure.port}/e').read())"
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", network=policy, **sandbox_mode
    ) as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        ws = await engine.manager.create_workspace("inject-engine")
        for _ in range(2):
            result = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", code], timeout=60))
            assert result.exit_code == 0, result.stderr
    assert [s["auth"] for s in secure.seen] == [[TOKEN], [TOKEN]]


_NODE = """
const http = require('http'), tls = require('tls');
const port = Number(process.argv[1]);
const ask = {host: '127.0.0.1', port: 3128, method: 'CONNECT', path: `allowed.test:${port}`};
http.request(ask).on('connect', (res, sock) => {
  const s = tls.connect({socket: sock, servername: 'allowed.test'}, () => {
    s.write(`GET /node HTTP/1.1\\r\\nHost: allowed.test:${port}\\r\\nAuthorization: mine\\r\\n`);
    s.write('Connection: close\\r\\n\\r\\n');
  });
  let out = '';
  s.on('data', (d) => { out += d; });
  s.on('end', () => { console.log(out.split('\\r\\n')[0], out.endsWith('ok /node')); });
  s.on('error', (e) => { console.log('error', e.message); process.exit(1); });
}).end();
"""


async def test_node_trusts_the_runs_ca_through_node_extra_ca_certs(
    engine: execspace.BaseEngine, secure: Upstream, ca_file: Path
) -> None:
    """Node.js has its own roots: it trusts the run's CA through ``NODE_EXTRA_CA_CERTS`` alone."""
    if shutil.which("node") is None:
        pytest.skip("no node on this host")
    argv = ["node", "-e", _NODE, str(secure.port)]
    result, ws = await _run(engine, argv, _policy(secure.port, upstream_ca=ca_file))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "HTTP/1.1 200 OK true"
    assert secure.seen[-1]["auth"] == [TOKEN]
    _no_secret_in(result, ws)
