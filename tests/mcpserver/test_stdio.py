"""The MCP server over stdio, spawned by the official SDK's client as an MCP host would."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from mcp import types

from execspace.environments import get
from execspace.errors import EnvironmentNotFound

from .conftest import ONLY_MCP1, PNG_SIGNATURE, left_in, stdio_session, write_config

pytestmark = [pytest.mark.timeout(120), ONLY_MCP1]


def result_of(res: types.CallToolResult) -> dict[str, Any]:
    first = res.content[0]
    assert isinstance(first, types.TextContent)
    data: dict[str, Any] = json.loads(first.text)
    return data


async def test_the_default_backend_runs_commands_and_round_trips_bytes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    payload = bytes(range(256)) + b"\r\n\x00end"
    async with stdio_session("--config", str(config)) as session:
        tools = (await session.list_tools()).tools
        ran = result_of(await session.call_tool("workspace_exec", {"command": "printf 'a\\nb' | wc -l; id -u"}))
        await session.call_tool(
            "write_file",
            {"path": "in.bin", "content": base64.b64encode(payload).decode(), "encoding": "base64"},
        )
        copied = result_of(await session.call_tool("workspace_exec", {"command": "cp in.bin ../out/copy.bin"}))
        back = result_of(await session.call_tool("read_file", {"path": "../out/copy.bin", "encoding": "base64"}))
        text = await session.call_tool("write_file", {"path": "t.txt", "content": "héllo\n"})
        read_text = result_of(await session.call_tool("read_file", {"path": "/workspace/work/t.txt"}))
        listing = result_of(await session.call_tool("workspace_list", {}))
        assert left_in(tmp_path / "ws") != []
    schema = next(t for t in tools if t.name == "workspace_exec").inputSchema
    assert schema["required"] == ["command"] and "workspace_id" in schema["properties"]
    assert ran["exit_code"] == 0 and ran["stdout"].split()[0] == "1"
    assert copied["files"] == [
        {"path": "../out/copy.bin", "size": len(payload), "mime_type": "application/octet-stream", "change": "created"}
    ]
    assert base64.b64decode(back["content_base64"]) == payload
    assert not text.isError and read_text["content"] == "héllo\n"
    assert (listing["backend"], listing["isolation"]) == ("sandbox", "process")
    assert left_in(tmp_path / "ws") == []  # the client closed stdin: the server removed its workspaces


async def test_a_plot_comes_back_as_image_content(tmp_path: Path) -> None:
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    config = write_config(tmp_path)
    code = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('drawn')"
    async with stdio_session("--backend", "jupyter", "--config", str(config)) as session:
        res = await session.call_tool("run_code", {"language": "python", "code": code})
        again = await session.call_tool("run_code", {"language": "python", "code": "print(41 + 1)"})
    data = result_of(res)
    images = [c for c in res.content if isinstance(c, types.ImageContent)]
    assert data["status"] == "ok" and "drawn" in data["output"]
    assert len(images) == 1 and images[0].mimeType == "image/png"
    assert base64.b64decode(images[0].data).startswith(PNG_SIGNATURE)
    assert [f["mime_type"] for f in data["files"]] == ["image/png"]
    # the next call shows only what it produced: no stale plot
    assert [c.type for c in again.content] == ["text"] and "42" in result_of(again)["output"]


def _code_interpreter_built() -> None:
    try:
        get("code-interpreter")
    except EnvironmentNotFound:
        pytest.skip("needs the code-interpreter environment (execspace env build code-interpreter)")


async def test_a_jupyter_config_naming_its_mode_and_environment_runs_the_data_stack(tmp_path: Path) -> None:
    """The newcomer's config: ``mode = "sandboxed"`` as a string and ``environment`` for jupyter, a kernel with
    pandas; the plot comes back as an image."""
    pytest.importorskip("ipykernel")
    _code_interpreter_built()
    root = write_config(tmp_path).parent / "ws"
    config = tmp_path / "jupyter.toml"
    config.write_text(
        f'backend = "jupyter"\n[backend_options]\nworkspace_root = "{root}"\nmode = "sandboxed"\n'
        'environment = "code-interpreter"\n'
    )
    code = "import pandas as pd, sys\npd.Series([1, 3, 2]).plot()\nimport matplotlib.pyplot as plt\nplt.show()\n"
    async with stdio_session("--config", str(config)) as session:
        res = await session.call_tool("run_code", {"language": "python", "code": code + "print(sys.prefix)"})
        listing = result_of(await session.call_tool("workspace_list", {}))
    data = result_of(res)
    assert data["status"] == "ok" and "code-interpreter" in data["output"], data
    assert [c.type for c in res.content].count("image") == 1
    assert (listing["backend"], listing["isolation"]) == ("jupyter", "process")


async def test_the_environment_flag_runs_commands_in_it_on_the_sandbox(tmp_path: Path) -> None:
    _code_interpreter_built()
    config = write_config(tmp_path)
    async with stdio_session("--environment", "code-interpreter", "--config", str(config)) as session:
        ran = result_of(await session.call_tool("workspace_exec", {"command": "python -c 'import pandas; print(7)'"}))
        listing = result_of(await session.call_tool("workspace_list", {}))
    assert (ran["exit_code"], ran["stdout"]) == (0, "7\n"), ran
    assert listing["backend"] == "sandbox"


async def test_file_paths_are_relative_to_the_directory_commands_run_in(tmp_path: Path) -> None:
    """The newcomer's session: ``ls`` shows ``inputs/``, so ``write_file inputs/sales2.csv`` puts the file there;
    results are ``../out/...`` both ways; a path that leaves the workspace is refused, naming the base."""
    config = write_config(tmp_path)
    async with stdio_session("--config", str(config)) as session:
        seen = result_of(await session.call_tool("workspace_exec", {"command": "ls"}))
        wrote = result_of(await session.call_tool("write_file", {"path": "inputs/sales2.csv", "content": "a\n1\n"}))
        listed = result_of(
            await session.call_tool("workspace_exec", {"command": "ls inputs; wc -l < inputs/sales2.csv"})
        )
        made = result_of(await session.call_tool("workspace_exec", {"command": "echo r > $OUTPUT_DIR/r.txt"}))
        back = result_of(await session.call_tool("read_file", {"path": made["files"][0]["path"]}))
        files = result_of(await session.call_tool("list_files", {}))
        escape = result_of(await session.call_tool("write_file", {"path": "../../x", "content": "x"}))
        top = result_of(await session.call_tool("write_file", {"path": "../x", "content": "x"}))
    assert "inputs" in seen["stdout"].split()
    assert wrote["path"] == "inputs/sales2.csv" and listed["stdout"] == "sales2.csv\n2\n"
    assert made["files"][0]["path"] == "../out/r.txt" and back["content"] == "r\n"
    assert {"inputs/sales2.csv", "../out/r.txt"} <= {e["path"] for e in files["entries"]}
    assert escape["error_type"] == top["error_type"] == "PathDenied"
    assert "relative to work/, the directory commands run in" in escape["error"]
    assert "relative to work/" in top["error"]
