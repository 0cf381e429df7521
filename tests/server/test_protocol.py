"""Wire details the SDK does not exercise by itself: the binary Connect codec, host-based routing, and the code
interpreter's port answering 501 at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox
from e2b.envd.filesystem import filesystem_pb
from e2b.envd.filesystem.filesystem_connect import FilesystemClientSync
from e2b.envd.process import process_pb
from e2b.envd.process.process_connect import ProcessClientSync

from .conftest import Server, running_server


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


def _headers(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": sbx._envd_access_token}


def test_binary_codec_unary_and_stream(sbx: Sandbox, e2b_server: Server) -> None:
    """connectrpc's own client speaks the binary (proto) codec by default, unlike the SDK's JSON."""
    sbx.files.write("bin.txt", "x")
    files = FilesystemClientSync(e2b_server.url)
    entry = files.stat(filesystem_pb.StatRequest(path="/home/user/bin.txt"), headers=_headers(sbx)).entry
    assert entry is not None and (entry.name, entry.size) == ("bin.txt", 1)
    processes = ProcessClientSync(e2b_server.url)
    config = process_pb.ProcessConfig(cmd="/bin/bash", args=["-c", "printf hi; exit 5"])
    events = [r.event.event for r in processes.start(process_pb.StartRequest(process=config), headers=_headers(sbx))]
    assert events[0].field == "start"
    assert b"".join(e.value.output.value for e in events if e.field == "data") == b"hi"
    assert events[-1].field == "end" and events[-1].value.exit_code == 5


def test_keepalives_on_a_quiet_stream(sbx: Sandbox, e2b_server: Server) -> None:
    processes = ProcessClientSync(e2b_server.url)
    config = process_pb.ProcessConfig(cmd="/bin/bash", args=["-c", "sleep 3.5; echo late"])
    headers = {**_headers(sbx), "Keepalive-Ping-Interval": "1"}
    kinds = [r.event.event.field for r in processes.start(process_pb.StartRequest(process=config), headers=headers)]
    assert kinds[0] == "start" and kinds[-1] == "end"
    assert kinds.count("keepalive") >= 2
    assert "data" in kinds


def test_host_based_routing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(tmp_path / "ws", "--domain", "sbx.example") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        sandbox = Sandbox.create()
        sandbox.files.write("routed.txt", "by host")
        host = {"Host": f"49983-{sandbox.sandbox_id}.sbx.example", "X-Access-Token": sandbox._envd_access_token}
        read = httpx.get(f"{server.url}/files", params={"path": "routed.txt"}, headers=host)
        assert read.status_code == 200 and read.content == b"by host"
        gone = httpx.get(f"{server.url}/health", headers={"Host": "49983-nosuch.sbx.example"})
        assert gone.status_code == 502
        control = httpx.get(f"{server.url}/v2/sandboxes", headers={"X-API-KEY": server.key, "Host": "api.sbx.example"})
        assert control.status_code == 200
