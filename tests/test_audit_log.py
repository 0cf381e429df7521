"""The library's audit log (``open_engine(..., audit=AuditLog(FILE))``, docs/operations.md "Audit log"): each
workspace created and cleaned up, program run or started, file written, renamed and removed has its line by the
time the call returns, on the local backend and the sandbox's both modes; never a file's content or a variable's
value; and the file itself: 0600, whole lines, reopened after a rotation. The other backends' lines:
tests/backends/test_backend_audit.py."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from execspace import PutFile, RunProgramSpec, SetupFailed, open_engine
from execspace.audit import AuditLog
from execspace.testing.binding import make_traversable
from tests.support import audit_entries, audit_lines

pytestmark = pytest.mark.timeout(120)


async def chunks(*pieces: bytes) -> AsyncIterator[bytes]:
    for piece in pieces:
        yield piece


BACKENDS = [
    pytest.param(("local", {}), id="local"),
    pytest.param(("sandbox", {"mode": "per-run"}), id="sandbox-per-run"),
    pytest.param(("sandbox", {"mode": "session"}), id="sandbox-session"),
]


@pytest.mark.parametrize("backend", BACKENDS)
async def test_each_action_has_its_line_when_the_call_returns(
    tmp_path: Path, backend: tuple[str, dict[str, Any]]
) -> None:
    name, extra = backend
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog(audit_path)
    make_traversable(tmp_path)  # as root, each sandbox's own uid must reach its workspace
    try:
        async with open_engine(name, workspace_root=tmp_path / "ws", audit=audit, **extra) as engine:  # type: ignore[call-overload]
            ws = await engine.manager.create_workspace("audited")
            assert audit_entries(audit_path, "workspace.create", workspace=ws.id)
            await engine.fs.put_files(ws, [PutFile("work/a.txt", "content-of-a-4471")])
            assert audit_entries(audit_path, "file.write", workspace=ws.id, path="work/a.txt", size=17)
            await engine.fs.write_stream(ws, "work/b.bin", chunks(b"x" * 10, b"y" * 5), max_bytes=100)
            assert audit_entries(audit_path, "file.write", workspace=ws.id, path="work/b.bin", size=15)
            await engine.fs.rename(ws, "work/b.bin", "work/c.bin")
            assert audit_entries(audit_path, "file.rename", workspace=ws.id, path="work/b.bin", to="work/c.bin")
            await engine.fs.remove(ws, "work/c.bin")
            assert audit_entries(audit_path, "file.remove", workspace=ws.id, path="work/c.bin")

            spec = RunProgramSpec("sh", ["-c", "exit 5"], env={"SECRET_NAME": "value-3390"})
            result = await engine.runner.run_program(ws, spec)
            assert result.exit_code == 5
            (start,) = audit_entries(audit_path, "command.start", workspace=ws.id, argv=["sh", "-c", "exit 5"])
            assert start["env_names"] == ["SECRET_NAME"]
            (end,) = audit_entries(audit_path, "command.end", workspace=ws.id, argv=["sh", "-c", "exit 5"])
            assert end["exit_code"] == 5 and isinstance(end["pid"], int)

            handle = await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", "exit 6"]))
            assert (await handle.wait()).exit_code == 6
            assert audit_entries(audit_path, "command.end", workspace=ws.id, exit_code=6, pid=handle.pid)

            missing = await engine.runner.run_program(ws, RunProgramSpec("no-such-program-8810"))
            assert missing.exit_code == 127
            assert audit_entries(
                audit_path, "command.end", workspace=ws.id, argv=["no-such-program-8810"], exit_code=127, pid=None
            )

            await engine.manager.cleanup(ws)
            assert audit_entries(audit_path, "workspace.cleanup", workspace=ws.id)
    finally:
        audit.close()
    text = audit_path.read_text()
    assert "content-of-a-4471" not in text and "value-3390" not in text


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_cancelled_run_still_has_its_end_line(tmp_path: Path, backend: tuple[str, dict[str, Any]]) -> None:
    name, extra = backend
    audit_path = tmp_path / "audit.jsonl"
    audit = AuditLog(audit_path)
    make_traversable(tmp_path)
    argv = ["sh", "-c", "touch up; exec sleep 60"]
    try:
        async with open_engine(name, workspace_root=tmp_path / "ws", audit=audit, **extra) as engine:  # type: ignore[call-overload]
            ws = await engine.manager.create_workspace("cancelled")
            assert ws.host_path is not None
            run = asyncio.create_task(engine.runner.run_program(ws, RunProgramSpec(argv[0], argv[1:])))
            for _ in range(600):  # until it runs (its start line is written by then)
                if (ws.host_path / "work" / "up").exists():
                    break
                await asyncio.sleep(0.05)
            assert audit_entries(audit_path, "command.start", workspace=ws.id, argv=argv)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            (end,) = audit_entries(audit_path, "command.end", workspace=ws.id, argv=argv)
            assert end["exit_code"] is None and end["error"] == "CancelledError"
    finally:
        audit.close()


def test_the_file_is_0600_its_lines_whole_and_a_rotation_reopened(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    try:
        assert path.stat().st_mode & 0o777 == 0o600

        def burst(n: int) -> None:
            for i in range(300):
                audit.record("file.write", {"workspace": f"w{n}", "path": "p" * (i % 97), "size": i})

        threads = [threading.Thread(target=burst, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(audit_lines(path)) == 1200
        path.rename(tmp_path / "audit.jsonl.1")
        audit.reopen()
        audit.record("workspace.create", {"workspace": "after"})
        assert [line["workspace"] for line in audit_lines(path)] == ["after"]
    finally:
        audit.close()


def test_a_log_that_cannot_be_opened_says_where_and_how(tmp_path: Path) -> None:
    with pytest.raises(SetupFailed, match=r"cannot open the audit log .*missing/audit.jsonl.*--audit-log"):
        AuditLog(tmp_path / "missing" / "audit.jsonl")
    assert not os.path.exists(tmp_path / "missing")
