"""The control plane through the official SDK (sync and async), and its routes the SDK does not reach."""

from __future__ import annotations

import http.server
import os
import random
import subprocess
import sys
import threading
import time
import urllib.parse
from datetime import UTC, datetime

import httpx
import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import AuthenticationException, NotFoundException, RateLimitException

from execspace.errors import InvalidSpec
from execspace.server import ServerOptions

from .conftest import Server, in_homes, running_server


def test_create_info_kill() -> None:
    sbx = Sandbox.create(metadata={"owner": "me"}, timeout=120)
    try:
        info = sbx.get_info()
        assert info.sandbox_id == sbx.sandbox_id
        assert info.metadata == {"owner": "me"}
        assert info.state is SandboxState.RUNNING
        assert 110 <= (info.end_at - info.started_at).total_seconds() <= 121
        assert info.envd_version == "0.6.4"
        assert sbx.is_running()
    finally:
        assert sbx.kill() is True
    assert not sbx.is_running()
    assert Sandbox.kill(sbx.sandbox_id) is False
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_connect_keeps_or_extends_the_lifetime() -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        end = sbx.get_info().end_at
        same = Sandbox.connect(sbx.sandbox_id)
        assert same.sandbox_id == sbx.sandbox_id
        assert Sandbox.get_info(sbx.sandbox_id).end_at == end
        Sandbox.connect(sbx.sandbox_id, timeout=600)
        assert (Sandbox.get_info(sbx.sandbox_id).end_at - end).total_seconds() > 500
    finally:
        sbx.kill()
    with pytest.raises(NotFoundException):
        Sandbox.connect(sbx.sandbox_id)


def test_set_timeout_moves_the_end() -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        sbx.set_timeout(3000)
        left = (sbx.get_info().end_at - datetime.now(UTC)).total_seconds()
        assert 2990 < left <= 3000
    finally:
        sbx.kill()


def test_a_timeout_of_zero_ends_the_sandbox_or_pauses_it_now() -> None:
    """E2B's ``set_timeout(0)`` (its SDK's own tests use it to pause at once): the sandbox's end is now."""
    ending = Sandbox.create(timeout=60)
    pausing = Sandbox.create(timeout=60, lifecycle={"on_timeout": "pause"})
    try:
        ending.set_timeout(0)
        pausing.set_timeout(0)
        deadline = time.monotonic() + 10
        while (ending.is_running() or pausing.is_running()) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(NotFoundException):
            ending.get_info()
        assert pausing.get_info().state == SandboxState.PAUSED
        again = Sandbox.connect(pausing.sandbox_id)
        assert again.commands.run("echo back").stdout == "back\n"
    finally:
        pausing.kill()


def test_expired_sandbox_is_reaped_with_its_workspace(e2b_server: Server) -> None:
    sbx = Sandbox.create(timeout=1)
    sbx.files.write("f.txt", "x")
    workspaces = in_homes(e2b_server.root, "f.txt")
    assert workspaces, "the file is in a workspace under the server's root"
    deadline = time.monotonic() + 10
    while sbx.is_running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sbx.is_running()
    with pytest.raises(NotFoundException):
        sbx.get_info()
    while any(p.exists() for p in workspaces) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(p.exists() for p in workspaces)


def test_list_filters_by_metadata_and_state_and_pages() -> None:
    tag = f"list-{time.monotonic_ns()}"
    made = [Sandbox.create(metadata={"tag": tag, "n": str(i), "odd key&=": "v =&%"}) for i in range(5)]
    try:
        query = SandboxQuery(metadata={"tag": tag})
        pager = Sandbox.list(query=query, limit=2)
        pages = []
        while pager.has_next:
            pages.append([s.sandbox_id for s in pager.next_items()])
        assert [len(p) for p in pages] == [2, 2, 1]
        listed = [i for p in pages for i in p]
        assert listed == [s.sandbox_id for s in reversed(made)], "newest first, each once"
        odd = Sandbox.list(query=SandboxQuery(metadata={"odd key&=": "v =&%", "n": "3"})).next_items()
        assert [s.sandbox_id for s in odd] == [made[3].sandbox_id]
        paused = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[SandboxState.PAUSED]))
        assert paused.next_items() == []
    finally:
        for s in made:
            s.kill()
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []


