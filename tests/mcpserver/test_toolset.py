"""The server's tool set in process, on a real engine: uploads from allowed roots only, skills, artifacts, caps,
and idle workspaces reaped."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace.artifacts import ArtifactScope, InMemoryArtifactService
from execspace.mcp import Caller, McpConfig, McpTools, Workspaces
from execspace.testing.processes import new_tag, tagged, wait_processes

pytest.importorskip("mcp")


class Session:
    """Stands for one MCP session (the server keys a default workspace by it, weakly)."""


SESSION = Session()
CALLER = Caller(revision="2025-11-25", session=SESSION)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def skill_root(tmp_path: Path) -> Path:
    skill = tmp_path / "skills" / "greet"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: greet\ndescription: Says hello.\n---\nRun scripts/hello.py NAME.\n")
    (skill / "scripts" / "hello.py").write_text(
        "import os, sys\nopen(os.environ['OUTPUT_DIR'] + '/hello.txt', 'w').write('hello ' + sys.argv[1])\n"
    )
    return tmp_path / "skills"


@pytest.fixture
def uploads(tmp_path: Path) -> Path:
    root = tmp_path / "uploads"
    root.mkdir()
    (root / "data.csv").write_text("a,b\n1,2\n")
    (tmp_path / "secret.txt").write_text("not for the model")
    (root / "link.txt").symlink_to(tmp_path / "secret.txt")
    return root


@pytest.fixture
async def setup(tmp_path: Path, skill_root: Path, uploads: Path) -> AsyncIterator[tuple[McpTools, Clock]]:
    config = McpConfig(
        upload_roots=(uploads,), skill_roots=(skill_root,), max_file_bytes=1024, idle_timeout=60, max_workspaces=3
    )
    clock = Clock()
    async with execspace.open_engine(
        "local", workspace_root=tmp_path / "ws", host_roots=[str(uploads), str(skill_root)]
    ) as engine:
        workspaces = Workspaces(engine, idle_timeout=60, max_workspaces=3, clock=clock)
        tools = McpTools(engine, config, workspaces, InMemoryArtifactService())
        try:
            yield tools, clock
        finally:
            await tools.aclose()
            await workspaces.aclose()


async def call(tools: McpTools, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    res = await tools.call(name, arguments, CALLER)
    data: dict[str, Any] = json.loads(res["content"][0]["text"])
    assert res["isError"] == (data.get("status") == "error")
    assert res["structuredContent"] == data
    return data


async def test_upload_copies_a_file_from_an_allowed_root_only(setup: tuple[McpTools, Clock], uploads: Path) -> None:
    tools, _ = setup
    done = await call(tools, "upload_file", {"host_path": str(uploads / "data.csv")})
    read = await call(tools, "read_file", {"path": "inputs/data.csv"})
    outside = await call(tools, "upload_file", {"host_path": str(uploads.parent / "secret.txt")})
    through_link = await call(tools, "upload_file", {"host_path": str(uploads / "link.txt")})
    relative = await call(tools, "upload_file", {"host_path": "data.csv"})
    assert done["path"] == "inputs/data.csv" and read["content"] == "a,b\n1,2\n"
    assert outside["error_type"] == "PathDenied" and "outside the allowed host roots" in outside["error"]
    assert through_link["error_type"] == "PathDenied"
    assert relative["error_type"] == "PathDenied"
    listed = await call(tools, "list_files", {"patterns": ["inputs/**"]})
    assert [e["path"] for e in listed["entries"] if e["kind"] == "file"] == ["inputs/data.csv"]


async def test_files_over_the_cap_are_refused_with_the_way_out(setup: tuple[McpTools, Clock]) -> None:
    tools, _ = setup
    big = await call(tools, "write_file", {"path": "big.txt", "content": "x" * 1025})
    await call(tools, "workspace_exec", {"command": "head -c 5000 /dev/zero | tr '\\0' y > big.txt"})
    too_big = await call(tools, "read_file", {"path": "big.txt"})
    head = await call(tools, "read_file", {"path": "big.txt", "max_bytes": 10})
    assert big["error_type"] == "LimitExceeded" and "max_file_bytes" in big["error"]
    assert too_big["error_type"] == "LimitExceeded" and "max_bytes" in too_big["error"]
    assert (head["content"], head["truncated"], head["size"]) == ("y" * 10, True, 5000)


async def test_remove_file_removes_a_file_or_a_tree(setup: tuple[McpTools, Clock]) -> None:
    tools, _ = setup
    await call(tools, "write_file", {"path": "d/a.txt", "content": "a"})
    await call(tools, "write_file", {"path": "d/sub/b.txt", "content": "b", "executable": True})
    mode = await call(tools, "workspace_exec", {"command": "test -x d/sub/b.txt && echo exec"})
    one = await call(tools, "remove_file", {"path": "d/a.txt"})
    tree = await call(tools, "remove_file", {"path": "d"})
    gone = await call(tools, "read_file", {"path": "d/sub/b.txt"})
    again = await call(tools, "remove_file", {"path": "d"})
    assert mode["stdout"] == "exec\n"
    assert one["status"] == tree["status"] == "ok"
    # reading names the workspace too (a FileNotFoundError of its own); removing what is gone is the plain one
    assert (gone["error_type"], again["error_type"]) == ("WorkspaceFileNotFound", "FileNotFoundError")
    assert "list_files" in gone["hint"]
    listed = await call(tools, "list_files", {})
    assert all(not e["path"].startswith("d/") for e in listed["entries"])


async def test_the_workspace_record_is_never_written_or_removed_through_a_tool(
    setup: tuple[McpTools, Clock], uploads: Path, tmp_path: Path
) -> None:
    """What the red team did: write_file over metadata.json (the staging record execspace trusts). Every tool that
    writes or removes refuses the record, its temporary writes and the corrupt copies kept aside; it is unchanged."""
    tools, _ = setup
    await call(tools, "upload_file", {"workspace_id": "rec", "host_path": str(uploads / "data.csv")})
    (record,) = (tmp_path / "ws").glob("rec-*/metadata.json")
    before = record.read_bytes()
    assert b"data.csv" in before
    forged = json.dumps({"id": "rec", "inputs": [], "outputs": []})
    names = [
        "../metadata.json",
        "./../metadata.json",
        "../metadata.json/",
        "../metadata.json.corrupt-1-abc",
        "../.metadata.json.1.a.tmp",
    ]
    for name in names:
        wrote = await call(tools, "write_file", {"workspace_id": "rec", "path": name, "content": forged})
        removed = await call(tools, "remove_file", {"workspace_id": "rec", "path": name})
        uploaded = await call(
            tools, "upload_file", {"workspace_id": "rec", "host_path": str(uploads / "data.csv"), "path": name}
        )
        assert all(r["error_type"] == "PathDenied" for r in (wrote, removed, uploaded)), (
            name,
            wrote,
            removed,
            uploaded,
        )
        assert "workspace's own record" in wrote["error"] and "workspace's own record" in removed["error"]
    assert record.read_bytes() == before
    assert not any(p.name != "metadata.json" and "metadata.json" in p.name for p in record.parent.iterdir())
    # a file of that name elsewhere is just a file
    assert (await call(tools, "write_file", {"workspace_id": "rec", "path": "metadata.json", "content": "{}"}))[
        "status"
    ] == "ok"


async def test_skills_are_listed_and_run(setup: tuple[McpTools, Clock]) -> None:
    tools, _ = setup
    listed = await call(tools, "skill_list", {})
    ran = await call(tools, "skill_run", {"skill": "greet", "script": "scripts/hello.py", "args": ["mcp"]})
    read = await call(tools, "read_file", {"path": "../out/hello.txt"})
    assert listed["skills"] == [{"name": "greet", "description": "Says hello."}]
    assert ran["exit_code"] == 0 and read["content"] == "hello mcp"


async def test_save_artifact_keeps_a_version(setup: tuple[McpTools, Clock]) -> None:
    tools, _ = setup
    await call(tools, "write_file", {"workspace_id": "app/user/s1", "path": "../out/r.txt", "content": "v1"})
    saved = await call(tools, "save_artifact", {"workspace_id": "app/user/s1", "path": "../out/r.txt"})
    refused = await call(tools, "save_artifact", {"workspace_id": "app/user/s1", "path": "../src/x.py"})
    assert saved["artifact"] == "artifact://out/r.txt@1"
    artifact = await tools.artifacts.load(ArtifactScope.from_workspace_id("app/user/s1"), "out/r.txt")
    assert artifact.data == b"v1"
    assert refused["error_type"] == "PathDenied"


async def test_idle_workspaces_are_reaped_unless_a_program_runs(setup: tuple[McpTools, Clock], tmp_path: Path) -> None:
    tools, clock = setup
    await call(tools, "write_file", {"workspace_id": "idle", "path": "a", "content": "x"})
    await call(tools, "write_file", {"workspace_id": "busy", "path": "a", "content": "x"})
    tag = new_tag("mcp-reap")
    await call(
        tools, "workspace_exec", {"workspace_id": "busy", "command": "sleep 60", "background": True, "env": tagged(tag)}
    )
    await wait_processes(tag, 1)
    clock.now += 30
    assert await tools.workspaces.reap() == []
    clock.now += 31
    assert await tools.workspaces.reap() == ["idle"]
    ids = {w["workspace_id"] for w in (await call(tools, "workspace_list", {}))["workspaces"]}
    assert ids == {"busy"}
    assert not any("idle" in p.name for p in (tmp_path / "ws").iterdir())


async def test_a_workspace_is_not_reaped_during_a_long_foreground_call(setup: tuple[McpTools, Clock]) -> None:
    tools, clock = setup
    tag = new_tag("mcp-fg")
    command = "while [ ! -e go ]; do sleep 0.02; done; echo finished"
    running = asyncio.create_task(
        call(tools, "workspace_exec", {"workspace_id": "slow", "command": command, "env": tagged(tag)})
    )
    await wait_processes(tag, 1)
    clock.now += 1000
    assert await tools.workspaces.reap() == []
    await call(tools, "write_file", {"workspace_id": "slow", "path": "go", "content": ""})
    assert (await running)["stdout"] == "finished\n"
    assert await tools.workspaces.reap() == []  # its last use is the end of that call
    clock.now += 61
    assert await tools.workspaces.reap() == ["slow"]


async def test_the_workspace_limit_and_close(setup: tuple[McpTools, Clock]) -> None:
    tools, _ = setup
    for name in ("w1", "w2", "w3"):
        assert (await call(tools, "workspace_create", {"workspace_id": name}))["created"] is True
    again = await call(tools, "workspace_create", {"workspace_id": "w1"})
    over = await call(tools, "workspace_create", {"workspace_id": "w4"})
    closed = await call(tools, "workspace_close", {"workspace_id": "w2"})
    unknown = await call(tools, "workspace_close", {"workspace_id": "w2"})
    assert again["created"] is False
    assert over["error_type"] == "LimitExceeded" and "workspace_close" in over["error"]
    assert closed == {"status": "ok", "closed": "w2"}
    assert unknown["error_type"] == "WorkspaceNotFound"
