"""Attacks on the egress channel of allow-list runs, from inside real sandboxes (both modes): the channel reaches
only the proxy, the proxy reaches only what the policy allows, a flood of connections is bounded per run, and one
run's proxy serves no other workspace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.models import NetworkPolicy, RunResult
from execspace.process.egress import MAX_CONNECTIONS
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(120)

Box = tuple[execspace.BaseEngine, execspace.Workspace]


@pytest.fixture
async def upstream() -> AsyncIterator[int]:
    """A loopback server on the host that answers anything with ``upstream``: reaching it is the proof."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(65536)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nupstream")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


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


def policy(port: int, name: str = "allowed.test") -> NetworkPolicy:
    return NetworkPolicy.allow([f"{name}:{port}"], resolve={name: "127.0.0.1"})


async def py(engine: execspace.BaseEngine, ws: execspace.Workspace, code: str, net: object) -> RunResult:
    spec = RunProgramSpec("python3", ["-c", code], network=net, timeout=60)  # type: ignore[arg-type]
    return await engine.runner.run_program(ws, spec)


#: Asks the proxy at 127.0.0.1:3128 for raw requests; prints one line per request: its label and the reply.
ASK = """
import socket, sys
def ask(label, data):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    reply = b""
    try:
        s.sendall(data)
        while chunk := s.recv(65536):
            reply += chunk
    except ConnectionResetError:
        reply += b"(reset)"
    print(label, repr(reply[:60]), flush=True)
"""


async def test_the_channel_reaches_only_the_proxy_and_the_proxy_only_the_policy(
    engine: execspace.BaseEngine, upstream: int
) -> None:
    ws = await engine.manager.create_workspace("red/egress/channel")
    code = (
        ASK
        + f"""
import os
links = []
for fd in os.listdir("/proc/self/fd"):
    try:
        links.append(os.readlink(f"/proc/self/fd/{{fd}}"))
    except FileNotFoundError:  # listdir's own fd
        pass
print("sockets", sum(link.startswith("socket:") for link in links))
ask("metadata", b"GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\\r\\nHost: 169.254.169.254\\r\\n\\r\\n")
ask("loopback", b"CONNECT 127.0.0.1:{upstream} HTTP/1.1\\r\\nHost: 127.0.0.1:{upstream}\\r\\n\\r\\n")
ask("mapped", b"CONNECT [::ffff:127.0.0.1]:{upstream} HTTP/1.0\\r\\n\\r\\n")
ask("userinfo", b"GET http://allowed.test:{upstream}@127.0.0.2:{upstream}/ HTTP/1.1\\r\\nHost: 127.0.0.2\\r\\n\\r\\n")
ask("bind", b"\\x05\\x01\\x00\\x05\\x02\\x00\\x01\\x7f\\x00\\x00\\x01" + ({upstream}).to_bytes(2, "big"))
ask("huge", b"GET http://allowed.test:{upstream}/ HTTP/1.1\\r\\nX: " + b"a" * 200000 + b"\\r\\n\\r\\n")
ask("allowed", b"GET http://allowed.test:{upstream}/ HTTP/1.1\\r\\nHost: allowed.test:{upstream}\\r\\n\\r\\n")
"""
    )
    r = await py(engine, ws, code, policy(upstream))
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert r.exit_code == 0, r.stderr
    assert got["sockets"] == "0", got  # the channel was closed before the program started
    for label in ("metadata", "loopback", "mapped"):
        assert "403 Forbidden" in got[label] and "upstream" not in got[label], (label, got)
    assert "400 Bad Request" in got["userinfo"], got  # a URI with user information is not a proxy request
    assert got["bind"].startswith("b'\\x05\\x00\\x05\\x07"), got  # no SOCKS BIND: command not supported
    # refused (400) or cut while it still sends (reset): nothing forwarded either way
    assert "400 Bad Request" in got["huge"] or got["huge"] in ("b''", "b'(reset)'"), got
    assert "upstream" in got["allowed"], got
    refused = [a for a in r.network_audit if not a.allowed]
    assert {a.host for a in refused} >= {"169.254.169.254", "127.0.0.1", "::ffff:127.0.0.1"}
    assert any("user information" in a.reason for a in refused)
    assert [a.host for a in r.network_audit if a.allowed] == ["allowed.test"]


async def test_a_connection_flood_is_bounded_per_run(engine: execspace.BaseEngine, upstream: int) -> None:
    ws = await engine.manager.create_workspace("red/egress/flood")
    flood = MAX_CONNECTIONS + 40
    code = f"""
import select, socket, time
held = [socket.create_connection(("127.0.0.1", 3128), timeout=10) for _ in range({flood})]
open_ = set(held)
deadline = time.monotonic() + 20
while len(open_) > {MAX_CONNECTIONS} and time.monotonic() < deadline:
    ready, _, _ = select.select(list(open_), [], [], 1)
    for s in ready:
        if s.recv(1) == b"":
            open_.discard(s)
print("cut", {flood} - len(open_))
for s in held:
    s.close()
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"GET http://allowed.test:{upstream}/ HTTP/1.1\\r\\nHost: allowed.test:{upstream}\\r\\n\\r\\n")
print("after", s.recv(65536).endswith(b"upstream"))
"""
    r = await py(engine, ws, code, policy(upstream))
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == ["cut 40", "after True"]
    refused = [a for a in r.network_audit if "too many connections" in a.reason]
    assert len(refused) == 40 and not any(a.allowed for a in refused)


async def test_one_runs_proxy_serves_no_other_workspace(engine: execspace.BaseEngine, upstream: int) -> None:
    first = await engine.manager.create_workspace("red/egress/first")
    second = await engine.manager.create_workspace("red/egress/second")
    # the first workspace's run keeps its proxy up (it allows allowed.test) until its stdin closes
    holder = RunProgramSpec("python3", ["-c", "import sys; print('up', flush=True); sys.stdin.read()"])
    held = await engine.runner.start_program(first, _with(holder, policy(upstream)))
    try:
        await _first_line(held)
        request = f"GET http://allowed.test:{upstream}/ HTTP/1.1\\r\\nHost: allowed.test:{upstream}\\r\\n\\r\\n"
        reach = ASK + f'ask("x", b"{request}")'
        off = await py(engine, second, f"{reach}\n", "off")
        assert "ConnectionRefusedError" in off.stderr and off.network_audit == ()
        own = await py(engine, second, reach, policy(upstream, "other.test"))
        assert "403 Forbidden" in own.stdout and [a.allowed for a in own.network_audit] == [False]
        assert own.network_audit[0].run_id == Path(own.run_dir).name
    finally:
        await held.close_stdin()
        done = await held.wait()
    assert done.exit_code == 0 and done.network_audit == ()
    assert first.host_path is not None
    assert (first.host_path / done.run_dir / "network.jsonl").read_bytes() == b""


def _with(spec: RunProgramSpec, net: NetworkPolicy) -> RunProgramSpec:
    return RunProgramSpec(spec.cmd, spec.args, network=net, timeout=60)


async def _first_line(proc: Any) -> None:
    async for chunk in proc.stream():
        if b"up" in chunk.data:
            return
    raise AssertionError("the holder exited before it was up")
