"""Attacks of one tenant of ``execspace serve`` on another and on the server, judged by what the host and the
server's other clients see: which requests are answered, whether a paused sandbox stays paused, whether a kernel
was started, which team finds which sandbox.

Each test drives a real ``execspace serve`` subprocess (private: 127.0.0.1, a free port) with raw HTTP where the
attacker would, and with the official SDK where the victim's code must go on working.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("httpx", reason="needs the agent extra (pip install 'execspace[agent]')")
pytest.importorskip(
    "e2b", reason="the server is attacked with the official e2b SDK beside (pip install 'execspace[dev]')"
)

import httpx
from e2b import Sandbox
from e2b.exceptions import NotFoundException, RateLimitException

from tests.server.conftest import API_KEY, Server, running_server
from tests.support import until

pytestmark = pytest.mark.timeout(180)

OTHER_KEY = "e2b_" + "fedcba9876543210" * 2
ADMIN_KEY = "e2b_" + "00112233445566778899aabbccddeeff"[:32]
INTERPRETER = "49999"
ENVD = "49983"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("round3-serve")
    flags = ("--api-key", OTHER_KEY, "--admin-api-key", ADMIN_KEY, "--pool-size", "0")
    with running_server(root, *flags) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _create(client: httpx.Client, key: str = API_KEY, **body: Any) -> dict[str, Any]:
    answer = client.post(
        "/v2/sandboxes", json={"templateID": "base", "timeout": 120, **body}, headers={"X-API-KEY": key}
    )
    assert answer.status_code == 201, answer.text
    created: dict[str, Any] = answer.json()
    return created


def _kill(client: httpx.Client, sandbox_id: str, key: str = API_KEY) -> None:
    client.delete(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": key})


def _to(sandbox: dict[str, Any], port: str, **headers: str) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sandbox["sandboxID"], "E2b-Sandbox-Port": port, **headers}


def _state(client: httpx.Client, sandbox_id: str) -> str:
    answer = client.get(f"/sandboxes/{sandbox_id}", headers={"X-API-KEY": API_KEY})
    state: str = answer.json()["state"]
    return state


@pytest.fixture
def sandbox(client: httpx.Client) -> Iterator[dict[str, Any]]:
    created = _create(client)
    try:
        yield created
    finally:
        _kill(client, created["sandboxID"])


# 1. the code interpreter's routes need the sandbox's token


def test_the_interpreter_routes_refuse_a_caller_without_the_token(
    client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    anonymous = _to(sandbox, INTERPRETER)
    assert client.get("/contexts", headers=anonymous).status_code == 401
    assert client.post("/contexts", json={"language": "python"}, headers=anonymous).status_code == 401
    assert client.post("/contexts/x/restart", headers=anonymous).status_code == 401
    assert client.delete("/contexts/x", headers=anonymous).status_code == 401
    wrong = _to(sandbox, INTERPRETER, **{"E2B-Traffic-Access-Token": sandbox["envdAccessToken"] + "x"})
    assert client.get("/contexts", headers=wrong).status_code == 401
    # the envd token does not open the interpreter through the traffic header, nor the traffic token envd
    swapped = _to(sandbox, ENVD, **{"X-Access-Token": sandbox["trafficAccessToken"]})
    assert (
        client.post("/filesystem.Filesystem/ListDir", json={"path": "/home/user"}, headers=swapped).status_code == 401
    )
    # nothing was started by the refused create: the owner lists only what it made itself
    owner = _to(sandbox, INTERPRETER, **{"E2B-Traffic-Access-Token": sandbox["trafficAccessToken"]})
    listed = client.get("/contexts", headers=owner).json()
    assert [c["language"] for c in listed] in (["python"], ["python", "javascript"]), listed  # the defaults only
    defaults = [c["id"] for c in listed]
    made = client.post("/contexts", json={"language": "python"}, headers=owner)
    assert made.status_code == 200, made.text
    assert [c["id"] for c in client.get("/contexts", headers=owner).json()] == [*defaults, made.json()["id"]]
    by_access_token = _to(sandbox, INTERPRETER, **{"X-Access-Token": sandbox["envdAccessToken"]})
    assert client.delete(f"/contexts/{made.json()['id']}", headers=by_access_token).status_code == 204


def test_the_sdk_sends_the_token_it_is_given(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    ci = pytest.importorskip("e2b_code_interpreter")
    for name, value in server.sdk_env().items():
        monkeypatch.setenv(name, value)
    with ci.Sandbox.create(timeout=120) as sbx:
        context = sbx.create_code_context(language="python")
        assert context.id in [c.id for c in sbx.list_code_contexts()]
        sbx.remove_code_context(context)


def test_an_anonymous_request_never_resumes_a_paused_sandbox(client: httpx.Client) -> None:
    created = _create(client, autoPause=True, autoResume={"enabled": True})
    try:
        paused = client.post(f"/sandboxes/{created['sandboxID']}/pause", headers={"X-API-KEY": API_KEY})
        assert paused.status_code == 204, paused.text
        for port, path in ((INTERPRETER, "/contexts"), (INTERPRETER, "/health"), (ENVD, "/health"), (ENVD, "/files")):
            answer = client.get(path, params={"path": "a"}, headers=_to(created, port))
            assert answer.status_code in (401, 502), (port, path, answer.status_code)
            assert _state(client, created["sandboxID"]) == "paused", f"{port}{path} resumed it"
        # its owner's traffic does (autoResume)
        owner = _to(created, INTERPRETER, **{"E2B-Traffic-Access-Token": created["trafficAccessToken"]})
        assert client.get("/contexts", headers=owner).status_code == 200
        assert _state(client, created["sandboxID"]) == "running"
    finally:
        _kill(client, created["sandboxID"])


def _head_answer(server: Server, head: bytes, within: float = 5.0) -> bytes:
    """The first line of what the server answers a request head whose body never comes."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=within) as sock:
        sock.sendall(head)
        started = time.monotonic()
        answer = sock.recv(4096)
        assert time.monotonic() - started < within
    return answer.split(b"\r\n", 1)[0]


