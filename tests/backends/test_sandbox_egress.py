"""Runs whose network is a NetworkPolicy, from inside real bubblewrap sandboxes: the egress proxy outside is their
only way out. Upstream servers are started by the tests on the host's loopback and named through the policy's
resolver pins (``allowed.test``, ``denied.test``); the sandbox has its own loopback, so only the proxy reaches them."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import shutil
import tarfile
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import sandbox_of
from execspace.errors import CapabilityError
from execspace.models import NetworkAttempt, NetworkPolicy, RunResult
from execspace.registry import probe_backend
from tests.support import ATTEMPTS, audit_file, make_traversable, served_directory

pytestmark = pytest.mark.timeout(120)


@dataclass
class Upstream:
    port: int
    root: Path
    requests: list[str]


def _wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel of ``demo-pkg`` 1.0 (``import demo_pkg`` prints nothing, has VALUE = 42)."""
    files = {
        "demo_pkg/__init__.py": b"VALUE = 42\n",
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("demo_pkg-1.0.dist-info/RECORD,,")
    path = directory / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("demo_pkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def _npm_registry(directory: Path, port: int) -> None:
    """A registry of one package, ``demo-npm`` 1.0.0, under ``/npm/`` (its packument and tarball as files)."""
    files = {"package/package.json": b'{"name": "demo-npm", "version": "1.0.0"}', "package/index.js": b"42;\n"}
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tf:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tf.addfile(info, io.BytesIO(content))
    tarball = data.getvalue()
    (directory / "tarballs").mkdir(parents=True)
    (directory / "tarballs" / "demo-npm-1.0.0.tgz").write_bytes(tarball)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tarball).digest()).decode()
    dist = {
        "tarball": f"http://allowed.test:{port}/npm/tarballs/demo-npm-1.0.0.tgz",
        "shasum": hashlib.sha1(tarball).hexdigest(),
        "integrity": integrity,
    }
    version = {"name": "demo-npm", "version": "1.0.0", "dist": dist}
    packument = {"name": "demo-npm", "dist-tags": {"latest": "1.0.0"}, "versions": {"1.0.0": version}}
    (directory / "demo-npm").write_text(json.dumps(packument))


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """An HTTP server on the host's loopback: ``/hello.txt`` and a PEP 503 simple index with one wheel."""
    root = tmp_path_factory.mktemp("upstream")
    (root / "hello.txt").write_text("hello from upstream\n")
    (root / "files").mkdir()
    wheel = _wheel(root / "files")
    (root / "simple" / "demo-pkg").mkdir(parents=True)
    (root / "simple" / "demo-pkg" / "index.html").write_text(f'<a href="../../files/{wheel.name}">{wheel.name}</a>')
    with served_directory(root) as (port, requests):
        _npm_registry(root / "npm", port)
        yield Upstream(port, root, requests)


def _policy(up: Upstream, *extra: str) -> NetworkPolicy:
    return NetworkPolicy.allow(
        [f"allowed.test:{up.port}", f"denied.test:{up.port}", f"localhost:{up.port}", *extra],
        deny=["denied.test"],
        resolve={"allowed.test": "127.0.0.1", "denied.test": "127.0.0.1"},
    )


Box = tuple[execspace.BaseEngine, execspace.Workspace]


@pytest.fixture
async def box(tmp_path: Path) -> AsyncIterator[Box]:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        yield engine, await engine.manager.create_workspace("egress/e2e")


async def run(box: Box, up: Upstream, cmd: str, *args: str, extra: tuple[str, ...] = ()) -> RunResult:
    engine, ws = box
    spec = RunProgramSpec(cmd, list(args), network=_policy(up, *extra), timeout=60)
    return await engine.runner.run_program(ws, spec)


