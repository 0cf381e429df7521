"""The deepagents sandbox backend through deepagents' backend protocol (and its BaseSandbox file tools built on
execute), and a deep agent run with a scripted chat model (no network), on the sandbox backend."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepagents", reason="needs the deepagents extra (pip install 'execspace[deepagents]')")

from deepagents import create_deep_agent
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_core.language_models.fake_chat_models import FakeMessagesListChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult

import execspace.sync
from execspace import WorkspaceNotFound
from execspace.integrations.deepagents import TIMEOUT_EXIT_CODE, ExecspaceSandbox
from execspace.sync import SyncEngine
from execspace.testing.binding import make_traversable
from execspace.testing.processes import new_tag, wait_no_process

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox backend here is bubblewrap")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[SyncEngine]:
    make_traversable(tmp_path)  # as root, programs run as the workspace's own uid
    with execspace.sync.open_engine("sandbox", workspace_root=tmp_path / "ws") as eng:
        yield eng


@pytest.fixture
def backend(engine: SyncEngine) -> Iterator[ExecspaceSandbox]:
    sandbox = ExecspaceSandbox(engine, workspace_id="deep/test", timeout=10)
    yield sandbox
    sandbox.close()


def test_execute_interleaves_the_streams_and_reports_the_exit_code(backend: ExecspaceSandbox) -> None:
    assert isinstance(backend, SandboxBackendProtocol) and backend.id == "deep/test"
    result = backend.execute("echo one; echo two >&2; echo three; pwd; exit 3")
    assert (result.output, result.exit_code, result.truncated) == ("one\ntwo\nthree\n/workspace/work\n", 3, False)


def test_a_timeout_kills_the_command(backend: ExecspaceSandbox) -> None:
    tag = new_tag("deep")
    result = backend.execute(f"python3 -c 'import time; time.sleep(30)' {tag}", timeout=1)
    assert result.exit_code == TIMEOUT_EXIT_CODE and "timed out" in result.output
    assert wait_no_process(tag) == []


def test_uploads_and_downloads_succeed_or_fail_file_by_file(backend: ExecspaceSandbox) -> None:
    uploads = backend.upload_files(
        [
            ("/workspace/work/data/a.bin", b"\x00\x01"),
            ("notes.txt", b"relative to work/\n"),
            ("/workspace/skills/evil/SKILL.md", b"planted"),
            ("/workspace/metadata.json", b"{}"),
            ("/etc/passwd", b"root::0:0::/:/bin/sh"),
            ("../../escape.txt", b"x"),
            ("/workspace/out/report.md", b"# out"),
            ("a\0b", b"x"),
            ("/workspace/work/data", b"a directory is there"),
        ]
    )
    assert [u.error for u in uploads] == [
        None,
        None,
        "permission_denied",
        "permission_denied",
        "permission_denied",
        "permission_denied",
        None,
        "invalid_path",
        "is_directory",
    ]
    assert backend.workspace.host_path is not None
    assert not (backend.workspace.host_path / "skills/evil").exists()
    assert backend.execute("cat data/a.bin | od -An -tx1; cat notes.txt ../out/report.md").output.split() == [
        "00",
        "01",
        "relative",
        "to",
        "work/",
        "#",
        "out",
    ]

    downloads = backend.download_files(["data/a.bin", "/workspace/out/report.md", "missing.txt", "data", "/etc/hosts"])
    assert [(d.content, d.error) for d in downloads] == [
        (b"\x00\x01", None),
        (b"# out", None),
        (None, "file_not_found"),
        (None, "is_directory"),
        (None, "permission_denied"),
    ]


def test_the_base_sandbox_file_tools_work_over_execute(backend: ExecspaceSandbox) -> None:
    assert backend.write("/workspace/work/src/app.py", "x = 1\nprint(x)\n").error is None
    assert backend.edit("/workspace/work/src/app.py", "x = 1", "x = 42").error is None
    assert backend.execute("python3 src/app.py").output == "42\n"
    read = backend.read("/workspace/work/src/app.py")
    assert read.error is None and "x = 42" in str(read.file_data)
    assert [m["path"] for m in backend.grep("print", path="/workspace/work").matches or []] == [
        "/workspace/work/src/app.py"
    ]
    assert "/workspace/work/src/app.py" in [f["path"] for f in backend.glob("**/*.py", path="/workspace/work").matches]
    assert "/workspace/work/src" in [f["path"] for f in backend.ls("/workspace/work").entries or []]


def test_close_removes_the_workspace(engine: SyncEngine) -> None:
    sandbox = ExecspaceSandbox(engine, workspace_id="deep/gone")
    sandbox.execute("touch kept.txt")
    sandbox.close()
    with pytest.raises(WorkspaceNotFound):
        engine.manager.get_workspace("deep/gone")


class ScriptedChatModel(FakeMessagesListChatModel):
    """Answers with the given messages in turn, keeps what it was sent, and takes any tools."""

    seen: list[list[BaseMessage]] = []  # noqa: RUF012 - a pydantic field, copied per instance

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self


def test_a_deep_agent_runs_its_commands_in_the_workspace(backend: ExecspaceSandbox, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's own file")
    command = f"echo $((6*7)) > answer.txt; cat answer.txt; cat {secret} || echo hidden"
    call = {"name": "execute", "args": {"command": command}, "id": "c1", "type": "tool_call"}
    model = ScriptedChatModel(responses=[AIMessage(content="", tool_calls=[call]), AIMessage(content="done")])
    agent = create_deep_agent(model=model, backend=backend)

    state = agent.invoke({"messages": [{"role": "user", "content": "compute"}]})

    assert state["messages"][-1].content == "done"
    tool_output = str(model.seen[1][-1].content)
    assert "42" in tool_output and "hidden" in tool_output and "the host's own file" not in tool_output
    assert backend.download_files(["answer.txt"])[0].content == b"42\n"


def test_a_missing_deepagents_names_the_extra() -> None:
    script = (
        "import sys, execspace\n"
        "assert 'deepagents' not in sys.modules\n"
        "sys.modules['deepagents'] = None\n"
        "try:\n"
        "    import execspace.integrations.deepagents\n"
        "except execspace.integrations.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "pip install 'execspace[deepagents]'" in out
