"""The execute_code tool on the local and the sandbox backend: real interpreters, real files."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from execspace import BaseEngine, CodeExecutor, InvalidSpec, WorkspaceNotFound
from execspace.tools import ExecuteCodeTool, Tool
from tests.bindings import BACKENDS, open_backend

pytestmark = pytest.mark.timeout(60)

WRITE_PY = "import os\nopen(os.path.join(os.environ['OUTPUT_DIR'], 'result.txt'), 'w').write('42')\nprint('wrote')\n"


@pytest.fixture(params=BACKENDS)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with open_backend(request, request.param, tmp_path) as engine:
        yield engine


@pytest.fixture
def executor(any_engine: BaseEngine) -> CodeExecutor:
    return CodeExecutor(any_engine, timeout=30)


@pytest.fixture
def tool(executor: CodeExecutor) -> ExecuteCodeTool:
    return ExecuteCodeTool(executor)


# -- the spec ---------------------------------------------------------------------------


def test_spec_renders_for_openai_and_anthropic(tool: ExecuteCodeTool) -> None:
    as_tool: Tool = tool  # statically, and at run time below, it is a Tool
    assert isinstance(as_tool, Tool)
    fn = tool.spec.openai()["function"]
    assert fn["name"] == "execute_code" and "code_blocks" in fn["parameters"]["properties"]
    block = fn["parameters"]["properties"]["code_blocks"]["items"]
    assert block["properties"]["language"]["enum"] == ["python", "bash"]
    assert block["required"] == ["language", "code"]
    assert tool.spec.anthropic()["input_schema"] == fn["parameters"]
    assert "execution_id" not in fn["parameters"]["properties"]  # the model never picks the workspace


def test_languages_take_aliases_and_refuse_data_or_unknown(executor: CodeExecutor) -> None:
    tool = ExecuteCodeTool(executor, languages=["py", "JS", "python3"], name="run_code")
    assert [lang.name for lang in tool.languages] == ["python", "javascript"]
    assert tool.spec.name == "run_code"
    for bad in (["json"], ["yaml"], ["cobol"], [], "python"):
        with pytest.raises(InvalidSpec):
            ExecuteCodeTool(executor, languages=bad)
    with pytest.raises(InvalidSpec):
        ExecuteCodeTool(executor, output_budget=0)


# -- round trips ------------------------------------------------------------------------


async def test_blocks_run_in_order_and_files_are_listed(tool: ExecuteCodeTool) -> None:
    out = await tool.call(
        {
            "code_blocks": [
                {"language": "python", "code": WRITE_PY},
                {"language": "bash", "code": 'cat "$OUTPUT_DIR/result.txt"; echo; pwd'},
            ]
        }
    )
    json.dumps(out)
    assert out["status"] == "ok" and not out["output_truncated"]
    lines = out["output"].splitlines()
    assert lines[:2] == ["wrote", "42"] and lines[2].endswith("/work")
    assert out["output_total_bytes"] == len(out["output"].encode())
    assert [(b["index"], b["language"], b["exit_code"]) for b in out["blocks"]] == [(0, "python", 0), (1, "bash", 0)]
    assert out["files"] == [{"path": "out/result.txt", "size": 2, "mime_type": "text/plain"}]


@pytest.mark.parametrize(
    "arguments",
    [
        {"code": "print(6 * 7)", "language": "python"},
        {"code": "print(6 * 7)", "language": "Py"},
        {"code_blocks": {"language": "python3", "code": "print(6 * 7)"}},
        {"code_blocks": json.dumps([{"language": "python", "code": "print(6 * 7)"}])},
        {"code_blocks": [{"language": "sh", "code": "echo $((6 * 7))"}]},
    ],
    ids=["single", "alias", "one-object", "json-string", "bash-alias"],
)
async def test_accepted_argument_forms(tool: ExecuteCodeTool, arguments: dict[str, Any]) -> None:
    out = await tool.call(arguments)
    assert (out["status"], out["output"]) == ("ok", "42\n")


async def test_a_failing_block_is_reported_not_raised(tool: ExecuteCodeTool) -> None:
    out = await tool.call({"code": "import sys\nprint('partial')\nsys.exit(2)", "language": "python"})
    assert out["status"] == "failed"
    assert out["blocks"][0]["exit_code"] == 2
    assert out["output"] == "partial\n[exit code 2]\n"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({}, "missing code_blocks"),
        ({"code_blocks": []}, "empty"),
        ({"code": "print(1)"}, "needs a language"),
        ({"code": "print(1)", "language": "python", "code_blocks": []}, "either"),
        ({"code_blocks": [{"language": "ruby", "code": "puts 1"}]}, "must be one of ['python', 'bash']"),
        ({"code_blocks": [{"language": "json", "code": "{}"}]}, "must be one of"),
        ({"code_blocks": [{"language": "python"}]}, "missing the required field 'code'"),
        ({"code_blocks": [{"language": "python", "code": ""}]}, "at least 1"),
        ({"code_blocks": [{"language": "python", "code": "1", "cwd": "/"}]}, "unknown field"),
        ({"code_blocks": "not json"}, "not JSON"),
        ({"code_blocks": [{"language": "python", "code": "1"}] * 17}, "more than 16"),
        ({"code": "print(1)", "language": "python", "execution_id": "other/session"}, "unknown field"),
    ],
)
async def test_bad_arguments_come_back_as_errors_and_run_nothing(
    any_engine: BaseEngine, executor: CodeExecutor, arguments: dict[str, Any], message: str
) -> None:
    tool = ExecuteCodeTool(executor, execution_id="tool/bad/args")
    out = await tool.call(arguments)
    assert out["status"] == "error" and out["error_type"] == "InvalidArguments"
    assert message in out["error"]
    with pytest.raises(WorkspaceNotFound):
        await any_engine.manager.get_workspace("tool/bad/args")  # not even a workspace was made


async def test_execution_id_keeps_state_and_a_call_may_override_it(executor: CodeExecutor) -> None:
    tool = ExecuteCodeTool(executor, execution_id="tool/user/s1")
    await tool.call({"code": "echo first > state.txt", "language": "bash"})
    assert (await tool.call({"code": "cat state.txt", "language": "bash"}))["output"] == "first\n"
    other = await tool.call({"code": "cat state.txt", "language": "bash"}, execution_id="tool/user/s2")
    assert other["status"] == "failed" and "No such file" in other["output"]


async def test_without_an_execution_id_each_call_is_fresh(tool: ExecuteCodeTool) -> None:
    await tool.call({"code": "echo x > state.txt", "language": "bash"})
    check = await tool.call({"code": "test -e state.txt && echo kept || echo fresh", "language": "bash"})
    assert check["output"] == "fresh\n"


# -- budgets ----------------------------------------------------------------------------


async def test_output_is_cut_to_the_budget_keeping_head_and_tail(executor: CodeExecutor) -> None:
    tool = ExecuteCodeTool(executor, output_budget=2000)
    out = await tool.call({"code": "for i in range(20000): print(i)", "language": "python"})
    total = len("".join(f"{i}\n" for i in range(20000)))
    assert out["status"] == "ok" and out["output_truncated"] and out["output_total_bytes"] == total
    assert out["output"].startswith("0\n1\n2\n") and out["output"].endswith("19998\n19999\n")
    assert "bytes omitted" in out["output"] and len(out["output"].encode()) <= 2000 + 64


async def test_budget_never_splits_a_character(executor: CodeExecutor) -> None:
    tool = ExecuteCodeTool(executor, output_budget=1001)
    out = await tool.call({"code": "print('é€😀' * 5000)", "language": "python"})
    assert out["output_truncated"] and "\ufffd" not in out["output"]
    head, _, tail = out["output"].partition("\n[... execspace:")
    assert set(head) <= set("é€😀") and set(tail.split("...]\n")[-1]) <= set("é€😀\n")


async def test_files_list_is_capped(tool: ExecuteCodeTool) -> None:
    code = 'for i in $(seq 1 25); do echo $i > "$OUTPUT_DIR/f$i.txt"; done'
    out = await tool.call({"code": code, "language": "bash"})
    assert len(out["files"]) == 20 and out["files_not_listed"] == 5


async def test_executor_errors_become_error_results(executor: CodeExecutor) -> None:
    tool = ExecuteCodeTool(executor)
    await executor.close()
    out = await tool.call({"code": "print(1)", "language": "python"})
    assert out["status"] == "error" and out["error_type"] == "UsageError" and "closed" in out["error"]