async def test_curl_through_connect_reaches_an_allowed_name(box: Box, upstream: Upstream) -> None:
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    r = await run(box, upstream, "curl", "-sSf", "-m", "20", "--proxytunnel", url)
    assert (r.exit_code, r.stdout) == (0, "hello from upstream\n"), r.stderr
    (attempt,) = r.network_audit
    assert (attempt.host, attempt.protocol, attempt.allowed, attempt.address) == (
        "allowed.test",
        "connect",
        True,
        "127.0.0.1",
    )
    assert attempt.bytes_down > len("hello from upstream\n") and attempt.bytes_up > 0
    assert audit_file(box[1], r) == [attempt.as_dict()]


async def test_python_plain_http_and_curl_socks5_reach_an_allowed_name(box: Box, upstream: Upstream) -> None:
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    r = await run(box, upstream, "python3", "-c", f"import urllib.request as u; print(u.urlopen({url!r}).read())")
    assert r.exit_code == 0 and "hello from upstream" in r.stdout, r.stderr
    assert [(a.protocol, a.method, a.allowed) for a in r.network_audit] == [("http", "GET", True)]
    # ALL_PROXY is socks5h://: curl sends the name, the proxy resolves it
    r = await run(box, upstream, "sh", "-c", f'curl -sSf -m 20 -x "$ALL_PROXY" {url}')
    assert (r.exit_code, r.stdout) == (0, "hello from upstream\n"), r.stderr
    assert [(a.protocol, a.host, a.allowed) for a in r.network_audit] == [("socks5", "allowed.test", True)]


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        ("denied.test:{port}", "denied by 'denied.test'"),
        ("nowhere.test:{port}", "not on the allow-list"),
        ("allowed.test:{other}", "is not allowed"),
        ("127.0.0.1:{port}", "address 127.0.0.1 is not on the allow-list"),
        ("[::1]:{port}", "address ::1 is not on the allow-list"),
        ("localhost:{port}", "not a public address"),
    ],
)
async def test_refused_destinations_fail_and_are_audited(
    box: Box, upstream: Upstream, target: str, reason: str
) -> None:
    before = len(upstream.requests)
    url = "http://" + target.format(port=upstream.port, other=upstream.port + 1) + "/hello.txt"
    for flags in (["--proxytunnel"], []):  # CONNECT, plain HTTP
        r = await run(box, upstream, "curl", "-sSf", "-m", "20", *flags, url)
        assert r.exit_code != 0 and "hello from upstream" not in r.stdout
        (attempt,) = r.network_audit
        assert not attempt.allowed and reason in attempt.reason, attempt
        assert audit_file(box[1], r) == [attempt.as_dict()]
    assert len(upstream.requests) == before


async def test_a_host_header_or_sni_other_than_the_target_is_refused(box: Box, upstream: Upstream) -> None:
    before = len(upstream.requests)
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    r = await run(box, upstream, "curl", "-sSf", "-m", "20", "-H", "Host: denied.test", url)
    assert r.exit_code != 0
    assert "Host header" in r.network_audit[0].reason and not r.network_audit[0].allowed
    # a tunnel to allowed.test whose TLS names another server: the ClientHello never leaves
    fronted = f"https://elsewhere.test:{upstream.port}/"
    connect_to = f"elsewhere.test:{upstream.port}:allowed.test:{upstream.port}"
    r = await run(box, upstream, "curl", "-sS", "-m", "20", "-k", "--connect-to", connect_to, fronted)
    assert r.exit_code != 0
    assert "SNI 'elsewhere.test'" in r.network_audit[0].reason and not r.network_audit[0].allowed
    assert len(upstream.requests) == before


