"""``execspace serve -v``: a line per request (method, path, sandbox, status, duration) on stderr; quiet without."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from execspace.testing.processes import terminate

from .conftest import running_server

_LINE = rb"execspace serve: (\S+) (\S+) sandbox=(\S+) (\d{3}|dropped) (\d+\.\d)ms"


def test_verbose_logs_a_line_per_request_with_its_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_server(tmp_path / "ws", "-v", "--pool-size", "0") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        sbx = Sandbox.create(timeout=60)
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        sbx.kill()
        # a client's control characters reach the log escaped: no forged line
        httpx.get(f"{server.url}/sandboxes/x%0aexecspace serve: GET /forged", headers={"X-API-KEY": server.key})
        terminate(server.process, grace=20)  # every line is written by now: read them all, up to its end
        assert server.process.stdout is not None
        seen = server.process.stdout.read()
    assert b"GET /sandboxes/x\\x0aexecspace" in seen, seen.decode(errors="replace")
    lines = [m.groups() for m in re.finditer(_LINE, seen)]
    sid = sbx.sandbox_id.encode()
    create = next(line for line in lines if line[:2] in ((b"POST", b"/sandboxes"), (b"POST", b"/v2/sandboxes")))
    assert create[2:4] == (sid, b"201"), create  # the new sandbox's id, read from the answer
    assert any(line[:4] == (b"POST", b"/process.Process/Start", sid, b"200") for line in lines), lines
    assert (b"DELETE", f"/sandboxes/{sbx.sandbox_id}".encode(), sid, b"204") in [line[:4] for line in lines], lines
    assert not re.search(rb"^execspace serve: GET /forged", seen, re.M)


def test_quiet_by_default(tmp_path: Path) -> None:
    with running_server(tmp_path / "ws", "--pool-size", "0") as server:
        httpx.get(f"{server.url}/sandboxes", headers={"X-API-KEY": server.key}).raise_for_status()
        terminate(server.process, grace=20)  # all it printed is there to read, up to its end
        assert server.process.stdout is not None
        rest = server.process.stdout.read()
    assert b"GET /sandboxes" not in rest and b"sandbox=" not in rest, rest