async def test_async_lifecycle() -> None:
    sbx = await AsyncSandbox.create(metadata={"kind": "async"}, envs={"A": "1"})
    try:
        assert (await sbx.get_info()).metadata == {"kind": "async"}
        assert await sbx.is_running()
        await sbx.set_timeout(100)
        again = await AsyncSandbox.connect(sbx.sandbox_id)
        assert again.sandbox_id == sbx.sandbox_id
        found = await AsyncSandbox.list(query=SandboxQuery(metadata={"kind": "async"})).next_items()
        assert sbx.sandbox_id in [s.sandbox_id for s in found]
    finally:
        assert await sbx.kill()
    assert not await sbx.is_running()


def test_list_order_started_after_and_template(e2b_server: Server) -> None:
    tag = f"order-{time.monotonic_ns()}"
    made = [Sandbox.create(metadata={"tag": tag}) for _ in range(3)]
    try:
        query = urllib.parse.urlencode({"tag": tag})
        with httpx.Client(base_url=e2b_server.url, headers={"X-API-KEY": e2b_server.key}) as http:
            asc = http.get("/v2/sandboxes", params={"metadata": query, "order": "asc"}).json()
            assert [s["sandboxID"] for s in asc] == [s.sandbox_id for s in made]
            after = http.get("/v2/sandboxes", params={"metadata": query, "startedAfter": asc[1]["startedAt"]}).json()
            assert [s["sandboxID"] for s in after] == [made[2].sandbox_id, made[1].sandbox_id]  # inclusive
            other = http.get("/v2/sandboxes", params={"metadata": query, "template": "code-interpreter-v1"}).json()
            assert other == []
            bad = http.get("/v2/sandboxes", params={"nextToken": "garbage!"})
            assert bad.status_code == 400
    finally:
        for s in made:
            s.kill()


def test_wrong_api_key_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("E2B_API_KEY", "e2b_ffff")
    with pytest.raises(AuthenticationException):
        Sandbox.create()
    with pytest.raises(AuthenticationException):
        Sandbox.list().next_items()


def test_v1_routes_and_unknown_routes(e2b_server: Server) -> None:
    """e2b <= 2.50 creates and connects with the v1 routes; routes we do not serve answer 501 naming them."""
    headers = {"X-API-KEY": e2b_server.key}
    with httpx.Client(base_url=e2b_server.url, headers=headers) as http:
        made = http.post("/sandboxes", json={"templateID": "base", "secure": False, "timeout": 30})
        assert made.status_code == 201, made.text
        body = made.json()
        assert body["envdAccessToken"] is None and body["envdVersion"] == "0.6.4"
        sandbox_id = body["sandboxID"]
        connected = http.post(f"/sandboxes/{sandbox_id}/connect", json={"timeout": 30})
        assert connected.status_code == 200 and connected.json()["sandboxID"] == sandbox_id
        assert sandbox_id in [s["sandboxID"] for s in http.get("/sandboxes").json()]
        for method, path in (("GET", f"/sandboxes/{sandbox_id}/metrics"), ("GET", "/templates"), ("PUT", "/x")):
            answer = http.request(method, path)
            assert answer.status_code == 501, (method, path, answer.status_code)
            assert path in answer.json()["message"]
        assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 204
        assert http.delete(f"/sandboxes/{sandbox_id}").status_code == 404
        bad = http.post("/v2/sandboxes", json={"templateID": "nope"})
        assert bad.status_code == 400 and "templateID" in bad.json()["message"]
        assert http.post("/v2/sandboxes", headers={"X-API-KEY": "wrong"}, json={}).status_code == 401