async def test_dns_and_direct_sockets_from_inside_go_nowhere(box: Box, upstream: Upstream) -> None:
    code = (
        ATTEMPTS
        + f"""
attempt("dns-pinned", lambda: socket.getaddrinfo("allowed.test", 80))
attempt("dns-public", lambda: socket.getaddrinfo("example.com", 80))
attempt("tcp-host-loopback", lambda: socket.create_connection(("127.0.0.1", {upstream.port}), timeout=5))
attempt("tcp-public", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
attempt("tcp6", lambda: socket.create_connection(("2606:4700:4700::1111", 80), timeout=5))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp-dns", lambda: u.sendto(b"x", ("8.8.8.8", 53)))
attempt("unix", lambda: socket.socket(socket.AF_UNIX))
"""
    )
    r = await run(box, upstream, "python3", "-c", code)
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert got["dns-pinned"].startswith("gaierror") and got["dns-public"].startswith("gaierror"), got
    assert got["tcp-host-loopback"] == "ConnectionRefusedError ECONNREFUSED", got
    assert got["tcp-public"].endswith("ENETUNREACH") and got["udp-dns"].endswith("ENETUNREACH"), got
    assert got["tcp6"].endswith(("ENETUNREACH", "EADDRNOTAVAIL")), got
    assert got["unix"] == "PermissionError EPERM", got
    assert r.network_audit == ()  # none of them reached the proxy


async def test_pip_installs_from_an_allowed_index_and_not_from_a_denied_one(box: Box, upstream: Upstream) -> None:
    engine, ws = box

    def pip(host: str) -> list[str]:
        return [
            "-m", "pip", "install", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
            "--target", f"/workspace/work/lib-{host}", "--index-url", f"http://{host}:{upstream.port}/simple/",
            "--trusted-host", host, "--retries", "0", "--timeout", "10", "demo-pkg",
        ]  # fmt: skip

    r = await run(box, upstream, "python3", *pip("allowed.test"))
    assert r.exit_code == 0, r.stderr
    assert ws.host_path is not None
    assert (ws.host_path / "work/lib-allowed.test/demo_pkg/__init__.py").read_text() == "VALUE = 42\n"
    assert {a.host for a in r.network_audit} == {"allowed.test"} and all(a.allowed for a in r.network_audit)
    r = await run(box, upstream, "python3", *pip("denied.test"))
    assert r.exit_code != 0
    assert not (ws.host_path / "work/lib-denied.test/demo_pkg").exists()
    assert r.network_audit and not any(a.allowed for a in r.network_audit)
    assert all(a.reason == "denied by 'denied.test'" for a in r.network_audit)


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm is not installed")
async def test_npm_installs_from_an_allowed_registry_and_not_from_a_denied_one(box: Box, upstream: Upstream) -> None:
    _, ws = box
    assert ws.host_path is not None

    def npm(host: str) -> list[str]:
        return [
            "install", "--prefix", f"/workspace/work/npm-{host}", "--registry", f"http://{host}:{upstream.port}/npm/",
            "--cache", "/workspace/tmp/npm-cache", "--no-audit", "--no-fund", "--no-update-notifier",
            "--fetch-retries", "0", "demo-npm",
        ]  # fmt: skip

    r = await run(box, upstream, "npm", *npm("allowed.test"))
    assert r.exit_code == 0, r.stderr
    assert (ws.host_path / "work/npm-allowed.test/node_modules/demo-npm/index.js").read_text() == "42;\n"
    assert r.network_audit and all(a.allowed and a.host == "allowed.test" for a in r.network_audit)
    r = await run(box, upstream, "npm", *npm("denied.test"))
    assert r.exit_code != 0
    assert not (ws.host_path / "work/npm-denied.test/node_modules/demo-npm").exists()
    assert r.network_audit and all(a.reason == "denied by 'denied.test'" for a in r.network_audit)


async def test_a_started_program_is_audited_too(box: Box, upstream: Upstream) -> None:
    engine, ws = box
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    spec = RunProgramSpec("curl", ["-sSf", "-m", "20", url], network=_policy(upstream), timeout=60)
    proc = await engine.runner.start_program(ws, spec)
    r = await proc.wait()
    assert r.exit_code == 0 and [a.allowed for a in r.network_audit] == [True]