@pytest.mark.parametrize(("port", "path"), [(INTERPRETER, "/execute"), (INTERPRETER, "/contexts"), (ENVD, "/files")])
def test_a_request_without_the_token_is_answered_before_its_body(
    server: Server, sandbox: dict[str, Any], port: str, path: str
) -> None:
    head = (
        f"POST {path}?path=x HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: {sandbox['sandboxID']}\r\n"
        f"E2b-Sandbox-Port: {port}\r\nContent-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
    ).encode()
    assert _head_answer(server, head) == b"HTTP/1.1 401 Unauthorized"


# 2. bodies are read with a bound


def test_an_oversized_interpreter_body_is_refused_without_holding_it(
    server: Server, client: httpx.Client, sandbox: dict[str, Any]
) -> None:
    owner = _to(sandbox, INTERPRETER, **{"X-Access-Token": sandbox["envdAccessToken"]})
    head = "".join(f"{k}: {v}\r\n" for k, v in owner.items())
    declared = f"POST /execute HTTP/1.1\r\nHost: x\r\n{head}Content-Length: 1000000000\r\n\r\n".encode()
    assert _head_answer(server, declared) == b"HTTP/1.1 413 Request Entity Too Large"

    def chunks() -> Iterator[bytes]:  # no length given: the server counts as it reads
        for _ in range(40):
            yield b" " * (1024 * 1024)

    answer = client.post("/execute", content=chunks(), headers=owner)
    assert answer.status_code == 413
    assert client.post("/v2/sandboxes", content=chunks(), headers={"X-API-KEY": API_KEY}).status_code == 413


# also found: a key acts on its own sandboxes only


