"""The OpenAI Agents SDK sandbox client, driven through the SDK's own session interface and a SandboxAgent run
(with a scripted model: no network), on the sandbox backend."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents.sandbox", reason="needs the openai-agents extra (pip install 'execspace[openai-agents]')")

from agents import Agent, ModelResponse, ModelSettings, RunConfig, Runner, Usage
from agents.models.interface import Model
from agents.sandbox import LocalSnapshotSpec, Manifest, SandboxAgent, SandboxPathGrant, SandboxRunConfig
from agents.sandbox.errors import ExecTimeoutError, WorkspaceArchiveWriteError, WorkspaceReadNotFoundError
from agents.sandbox.sandboxes import UnixLocalSandboxClient
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

from execspace import BaseEngine, CapabilityError, InvalidSpec, PathDenied, WorkspaceNotFound
from execspace.integrations.openai_agents import (
    ExecspaceSandboxClient,
    ExecspaceSandboxClientOptions,
    ExecspaceSandboxSessionState,
    function_tools,
)
from execspace.testing.processes import new_tag, wait_no_process
from execspace.tools import WorkspaceExecTool

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox backend here is bubblewrap")


@pytest.fixture
def client(engine: BaseEngine) -> ExecspaceSandboxClient:
    return ExecspaceSandboxClient(engine)


def options(workspace_id: str = "agents/test", **more: Any) -> ExecspaceSandboxClientOptions:
    return ExecspaceSandboxClientOptions(workspace_id=workspace_id, **more)


async def test_exec_read_write_through_the_session(client: ExecspaceSandboxClient, engine: BaseEngine) -> None:
    session = await client.create(options=options())
    async with session:
        result = await session.exec("printf out; printf err >&2; pwd >&2; exit 3")
        assert (result.stdout, result.exit_code) == (b"out", 3)
        assert result.stderr == b"err/workspace/work\n"

        await session.write(Path("data/blob.bin"), io.BytesIO(bytes(range(256))))
        copied = await session.exec("cp data/blob.bin data/copy.bin && wc -c < data/copy.bin")
        assert copied.stdout.strip() == b"256"
        assert (await session.read(Path("/workspace/work/data/copy.bin"))).read() == bytes(range(256))

        ws = await engine.manager.get_workspace("agents/test")
        assert ws.host_path is not None
        assert (ws.host_path / "work/data/copy.bin").read_bytes() == bytes(range(256))
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))
    await client.delete(session)
    assert not ws.host_path.exists()


async def test_commands_are_confined_where_unix_local_is_not(client: ExecspaceSandboxClient, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's own file")
    probe = f"cat {secret} || echo hidden"

    local = UnixLocalSandboxClient()
    unconfined = await local.create(manifest=Manifest())
    async with unconfined:
        assert (await unconfined.exec(probe)).stdout == b"the host's own file"
    await local.delete(unconfined)

    session = await client.create(options=options())
    async with session:
        assert (await session.exec(probe)).stdout.strip() == b"hidden"
        writes_outside = await session.exec("echo x > /workspace/escape.txt || echo refused")
        assert writes_outside.stdout.strip() == b"refused"
    await client.delete(session)


async def test_a_timeout_raises_the_sdk_error_and_leaves_no_process(client: ExecspaceSandboxClient) -> None:
    tag = new_tag("agents")
    session = await client.create(options=options())
    async with session:
        with pytest.raises(ExecTimeoutError):
            await session.exec(f"sleep 30 # {tag}", timeout=0.5)
        assert wait_no_process(tag) == []
    await client.delete(session)


async def test_persist_and_hydrate_carry_the_files_links_and_bytes(client: ExecspaceSandboxClient) -> None:
    source = await client.create(options=options("agents/source"))
    async with source:
        await source.write(Path("a/b/c.bin"), io.BytesIO(b"\x00\xffbytes"))
        assert (await source.exec("ln -s b/c.bin a/link && mkdir -p empty && chmod +x a/b/c.bin")).ok()
        archive = (await source.persist_workspace()).read()
    await client.delete(source)

    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
    assert {"./a/b/c.bin", "./a/link", "./empty"} <= names
    assert all(n == "." or n.startswith("./") for n in names)  # workspace-relative, as the SDK asks

    target = await client.create(options=options("agents/target"))
    async with target:
        await target.hydrate_workspace(io.BytesIO(archive))
        assert (await target.read(Path("a/b/c.bin"))).read() == b"\x00\xffbytes"
        listing = await target.exec("readlink a/link; test -x a/b/c.bin && echo executable; test -d empty && echo dir")
        assert listing.stdout.split() == [b"b/c.bin", b"executable", b"dir"]
    await client.delete(target)


def _tar(*members: tuple[str, str | None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, link in members:
            info = tarfile.TarInfo(name)
            if link is None:
                info.size = 2
                tar.addfile(info, io.BytesIO(b"hi"))
            else:
                info.type, info.linkname = tarfile.SYMTYPE, link
                tar.addfile(info)
    return buf.getvalue()


@pytest.mark.parametrize(
    "archive",
    [_tar(("ok.txt", None), ("../escape.txt", None)), _tar(("ok.txt", None), ("out", "/etc"))],
    ids=["climbing member", "link out of the workspace"],
)
async def test_hydrate_refuses_an_unsafe_archive_and_writes_nothing(
    client: ExecspaceSandboxClient, engine: BaseEngine, archive: bytes
) -> None:
    session = await client.create(options=options())
    async with session:
        with pytest.raises(WorkspaceArchiveWriteError):
            await session.hydrate_workspace(io.BytesIO(archive))
        ws = await engine.manager.get_workspace("agents/test")
        assert ws.host_path is not None
        assert not (ws.host_path / "work/ok.txt").exists()
        assert not (ws.host_path / "escape.txt").exists()
    await client.delete(session)


async def test_resume_reattaches_to_the_live_workspace(client: ExecspaceSandboxClient) -> None:
    session = await client.create(options=options())
    async with session:
        await session.write(Path("notes.txt"), io.BytesIO(b"kept"))
        payload = client.serialize_session_state(session.state)

    state = client.deserialize_session_state(json.loads(json.dumps(payload)))
    assert isinstance(state, ExecspaceSandboxSessionState)
    resumed = await client.resume(state)
    async with resumed:
        assert (await resumed.exec("cat notes.txt")).stdout == b"kept"
    await client.delete(resumed)


async def test_resume_after_delete_restores_the_snapshot(client: ExecspaceSandboxClient, tmp_path: Path) -> None:
    snapshots = tmp_path / "snapshots"
    snapshots.mkdir()
    session = await client.create(snapshot=LocalSnapshotSpec(base_path=snapshots), options=options())
    async with session:
        await session.write(Path("report.md"), io.BytesIO(b"# done"))
    state = session.state
    await client.delete(session)  # the workspace is gone: only the snapshot holds the file

    resumed = await client.resume(state)
    async with resumed:
        assert (await resumed.read(Path("report.md"))).read() == b"# done"
    await client.delete(resumed)


async def test_pty_sessions_take_stdin_and_end(client: ExecspaceSandboxClient) -> None:
    session = await client.create(options=options())
    async with session:
        assert session.supports_pty()
        started = await session.pty_exec_start("cat", tty=True, yield_time_s=0.3)
        assert started.process_id is not None and started.exit_code is None
        echoed = await session.pty_write_stdin(session_id=started.process_id, chars="ping\n", yield_time_s=0.5)
        assert b"ping" in echoed.output
        ended = await session.pty_write_stdin(session_id=started.process_id, chars="\x04", yield_time_s=2)
        assert (ended.process_id, ended.exit_code) == (None, 0)
        quick = await session.pty_exec_start("echo quick", yield_time_s=2)
        assert (quick.output, quick.exit_code, quick.process_id) == (b"quick\n", 0, None)
    await client.delete(session)


async def test_another_user_and_another_root_are_refused(client: ExecspaceSandboxClient) -> None:
    session = await client.create(options=options())
    async with session:
        with pytest.raises(CapabilityError, match="another user"):
            await session.exec("id", user="root")
        with pytest.raises(CapabilityError, match="another user"):
            await session.write(Path("x.txt"), io.BytesIO(b"x"), user="root")
    await client.delete(session)
    granted = await client.create(
        manifest=Manifest(extra_path_grants=(SandboxPathGrant(path="/tmp"),)), options=options("agents/granted")
    )
    async with granted:  # a grant out of the workspace opens nothing on the host through the file API
        with pytest.raises(PathDenied, match="outside the workspace"):
            await granted.write(Path("/tmp/planted.txt"), io.BytesIO(b"x"))
    await client.delete(granted)
    with pytest.raises(InvalidSpec, match=r"Manifest\.root"):
        await client.create(manifest=Manifest(root="/srv/elsewhere"), options=options("agents/other"))
    with pytest.raises(WorkspaceNotFound):  # the refused session left no workspace
        await client.engine.manager.get_workspace("agents/other")


class ScriptedModel(Model):
    """Answers with the given outputs in turn, and keeps what it was sent."""

    def __init__(self, *turns: list[Any]) -> None:
        self.turns = list(turns)
        self.inputs: list[Any] = []

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.inputs.append(kwargs["input"])
        return ModelResponse(output=self.turns.pop(0), usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def _message(text: str) -> ResponseOutputMessage:
    content = [ResponseOutputText(type="output_text", text=text, annotations=[])]
    return ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed", content=content)


async def test_a_sandbox_agent_runs_its_commands_in_the_workspace(
    client: ExecspaceSandboxClient, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's own file")
    command = f"echo $((6*7)) > answer.txt; cat answer.txt; cat {secret} || echo hidden"
    call = ResponseFunctionToolCall(
        type="function_call", call_id="c1", name="exec_command", arguments=json.dumps({"cmd": command})
    )
    model = ScriptedModel([call], [_message("done")])
    agent: Agent[Any] = SandboxAgent(name="dev", instructions="work", model=model, model_settings=ModelSettings())
    run_config = RunConfig(sandbox=SandboxRunConfig(client=client, options=options()), tracing_disabled=True)

    result = await Runner.run(agent, "compute", run_config=run_config)

    assert result.final_output == "done"
    tool_output = next(i for i in model.inputs[1] if isinstance(i, dict) and i.get("type") == "function_call_output")
    assert "42" in str(tool_output["output"]) and "hidden" in str(tool_output["output"])
    assert "the host's own file" not in str(tool_output["output"])
    with pytest.raises(WorkspaceNotFound):  # the run's own session was deleted with its workspace
        await client.engine.manager.get_workspace("agents/test")


def test_importing_execspace_imports_no_framework_and_a_missing_one_names_the_extra() -> None:
    script = (
        "import sys, execspace, execspace.integrations\n"
        "assert 'agents' not in sys.modules, 'execspace imported the SDK'\n"
        "sys.modules['agents'] = None\n"
        "try:\n"
        "    import execspace.integrations.openai_agents\n"
        "except execspace.integrations.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "pip install 'execspace[openai-agents]'" in out


async def test_function_tools_give_a_plain_agent_the_execspace_tools(engine: BaseEngine) -> None:
    async with WorkspaceExecTool(engine, workspace_id="agents/tools") as exec_tool:
        tools = function_tools(exec_tool.tools())
        assert "workspace_exec" in [t.name for t in tools]
        call = ResponseFunctionToolCall(
            type="function_call",
            call_id="c1",
            name="workspace_exec",
            arguments=json.dumps({"command": "echo $((6*7))"}),
        )
        model = ScriptedModel([call], [_message("done")])
        agent: Agent[Any] = Agent(name="dev", instructions="work", model=model, tools=list(tools))

        result = await Runner.run(agent, "compute", run_config=RunConfig(tracing_disabled=True))

    assert result.final_output == "done"
    output = next(i for i in model.inputs[1] if isinstance(i, dict) and i.get("type") == "function_call_output")
    reported = json.loads(str(output["output"]))
    assert reported["exit_code"] == 0 and "42" in json.dumps(reported)