async def test_backends_that_cannot_enforce_an_allow_list_refuse_it(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("egress/local")
        spec = RunProgramSpec("true", network=NetworkPolicy.allow(["example.com"]))
        with pytest.raises(CapabilityError, match="allow-list"):
            await engine.runner.run_program(ws, spec)


async def test_workspace_exec_with_an_allow_list_lists_the_attempts_in_its_result(box: Box, upstream: Upstream) -> None:
    from execspace.tools.workspace_exec import WorkspaceExecTool

    engine, _ = box
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    async with WorkspaceExecTool(engine, workspace_id="egress/tool", network=_policy(upstream)) as tool:
        out = await tool.call({"command": f"curl -sS {url}; curl -sSf http://denied.test:{upstream.port}/"})
    assert "hello from upstream" in out["stdout"]
    assert [(a["destination"], a["allowed"]) for a in out["network"]] == [
        (f"allowed.test:{upstream.port}", True),
        (f"denied.test:{upstream.port}", False),
    ]


@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_an_engine_wide_allow_list_holds_for_every_run_that_keeps_it(
    tmp_path: Path, upstream: Upstream, mode: str
) -> None:
    if not (await probe_backend("sandbox", mode=mode)).ok:
        pytest.skip("sandbox unavailable")
    make_traversable(tmp_path)
    options: dict[str, object] = {"mode": mode} if mode == "session" else {}
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", network=_policy(upstream), **options
    ) as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        ws = await engine.manager.create_workspace("egress/engine")
        url = f"http://allowed.test:{upstream.port}/hello.txt"
        script = f"curl -sSf {url} && ! curl -sSf http://denied.test:{upstream.port}/"
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], timeout=60))
        assert (r.exit_code, r.stdout) == (0, "hello from upstream\n"), r.stderr
        off = await engine.runner.run_program(ws, RunProgramSpec("curl", ["-sSf", url], network="off", timeout=60))
        assert off.exit_code != 0 and off.network_audit == ()
        assert ws.host_path is not None
        audits = [
            json.loads(line) for f in ws.host_path.glob("runs/*/network.jsonl") for line in f.read_text().splitlines()
        ]
        assert sorted((a["host"], a["allowed"]) for a in audits) == [("allowed.test", True), ("denied.test", False)]
        # in session mode too the run has a proxy of its own, auditing into its own directory and result
        assert [a.allowed for a in r.network_audit] == [True, False]
        # the file has each attempt when it ended: the allowed one may end (its connection seen closed) after the denied
        assert sorted((a["time"], a["host"]) for a in audit_file(ws, r)) == [(a.time, a.host) for a in r.network_audit]


async def test_two_runs_in_one_session_each_see_only_their_own_attempts(tmp_path: Path, upstream: Upstream) -> None:
    if not (await probe_backend("sandbox", mode="session")).ok:
        pytest.skip("sandbox unavailable")
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", network=_policy(upstream), mode="session"
    ) as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        ws = await engine.manager.create_workspace("egress/two-runs")
        first = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", "echo x > /tmp/session-mark"]))
        assert first.exit_code == 0, first.stderr

        def fetch(host: str, times: int) -> RunProgramSpec:
            # /tmp is the session's: both runs share its sandbox, and both run at once
            url = f"http://{host}:{upstream.port}/hello.txt"
            script = f"test -f /tmp/session-mark && for i in $(seq {times}); do curl -s -o /dev/null {url}; done"
            return RunProgramSpec("sh", ["-c", script], timeout=60)

        one, two = await asyncio.gather(
            engine.runner.run_program(ws, fetch("allowed.test", 3)),
            engine.runner.run_program(ws, fetch("denied.test", 2)),
        )
        assert (one.exit_code, two.exit_code) == (0, 0), (one.stderr, two.stderr)
        assert [(a.host, a.allowed) for a in one.network_audit] == [("allowed.test", True)] * 3
        assert [(a.host, a.allowed) for a in two.network_audit] == [("denied.test", False)] * 2
        assert {a.run_id for a in one.network_audit} == {Path(one.run_dir).name}
        assert [a["host"] for a in audit_file(ws, one)] == ["allowed.test"] * 3
        assert [a["host"] for a in audit_file(ws, two)] == ["denied.test"] * 2