def test_full_server_answers_429_with_retry_after(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(tmp_path / "ws", "--max-sandboxes", "2") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        first, second = Sandbox.create(), Sandbox.create()
        with httpx.Client(base_url=server.url, headers={"X-API-KEY": server.key}) as http:
            full = http.post("/v2/sandboxes", json={"templateID": "base"})
        assert full.status_code == 429 and full.headers["Retry-After"] == "1"
        with pytest.raises(RateLimitException):
            Sandbox.create()
        first.kill()
        third = Sandbox.create()
        assert {second.sandbox_id, third.sandbox_id} == {s.sandbox_id for s in Sandbox.list().next_items()}


def test_sandboxes_are_offline_unless_the_server_allows_the_network(e2b_server: Server) -> None:
    """A sandbox that asks for nothing is offline here (E2B's default is online: asking for it is refused, see
    test_network.py)."""
    port = e2b_server.url.rsplit(":", 1)[1]
    reach_the_server = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo reached"
    sbx = Sandbox.create()
    try:
        assert sbx.get_info().allow_internet_access is False
        with pytest.raises(CommandExitException) as refused:
            sbx.commands.run(reach_the_server)
        assert "reached" not in refused.value.stdout
        assert sbx.commands.run("echo local works").stdout == "local works\n"
    finally:
        sbx.kill()


def test_the_network_when_the_server_allows_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The network on is the egress proxy to every public destination (and pinned names), never this host: its
    loopback, the server's own port, is out of reach, directly or through the proxy."""
    address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randrange(2, 254, 2)}"
    upstream = http.server.ThreadingHTTPServer((address, 0), _Hello)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    pinned = f"pinned.test:{upstream.server_address[1]}"
    with running_server(tmp_path / "ws", "--allow-internet-access", "--resolve", f"pinned.test={address}") as server:
        for variable, value in server.sdk_env().items():
            monkeypatch.setenv(variable, value)
        port = server.url.rsplit(":", 1)[1]
        online = Sandbox.create(allow_internet_access=True)
        try:
            assert online.get_info().allow_internet_access is True
            assert online.commands.run(f"curl -sS --max-time 20 http://{pinned}/").stdout == "hello\n"
            with pytest.raises(CommandExitException):
                online.commands.run(f"exec 3<>/dev/tcp/127.0.0.1/{port}")  # its own loopback: nothing there
            for host in ("127.0.0.1", "localhost", address):  # the host, through the proxy: refused
                status = f"curl -s -o /dev/null -w '%{{http_code}}' --max-time 20 http://{host}:{port}/health"
                assert online.commands.run(status).stdout == "403", host
        finally:
            online.kill()
        offline = Sandbox.create()  # not asked for: offline
        with pytest.raises(CommandExitException):
            offline.commands.run(f"exec 3<>/dev/tcp/127.0.0.1/{port}")
    upstream.shutdown()
    upstream.server_close()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "6")
        self.end_headers()
        self.wfile.write(b"hello\n")

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_the_hosts_network_only_behind_its_dangerous_flag(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(InvalidSpec, match="needs allow_internet_access"):
        ServerOptions(api_keys=("k",), host_network=True)
    with running_server(tmp_path / "ws", "--allow-internet-access", "--allow-host-network") as server:
        for variable, value in server.sdk_env().items():
            monkeypatch.setenv(variable, value)
        port = server.url.rsplit(":", 1)[1]
        online = Sandbox.create(allow_internet_access=True)
        assert online.get_info().allow_internet_access is True
        assert online.commands.run(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo reached").stdout == "reached\n"


def test_each_sandbox_has_the_memory_the_server_gives_it(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--sandbox-memory-mb``: every process of a sandbox counts together (a cgroup of its session, as root); a
    command past it is killed, the sandbox goes on, its info reports the limit, and another sandbox is unaffected."""
    if os.geteuid() != 0:
        pytest.skip("a sandbox's processes are limited together by a cgroup, made as root")
    with running_server(tmp_path / "ws", "--sandbox-memory-mb", "128", "--sandbox-pids", "64") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        sbx, other = Sandbox.create(), Sandbox.create()
        try:
            assert sbx.get_info().memory_mb == 128
            hog = "python3 -c \"b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096]); print('allocated')\""
            with pytest.raises(CommandExitException) as killed:
                sbx.commands.run(hog)
            assert killed.value.error == "signal: killed" and "allocated" not in killed.value.stdout  # as envd says it
            assert sbx.commands.run("echo alive").stdout == "alive\n"
            small = hog.replace("300", "50")
            assert other.commands.run(small).stdout == "allocated\n"
        finally:
            sbx.kill()
            other.kill()


def test_limits_per_sandbox_need_session_mode(tmp_path) -> None:
    argv = [sys.executable, "-m", "execspace", "serve", "--port", "0", "--api-key", "k" * 32]
    argv += ["--workspace-root", str(tmp_path), "--sandbox-mode", "per-run", "--sandbox-memory-mb", "128"]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=60, env={**os.environ, "EXECSPACE_DAEMON": "off"}
    )
    assert done.returncode == 125 and "session mode" in done.stderr, (done.returncode, done.stderr)
