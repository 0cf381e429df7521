"""The smolagents executor, on the jupyter backend's sandboxed kernels: smolagents' own send_tools/send_variables and
final answer, and a real CodeAgent driven by a scripted model (no network)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("smolagents", reason="needs the smolagents extra (pip install 'execspace[smolagents]')")
pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

from smolagents import CodeAgent, Tool
from smolagents.default_tools import FinalAnswerTool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.utils import AgentError

import execspace.sync
from execspace import CapabilityError, Isolation, WorkspaceNotFound
from execspace.integrations.smolagents import ExecspacePythonExecutor
from execspace.sync import SyncEngine
from execspace.testing.binding import make_traversable

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the kernels are sandboxed with bubblewrap here")

QUIET = AgentLogger(level=LogLevel.OFF)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[SyncEngine]:
    make_traversable(tmp_path)  # as root, the kernels run as the workspace's own uid
    with execspace.sync.open_engine("jupyter", workspace_root=tmp_path / "ws") as eng:
        kernels = eng.describe().kernels
        assert kernels is not None and kernels.isolation is Isolation.PROCESS  # sandboxed, not on the host
        yield eng


@pytest.fixture
def executor(engine: SyncEngine) -> Iterator[ExecspacePythonExecutor]:
    ex = ExecspacePythonExecutor(engine, workspace_id="smol/test", logger=QUIET, timeout=10)
    yield ex
    ex.cleanup()


class Multiply(Tool):  # type: ignore[misc]
    name = "multiply"
    description = "Multiplies two integers."
    inputs: ClassVar = {
        "a": {"type": "integer", "description": "first"},
        "b": {"type": "integer", "description": "second"},
    }
    output_type = "integer"

    def forward(self, a: int, b: int) -> int:
        return a * b


def test_state_tools_variables_and_final_answer_live_in_the_kernel(executor: ExecspacePythonExecutor) -> None:
    executor.send_tools({"multiply": Multiply(), "final_answer": FinalAnswerTool()})
    executor.send_variables({"rows": [3, 4], "label": "area"})

    step = executor("area = multiply(rows[0], rows[1])\nprint(label, area)")
    assert (step.logs, step.is_final_answer, step.output) == ("area 12\n", False, None)

    done = executor("final_answer({'area': area, 'label': label})")
    assert done.is_final_answer and done.output == {"area": 12, "label": "area"}

    with pytest.raises(AgentError, match="ZeroDivisionError"):
        executor("print('before'); 1 / 0")
    after = executor("print(area)")  # the failure kept the state, and no stale error reads as a final answer
    assert (after.logs, after.is_final_answer) == ("12\n", False)


def test_a_timeout_says_the_state_is_gone(engine: SyncEngine) -> None:
    ex = ExecspacePythonExecutor(engine, logger=QUIET, timeout=1)
    try:
        with pytest.raises(AgentError, match="timed out"):
            ex("import time; time.sleep(30)")
        assert ex("print('alive')").logs == "alive\n"
    finally:
        ex.cleanup()


def test_cleanup_removes_the_workspace(engine: SyncEngine) -> None:
    ex = ExecspacePythonExecutor(engine, workspace_id="smol/gone", logger=QUIET)
    ex("open('f.txt', 'w').write('x')")
    host_path = ex.workspace.host_path
    ex.cleanup()
    assert host_path is not None and not host_path.exists()
    with pytest.raises(WorkspaceNotFound):
        engine.manager.get_workspace("smol/gone")


def test_an_engine_without_kernels_is_refused(tmp_path: Path) -> None:
    with (
        execspace.sync.open_engine("local", workspace_root=tmp_path / "local") as local,
        pytest.raises(CapabilityError, match="kernel"),
    ):
        ExecspacePythonExecutor(local)


class ScriptedModel(Model):  # type: ignore[misc]
    """Answers with the given texts in turn, and keeps what it was sent."""

    def __init__(self, *replies: str) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: list[Any] = []

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        self.seen.append(messages)
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def test_a_code_agent_runs_its_actions_in_the_sandboxed_kernel(engine: SyncEngine, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("the host's own file")
    model = ScriptedModel(
        "Thought: look around.\n<code>\nimport os\nseen = os.path.exists("
        + repr(str(secret))
        + ")\nprint('host file visible:', seen)\nproduct = multiply(6, 7)\n</code>",
        "Thought: answer.\n<code>\nfinal_answer(product)\n</code>",
    )
    executor = ExecspacePythonExecutor(engine, logger=QUIET)
    agent = CodeAgent(tools=[Multiply()], model=model, executor=executor, verbosity_level=LogLevel.OFF)
    try:
        assert agent.run("What is 6 times 7?") == 42
    finally:
        agent.cleanup()
    observations = str(model.seen[1])
    assert "host file visible: False" in observations


def test_a_missing_smolagents_names_the_extra() -> None:
    script = (
        "import sys, execspace\n"
        "assert 'smolagents' not in sys.modules\n"
        "sys.modules['smolagents'] = None\n"
        "try:\n"
        "    import execspace.integrations.smolagents\n"
        "except execspace.integrations.MissingExtra as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "pip install 'execspace[smolagents]'" in out