async def test_on_network_attempt_approves_an_unlisted_name_for_a_sandboxed_program(
    tmp_path: Path, upstream: Upstream
) -> None:
    if not (await probe_backend("sandbox")).ok:
        pytest.skip("sandbox unavailable")
    make_traversable(tmp_path)
    asked: list[str] = []

    async def approve(attempt: NetworkAttempt) -> bool:
        asked.append(f"{attempt.host}:{attempt.port}")
        return True

    net = NetworkPolicy.allow([], resolve={"approved.test": "127.0.0.1"})
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", network=net, on_network_attempt=approve
    ) as engine:
        if not engine.describe().network_domains:
            pytest.skip("no C compiler: the egress bridge cannot be built here")
        ws = await engine.manager.create_workspace("egress/approve")
        url = f"http://approved.test:{upstream.port}/hello.txt"
        r = await engine.runner.run_program(ws, RunProgramSpec("curl", ["-sSf", url], timeout=60))
    assert (r.exit_code, r.stdout) == (0, "hello from upstream\n"), r.stderr
    assert asked == [f"approved.test:{upstream.port}"]
    assert [a.reason for a in r.network_audit] == ["approved by on_network_attempt"]


async def test_runs_leave_no_fd_or_task_behind_even_when_killed_mid_tunnel(box: Box, upstream: Upstream) -> None:
    engine, ws = box
    url = f"http://allowed.test:{upstream.port}/hello.txt"
    # one complete run first: the bridge is built and the caches are warm before counting
    assert (await run(box, upstream, "curl", "-sSf", url)).exit_code == 0
    before = len(os.listdir("/proc/self/fd"))
    tasks_before = len(asyncio.all_tasks())
    hold = (
        "import socket, time\n"
        "s = socket.create_connection(('127.0.0.1', 3128))\n"
        f"s.sendall(b'CONNECT allowed.test:{upstream.port} HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n')\n"
        "assert s.recv(100).startswith(b'HTTP/1.1 200')\n"
        "s.sendall(b'GET /hello.txt HTTP/1.0\\r\\n\\r\\n')\n"
        "print(len(s.recv(1000)), flush=True)\n"
        "time.sleep(60)\n"
    )
    for _ in range(3):
        spec = RunProgramSpec("python3", ["-c", hold], network=_policy(upstream), timeout=2)
        r = await engine.runner.run_program(ws, spec)
        assert r.timed_out, r.stderr
        (attempt,) = r.network_audit
        assert attempt.allowed and attempt.bytes_up > 0 and attempt.bytes_down > 0
    for _ in range(100):  # the cancelled connection tasks finish on the next loop turns
        if len(asyncio.all_tasks()) <= tasks_before:
            break
        await asyncio.sleep(0.01)
    assert len(asyncio.all_tasks()) <= tasks_before
    assert len(os.listdir("/proc/self/fd")) <= before


async def test_an_allow_list_run_whose_sandbox_cannot_start_fails_as_any_run_and_leaves_no_fd(
    box: Box, upstream: Upstream
) -> None:
    """The start fails (no bwrap there): the run is over before it began, its channel closed once — bwrap's ends
    are taken back by the channel's close, not closed again after the failed spawn (whose fd numbers another
    open may have reused by then)."""
    engine, ws = box
    assert (await run(box, upstream, "true")).exit_code == 0  # the bridge is built before counting
    before = sorted(os.listdir("/proc/self/fd"))
    sandbox_of(engine.runner).bwrap = "/nonexistent/bwrap"
    r = await run(box, upstream, "true")
    assert r.exit_code == 127 and not r.network_audit, r
    assert sorted(os.listdir("/proc/self/fd")) == before