def test_another_key_finds_none_of_a_teams_sandboxes(server: Server, client: httpx.Client) -> None:
    mine = _create(client)
    theirs = {"X-API-KEY": OTHER_KEY}
    sandbox_id = mine["sandboxID"]
    try:
        assert client.get(f"/sandboxes/{sandbox_id}", headers=theirs).status_code == 404
        for verb, path in (
            ("DELETE", ""),
            ("POST", "/timeout"),
            ("POST", "/connect"),
            ("POST", "/pause"),
            ("POST", "/fork"),
            ("POST", "/snapshots"),
            ("PUT", "/network"),
        ):
            answer = client.request(verb, f"/sandboxes/{sandbox_id}{path}", json={"timeout": 60}, headers=theirs)
            assert answer.status_code == 404, (verb, path, answer.status_code)
        for route in ("/sandboxes", "/v2/sandboxes"):
            assert sandbox_id not in [s["sandboxID"] for s in client.get(route, headers=theirs).json()]
        assert _state(client, sandbox_id) == "running"  # none of that reached it
        # the admin key sees and reaches it
        admin = {"X-API-KEY": ADMIN_KEY}
        assert sandbox_id in [s["sandboxID"] for s in client.get("/v2/sandboxes", headers=admin).json()]
        assert client.get(f"/sandboxes/{sandbox_id}", headers=admin).status_code == 200
    finally:
        _kill(client, sandbox_id)


def test_a_teams_snapshots_are_its_own(server: Server, client: httpx.Client) -> None:
    mine = _create(client)
    theirs = {"X-API-KEY": OTHER_KEY}
    try:
        taken = client.post(
            f"/sandboxes/{mine['sandboxID']}/snapshots", json={"name": "ours"}, headers={"X-API-KEY": API_KEY}
        )
        assert taken.status_code == 201, taken.text
        snap = taken.json()
        assert snap["names"] == ["ours"]
        assert client.get("/snapshots", headers=theirs).json() == []
        for key in (snap["snapshotID"], "ours"):
            refused = client.post("/v2/sandboxes", json={"templateID": key}, headers=theirs)
            assert refused.status_code == 400, refused.text
            assert client.delete(f"/templates/{key}", headers=theirs).status_code == 404
        # the other team may use the same name for its own
        other = _create(client, OTHER_KEY)
        again = client.post(f"/sandboxes/{other['sandboxID']}/snapshots", json={"name": "ours"}, headers=theirs)
        assert again.status_code == 201, again.text
        assert [s["snapshotID"] for s in client.get("/snapshots", headers=theirs).json()] == [
            again.json()["snapshotID"]
        ]
        from_mine = _create(client, templateID="ours")
        _kill(client, from_mine["sandboxID"])
        _kill(client, other["sandboxID"], OTHER_KEY)
        for key, snapshot_id in ((API_KEY, snap["snapshotID"]), (OTHER_KEY, again.json()["snapshotID"])):
            assert client.delete(f"/templates/{snapshot_id}", headers={"X-API-KEY": key}).status_code == 204
    finally:
        _kill(client, mine["sandboxID"])


