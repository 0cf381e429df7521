"""The fenced-code response processor: its exact trigger rules, on the local and the sandbox backend.

Every reply in the table carries code that would leave ``out/ran`` behind if it ran, so
"did not trigger" is checked on the workspace (never even created), not only on the
return value.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from execspace import BaseEngine, CodeBlockDelimiter, CodeExecutor, InvalidSpec, WorkspaceNotFound
from execspace.tools import FencedCodeProcessor
from tests.bindings import BACKENDS, open_backend

pytestmark = pytest.mark.timeout(60)

PY = "import os\nopen(os.environ['OUTPUT_DIR'] + '/ran', 'w').write('py')\nprint('ran python')"
SH = 'echo sh > "$OUTPUT_DIR/ran"; echo ran bash'
JS = "require('fs').writeFileSync(process.env.OUTPUT_DIR + '/ran', 'js'); console.log('ran js')"
F = "```"

# (id, reply, language it must run as, or None when it must not run)
TABLE: list[tuple[str, str, str | None]] = [
    ("plain", f"{F}python\n{PY}\n{F}", "python"),
    ("surrounding-whitespace", f" \n\t\n{F}python\n{PY}\n{F}\n\n  ", "python"),
    ("crlf", f"{F}python\r\n{PY.replace(chr(10), chr(13) + chr(10))}\r\n{F}", "python"),
    ("alias-py", f"{F}py\n{PY}\n{F}", "python"),
    ("alias-case", f"{F}Python3\n{PY}\n{F}", "python"),
    ("info-trailing-space", f"{F}python  \n{PY}\n{F}", "python"),
    ("bash", f"{F}bash\n{SH}\n{F}", "bash"),
    ("alias-sh", f"{F}sh\n{SH}\n{F}", "bash"),
    ("javascript", f"{F}js\n{JS}\n{F}", "javascript"),
    ("prose-before", f"Here it is:\n{F}python\n{PY}\n{F}", None),
    ("prose-after", f"{F}python\n{PY}\n{F}\nThat prints a line.", None),
    ("prose-same-line-after", f"{F}python\n{PY}\n{F} done", None),
    ("two-blocks", f"{F}python\n{PY}\n{F}\n{F}bash\n{SH}\n{F}", None),
    ("two-blocks-adjacent", f"{F}python\n{PY}\n{F}{F}python\n{PY}\n{F}", None),
    ("json", f'{F}json\n{{"a": 1}}\n{F}', None),
    ("yaml", f"{F}yaml\na: 1\n{F}", None),
    ("markdown", f"{F}markdown\n# title\n{F}", None),
    ("html", f"{F}html\n<b>x</b>\n{F}", None),
    ("text", f"{F}text\n{PY}\n{F}", None),
    ("console", f"{F}console\n$ {SH}\n{F}", None),
    ("untagged", f"{F}\n{PY}\n{F}", None),
    ("unknown-language", f"{F}ruby\nputs 1\n{F}", None),
    ("two-word-info", f"{F}python title=x\n{PY}\n{F}", None),
    ("unclosed", f"{F}python\n{PY}\n", None),
    ("unclosed-no-newline", f"{F}python\n{PY}", None),
    ("closing-fence-inline", f"{F}python\n{PY}{F}", None),
    ("single-line", f"{F}python {PY.replace(chr(10), ';')}{F}", None),
    ("nested-fence", f"{F}python\nx = '{F}'\n{PY}\n{F}", None),
    ("four-backticks", f"`{F}python\n{PY}\n{F}`", None),
    ("tilde-fence", f"~~~python\n{PY}\n~~~", None),
    ("extra-closing-fence", f"{F}python\n{PY}\n{F}\n{F}", None),
    ("blank-code", f"{F}python\n   \n{F}", None),
    ("empty-code", f"{F}python\n{F}", None),
    ("only-fence", F, None),
    ("empty", "", None),
    ("whitespace", " \n\t ", None),
]


@pytest.fixture(params=BACKENDS)
async def any_engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with open_backend(request, request.param, tmp_path) as engine:
        yield engine


@pytest.fixture
def executor(any_engine: BaseEngine) -> CodeExecutor:
    return CodeExecutor(any_engine, timeout=30)


@pytest.mark.parametrize(("reply", "language"), [(r, lang) for _, r, lang in TABLE], ids=[i for i, _, _ in TABLE])
async def test_trigger_rules(any_engine: BaseEngine, executor: CodeExecutor, reply: str, language: str | None) -> None:
    if language == "javascript" and shutil.which("node") is None:
        pytest.skip("node is not installed")
    outcome = await FencedCodeProcessor(executor).process(reply, execution_id="proc/table")
    if language is None:
        assert outcome is None
        with pytest.raises(WorkspaceNotFound):
            await any_engine.manager.get_workspace("proc/table")  # nothing ran, nothing was created
        return
    assert outcome is not None
    assert outcome.ok, outcome.result_event.content
    assert outcome.block.language == language
    assert (outcome.code_event.kind, outcome.code_event.content) == ("code_execution_code", reply)
    assert outcome.result_event.kind == "code_execution_result"
    printed = {"python": "ran python", "bash": "ran bash", "javascript": "ran js"}[language]
    assert printed in outcome.result_event.content
    assert "- out/ran (" in outcome.result_event.content
    ws = await any_engine.manager.get_workspace("proc/table")
    assert ws.host_path is not None and (ws.host_path / "out" / "ran").is_file()


def test_table_is_large_enough() -> None:
    assert len(TABLE) >= 20 and sum(lang is None for _, _, lang in TABLE) >= 20


def test_match_gives_the_canonical_language_and_verbatim_code(executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor)
    block = processor.match(f"\n{F}PY\n  indented\n\nlast\n{F}\n")
    assert block is not None and (block.language, block.code) == ("python", "  indented\n\nlast\n")
    ts = processor.match(f"{F}ts\nconsole.log(1)\n{F}")
    assert ts is not None and ts.language == "typescript"


async def test_disabled_processor_runs_nothing(any_engine: BaseEngine, executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor, enabled=False)
    reply = f"{F}python\n{PY}\n{F}"
    assert await processor.process(reply, execution_id="proc/off") is None
    with pytest.raises(WorkspaceNotFound):
        await any_engine.manager.get_workspace("proc/off")
    processor.enabled = True  # switched on later, per agent
    outcome = await processor.process(reply, execution_id="proc/off")
    assert outcome is not None and outcome.ok


async def test_language_allow_list_narrows_what_runs(any_engine: BaseEngine, executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor, languages=["python"])
    assert await processor.process(f"{F}bash\n{SH}\n{F}", execution_id="proc/narrow") is None
    with pytest.raises(WorkspaceNotFound):
        await any_engine.manager.get_workspace("proc/narrow")
    assert await processor.process(f"{F}python\n{PY}\n{F}", execution_id="proc/narrow") is not None


def test_data_languages_cannot_be_allowed(executor: CodeExecutor) -> None:
    for bad in (["json"], ["python", "markdown"], ["text"], [""], ["cobol"]):
        with pytest.raises(InvalidSpec):
            FencedCodeProcessor(executor, languages=bad)


async def test_custom_delimiters(executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor, delimiter=CodeBlockDelimiter("<run>", "</run>"))
    outcome = await processor.process(f"<run>python\n{PY}\n</run>")
    assert outcome is not None and "ran python" in outcome.result_event.content
    assert await processor.process(f"{F}python\n{PY}\n{F}") is None


async def test_result_event_keeps_the_budget_and_the_file_list(executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor, output_budget=1000)
    code = f"{PY}\nfor i in range(10000): print(i)"
    outcome = await processor.process(f"{F}python\n{code}\n{F}")
    assert outcome is not None and outcome.truncated
    text = outcome.result_event.content
    assert text.startswith("Code execution result:\nran python\n0\n1\n")
    assert "bytes omitted" in text and "9999\nOutput files:\n- out/ran (" in text
    assert len(text.encode()) < 1000 + 200


async def test_a_failing_block_is_a_result_and_an_executor_failure_is_reported(executor: CodeExecutor) -> None:
    processor = FencedCodeProcessor(executor)
    failed = await processor.process(f"{F}bash\necho oops >&2; exit 4\n{F}")
    assert failed is not None and not failed.ok and failed.error is None
    assert failed.result_event.content == "Code execution result:\noops\n[exit code 4]\n"
    await executor.close()
    broken = await processor.process(f"{F}bash\necho hi\n{F}")
    assert broken is not None and broken.result is None and not broken.ok
    assert broken.result_event.content.startswith("Code execution failed: ") and "closed" in (broken.error or "")