def test_the_sdk_of_another_key_gets_not_found(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in server.sdk_env().items():
        monkeypatch.setenv(name, value)
    with Sandbox.create(timeout=120) as mine:
        with pytest.raises(NotFoundException):
            Sandbox.get_info(mine.sandbox_id, api_key=OTHER_KEY)
        with pytest.raises(NotFoundException):
            Sandbox.connect(mine.sandbox_id, api_key=OTHER_KEY)
        assert Sandbox.kill(mine.sandbox_id, api_key=OTHER_KEY) is False
        assert mine.is_running()
        until("the owner still reaches it", lambda: mine.commands.run("true").exit_code == 0)


# 4. connections are capped, and one that never completes a request head is closed


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _address(server: Server) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def _closed_by_peer(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except (BlockingIOError, TimeoutError):
        return False


def test_slowloris_is_capped_and_timed_out(tmp_path: Path) -> None:
    flags = ("--max-connections", "20", "--head-timeout", "1", "--pool-size", "0")
    with running_server(tmp_path / "ws", *flags) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        pid = server.process.pid
        assert client.get("/health").status_code == 200
        # the server took every descriptor it may have: its soft limit is its hard one
        limits = next(line for line in Path(f"/proc/{pid}/limits").read_text().splitlines() if "open files" in line)
        soft, hard = limits.split()[3:5]
        assert soft == hard, limits
        client.close()  # its connection is gone before the flood: the cap counts only the attacker's
        baseline = _open_fds(pid)
        slow: list[socket.socket] = []
        try:
            for _ in range(60):  # bounded: three times the cap
                sock = socket.create_connection(_address(server), timeout=5)
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the rest of the head
                slow.append(sock)
            # the server holds at most its cap of them: the others were closed as they came
            until("the refused connections closed", lambda: sum(map(_closed_by_peer_now, slow)) >= 40, within=10)
            assert _open_fds(pid) <= baseline + 20 + 2
            # the held ones are closed once their head is late, and the server answers again
            until("the slow heads timed out", lambda: all(map(_closed_by_peer_now, slow)), within=10)
        finally:
            for sock in slow:
                sock.close()
        with httpx.Client(base_url=server.url, timeout=30) as fresh:
            assert fresh.get("/health").status_code == 200


def _closed_by_peer_now(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return _closed_by_peer(sock)
    finally:
        sock.setblocking(True)


def test_a_slow_head_after_a_response_is_timed_out_too(tmp_path: Path) -> None:
    """The keep-alive timer of the server library stops at the first byte of the next head: ours starts there."""
    server_flags = ("--head-timeout", "1", "--pool-size", "0")
    with running_server(tmp_path / "ws", *server_flags) as server, socket.create_connection(_address(server)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")  # a head begun and never finished
        started = time.monotonic()
        for _ in range(8):  # a byte now and then restarts nothing
            time.sleep(0.2)
            with contextlib.suppress(OSError):
                sock.sendall(b"X")
        sock.settimeout(20)
        assert sock.recv(4096) == b""
        assert time.monotonic() - started < 10


# 3. each sandbox has a bounded share of the server


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with small shares per sandbox, so that a test reaches them in a few requests."""
    root = tmp_path_factory.mktemp("round3-shares")
    flags = ("--pool-size", "0", "--sandbox-max-commands", "8", "--sandbox-max-streams", "6")
    with running_server(root, *flags, "--sandbox-max-watchers", "3") as server:
        yield server


@pytest.fixture
def sdk(tight: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    for name, value in tight.sdk_env().items():
        monkeypatch.setenv(name, value)
    return tight


def test_a_sandboxs_live_commands_and_streams_are_capped(sdk: Server) -> None:
    with Sandbox.create(timeout=120) as hog, Sandbox.create(timeout=120) as other:
        streaming = [hog.commands.run("sleep 600", background=True) for _ in range(6)]  # its streams, all
        with pytest.raises(RateLimitException):
            hog.commands.run("sleep 600", background=True)
        assert other.commands.run("echo fine").stdout == "fine\n"  # another sandbox is not held back
        for handle in streaming:
            handle.disconnect()  # the commands go on without a stream...
        until("the streams closed", lambda: _starts(hog))
        detached = [hog.commands.run("sleep 600", background=True) for _ in range(2)]
        for handle in detached:
            handle.disconnect()
        with pytest.raises(RateLimitException):  # ...and count as live commands: 8, its most
            hog.commands.run("sleep 600", background=True)
        assert len(hog.commands.list()) == 8
        hog.commands.kill(streaming[0].pid)
        until("a killed command gave its place back", lambda: _starts(hog))
        assert other.commands.run("echo still").stdout == "still\n"


def _starts(sbx: Sandbox) -> bool:
    try:
        handle = sbx.commands.run("true", background=True)
    except RateLimitException:
        return False
    handle.wait()
    return True


def test_watchers_and_watch_streams_share_one_cap(sdk: Server) -> None:
    with Sandbox.create(timeout=120) as hog:
        hog.files.make_dir("/home/user/w")
        polled = [hog.files.watch_dir("/home/user/w") for _ in range(3)]
        with pytest.raises(RateLimitException):
            hog.files.watch_dir("/home/user/w")
        polled[0].stop()
        again = hog.files.watch_dir("/home/user/w")
        hog.files.write("/home/user/w/a.txt", "x")
        until("the watcher saw the write", lambda: any(e.name == "a.txt" for e in again.get_new_events()))


async def test_a_stream_watch_counts_too(sdk: Server) -> None:
    from e2b import AsyncSandbox
    from e2b.exceptions import SandboxException

    hog = await AsyncSandbox.create(timeout=120)
    try:
        await hog.files.make_dir("/home/user/w")
        handles = [await hog.files.watch_dir("/home/user/w", on_event=lambda e: None) for _ in range(3)]
        with pytest.raises(SandboxException):  # the stream's error: too many watchers
            await hog.files.watch_dir("/home/user/w", on_event=lambda e: None)
        for handle in handles:
            await handle.stop()
    finally:
        await hog.kill()


def test_a_bottomless_list_depth_is_clamped(sdk: Server) -> None:
    with Sandbox.create(timeout=120) as sbx:
        sbx.commands.run("mkdir -p /home/user/d/$(printf 'x/%.0s' $(seq 80))")
        entries = sbx.files.list("/home/user/d", depth=2**32 - 1)
        deepest = max(e.path.count("/") for e in entries)
        assert deepest == "/home/user/d".count("/") + 64  # MAX_LIST_DEPTH levels, not 80, not an error


@pytest.fixture(scope="module")
def paced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server with slow paces per sandbox, so that a test outruns them in a few seconds."""
    flags = ("--pool-size", "0", "--sandbox-request-rate", "20", "--sandbox-output-rate", "4")
    with running_server(tmp_path_factory.mktemp("round3-paced"), *flags) as server:
        yield server


def test_a_program_printing_without_end_is_held_back_and_loses_nothing(
    paced: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in paced.sdk_env().items():
        monkeypatch.setenv(name, value)
    with Sandbox.create(timeout=120) as loud:
        started = time.monotonic()
        result = loud.commands.run(
            "yes 0123456789abcdef | head -c 16777216 | wc -c; yes x | head -c 12582912", timeout=60
        )
        took = time.monotonic() - started
        assert result.stdout.startswith("16777216\n") and len(result.stdout) == len("16777216\n") + 12 * 2**20
        # 12 MiB read at 4 MiB/s after a burst of 4: the host cannot have read it in under 2 s
        assert took >= 2.0, f"12 MiB of output came through in {took:.2f}s: the output pace did not hold"


async def test_a_sandboxs_requests_wait_their_turn_and_a_flood_past_its_queue_is_refused(paced: Server) -> None:
    async with httpx.AsyncClient(base_url=paced.url, timeout=60, limits=httpx.Limits(max_connections=400)) as client:
        made = [
            (await client.post("/v2/sandboxes", json={"templateID": "base"}, headers={"X-API-KEY": API_KEY})).json()
            for _ in range(2)
        ]
        hog, other = (_to(s, ENVD, **{"X-Access-Token": s["envdAccessToken"]}) for s in made)
        stat = {"path": "/home/user"}
        rpc = {"Content-Type": "application/json", "Connect-Protocol-Version": "1"}
        try:
            started = time.monotonic()
            answers = await asyncio.gather(
                *(client.post("/filesystem.Filesystem/Stat", json=stat, headers={**hog, **rpc}) for _ in range(300))
            )
            codes = [a.status_code for a in answers]
            assert codes.count(429) >= 300 - 20 - 256  # its burst, then its queue: the rest is refused at once
            assert codes.count(200) == 300 - codes.count(429)
            assert time.monotonic() - started >= 1.0  # the queued ones waited their turn (at 20 a second)
            # the other sandbox's pace is its own
            again = await client.post("/filesystem.Filesystem/Stat", json=stat, headers={**other, **rpc})
            assert again.status_code == 200
        finally:
            for s in made:
                await client.delete(f"/sandboxes/{s['sandboxID']}", headers={"X-API-KEY": API_KEY})
