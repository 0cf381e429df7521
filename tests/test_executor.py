"""The code executor over the local backend: real interpreters, real files."""

from __future__ import annotations

import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import execspace
from execspace import (
    BaseEngine,
    CapabilityError,
    CodeBlock,
    CodeBlockDelimiter,
    CodeExecutionInput,
    CodeExecutor,
    InvalidSpec,
    ResourceLimits,
    UsageError,
    extract_code_blocks,
)

HAS_NODE = shutil.which("node") is not None
HAS_TS_RUNTIME = any(shutil.which(p) for p in ("deno", "tsx", "bun"))


@pytest.fixture
async def local_engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        yield eng


@pytest.fixture
def executor(local_engine: BaseEngine) -> CodeExecutor:
    return CodeExecutor(local_engine, timeout=30.0)


def run_input(*blocks: tuple[str, str], execution_id: str | None = None) -> CodeExecutionInput:
    return CodeExecutionInput([CodeBlock(lang, code) for lang, code in blocks], execution_id=execution_id)


# -- extract_code_blocks ------------------------------------------------------------------


def test_extract_finds_every_block_with_trimmed_language_and_verbatim_body() -> None:
    text = "intro\n```python  \nprint(1)\n  x = 2\n```\nmiddle\n```\necho hi\n```\n```bash\nls```"
    blocks = extract_code_blocks(text)
    assert blocks == [
        CodeBlock("python", "print(1)\n  x = 2\n"),
        CodeBlock("", "echo hi\n"),
        CodeBlock("bash", "ls"),
    ]


def test_extract_needs_a_newline_after_the_opening_fence_and_a_closing_fence() -> None:
    assert extract_code_blocks("```python print(1)```") == []
    assert extract_code_blocks("```python\nprint(1)\n") == []


def test_inline_fences_on_a_line_do_not_open_a_block() -> None:
    text = "use ```x``` inline\n```py\nprint(2)\n```"
    assert extract_code_blocks(text) == [CodeBlock("py", "print(2)\n")]


def test_extract_handles_crlf() -> None:
    blocks = extract_code_blocks("text\r\n```python\r\nprint(1)\r\nprint(2)\r\n```\r\n")
    assert blocks == [CodeBlock("python", "print(1)\r\nprint(2)\r\n")]


def test_extract_with_custom_delimiters_matches_them_literally() -> None:
    delim = CodeBlockDelimiter(start="<<(run)", end="(end)>>")
    text = "a <<(run)bash\necho .*\n(end)>> b <<(run)py\nprint(1)(end)>> ```python\nno\n```"
    assert extract_code_blocks(text, delim) == [CodeBlock("bash", "echo .*\n"), CodeBlock("py", "print(1)")]


def _closes_exactly(code: str) -> bool:
    return (code + "```").find("```") == len(code)


_block = st.tuples(
    st.text(st.characters(exclude_characters="\n`"), max_size=12),
    st.text(max_size=40).filter(_closes_exactly),
)
_prose = st.text(st.characters(exclude_characters="`"), max_size=20)


@given(st.lists(st.tuples(_prose, st.sampled_from(["\n", "", " "]), _block), max_size=4), _prose)
def test_rendered_blocks_are_extracted_back(parts: list[tuple[str, str, tuple[str, str]]], tail: str) -> None:
    text = "".join(f"{prose}{sep}```{lang}\n{code}```" for prose, sep, (lang, code) in parts) + tail
    expected = [CodeBlock(lang.strip(), code) for _, _, (lang, code) in parts]
    assert extract_code_blocks(text) == expected


def test_empty_delimiter_is_refused() -> None:
    with pytest.raises(InvalidSpec):
        CodeBlockDelimiter(start="")


# -- running blocks -------------------------------------------------------------------------


async def test_python_and_bash_blocks_run_in_order_in_work(executor: CodeExecutor) -> None:
    result = await executor.execute_code(
        run_input(
            ("python", "import os\nprint('py', os.path.basename(os.getcwd()))"),
            ("bash", "echo bash $((6 * 7))"),
        )
    )
    assert [b.exit_code for b in result.blocks] == [0, 0]
    assert result.output == "py work\nbash 42\n"
    assert result.ok


async def test_program_gets_its_source_by_workspace_path(executor: CodeExecutor, local_engine: BaseEngine) -> None:
    ws = await local_engine.manager.create_workspace("paths")
    result = await executor.execute_code(run_input(("python", "import sys\nprint(sys.argv[0])"), execution_id="paths"))
    src = result.blocks[0].stdout.strip()
    assert src.startswith(f"{ws.path}/src/code_") and src.endswith("_0.py")
    assert Path(src).read_text() == "import sys\nprint(sys.argv[0])"


@pytest.mark.parametrize(
    ("tag", "code", "expected"),
    [
        ("py", "print('a')", "a\n"),
        ("Python3", "print('b')", "b\n"),
        ("sh", "echo c", "c\n"),
        ("shell", "echo d", "d\n"),
        ("python {.class title=x}", "print('e')", "e\n"),
        pytest.param(
            "js",
            "console.log(1 + 1)",
            "2\n",
            marks=pytest.mark.skipif(not HAS_NODE, reason="node is not installed on this host"),
        ),
    ],
)
async def test_language_aliases(executor: CodeExecutor, tag: str, code: str, expected: str) -> None:
    result = await executor.execute_code(run_input((tag, code)))
    assert result.blocks[0].error is None
    assert result.blocks[0].stdout == expected


async def test_unknown_language_is_an_error_block_and_the_next_block_runs(executor: CodeExecutor) -> None:
    result = await executor.execute_code(run_input(("cobol", "DISPLAY 'X'."), ("python", "print('after')")))
    bad, good = result.blocks
    assert bad.exit_code == 127 and bad.error is not None
    assert "'cobol' is not supported" in bad.error and "python" in bad.error
    assert good.exit_code == 0 and good.stdout == "after\n"
    assert "cobol" in result.output and result.output.endswith("after\n")
    assert not result.ok


async def test_untagged_block_is_refused_with_a_hint(executor: CodeExecutor) -> None:
    result = await executor.execute_code(run_input(("", "print(1)")))
    assert result.blocks[0].exit_code == 127
    assert "no language tag" in (result.blocks[0].error or "")


@pytest.mark.skipif(HAS_TS_RUNTIME, reason="a TypeScript runtime is installed here")
async def test_typescript_without_runtime_gives_a_clear_error(executor: CodeExecutor) -> None:
    result = await executor.execute_code(run_input(("ts", "console.log(1)"), ("sh", "echo next")))
    error = result.blocks[0].error or ""
    assert "no runtime for typescript" in error and "deno" in error and "'local'" in error
    assert result.blocks[0].exit_code == 127
    assert result.blocks[1].stdout == "next\n"


async def test_failing_block_keeps_stderr_and_notes_the_exit_code(executor: CodeExecutor) -> None:
    result = await executor.execute_code(
        run_input(("bash", "echo out; echo 'line 1 of err' >&2; echo 'line 2 of err' >&2; exit 3"))
    )
    block = result.blocks[0]
    assert block.exit_code == 3
    assert block.stderr == "line 1 of err\nline 2 of err\n"
    assert result.output == "out\nline 1 of err\nline 2 of err\n[exit code 3]\n"


async def test_state_persists_for_one_execution_id(executor: CodeExecutor) -> None:
    first = await executor.execute_code(
        run_input(("python", "open('state.txt', 'w').write('41')"), execution_id="sess")
    )
    assert first.ok
    second = await executor.execute_code(
        run_input(("python", "print(int(open('state.txt').read()) + 1)"), execution_id="sess")
    )
    assert second.output == "42\n"


async def test_fresh_ids_share_nothing_and_leave_nothing(executor: CodeExecutor, tmp_path: Path) -> None:
    await executor.execute_code(run_input(("bash", "echo x > state.txt; echo x > $OUTPUT_DIR/o.txt")))
    second = await executor.execute_code(run_input(("bash", "cat state.txt")))
    assert second.blocks[0].exit_code != 0
    assert "No such file" in second.blocks[0].stderr
    assert second.output_files == ()
    assert list((tmp_path / "ws").iterdir()) == []  # both turn workspaces were removed


async def test_output_files_are_listed_with_content_and_the_text_is_kept(executor: CodeExecutor) -> None:
    code = (
        "import os\n"
        "out = os.environ['OUTPUT_DIR']\n"
        "os.makedirs(out + '/sub', exist_ok=True)\n"
        "open(out + '/report.csv', 'w').write('a,b\\n1,2\\n')\n"
        "open(out + '/sub/data.bin', 'wb').write(bytes(range(5)))\n"
        "print('wrote files')\n"
    )
    result = await executor.execute_code(run_input(("python", code)))
    assert result.output == "wrote files\n"
    files = {f.name: f for f in result.output_files}
    assert set(files) == {"out/report.csv", "out/sub/data.bin"}
    assert files["out/report.csv"].content == b"a,b\n1,2\n"
    assert files["out/report.csv"].mime_type == "text/csv"
    assert files["out/sub/data.bin"].content == bytes(range(5))
    rendered = str(result)
    assert "wrote files" in rendered and "out/report.csv" in rendered


async def test_only_files_new_or_changed_by_the_call_are_listed(executor: CodeExecutor) -> None:
    await executor.execute_code(
        run_input(("bash", "echo 1 > $OUTPUT_DIR/same.txt; echo 1 > $OUTPUT_DIR/kept.txt"), execution_id="files")
    )
    # same.txt is rewritten with the same size: it must still count as changed
    second = await executor.execute_code(
        run_input(("bash", "echo 2 > $OUTPUT_DIR/same.txt; echo n > $OUTPUT_DIR/new.txt"), execution_id="files")
    )
    assert {f.name: f.content for f in second.output_files} == {"out/same.txt": b"2\n", "out/new.txt": b"n\n"}
    third = await executor.execute_code(run_input(("bash", "true"), execution_id="files"))
    assert third.output_files == ()


async def test_repeated_calls_in_one_workspace_keep_their_own_sources(
    executor: CodeExecutor, local_engine: BaseEngine
) -> None:
    for n in range(2):
        await executor.execute_code(run_input(("python", f"print({n})"), execution_id="src"))
    ws = await local_engine.manager.create_workspace("src")
    sources = sorted(p.read_text() for p in (Path(ws.path) / "src").iterdir())
    assert sources == ["print(0)", "print(1)"]


async def test_timeout_keeps_partial_output_and_later_blocks_run(local_engine: BaseEngine) -> None:
    executor = CodeExecutor(local_engine, timeout=1.0)
    code = "import time\nprint('before', flush=True)\ntime.sleep(30)\nprint('after')"
    started = time.monotonic()
    result = await executor.execute_code(run_input(("python", code), ("sh", "echo next")))
    assert time.monotonic() - started < 15
    slow, nxt = result.blocks
    assert slow.timed_out and slow.stdout == "before\n"
    assert "timed out after 1s" in result.output
    assert result.output.startswith("before\n")
    assert nxt.stdout == "next\n"
    assert not result.ok


async def test_crlf_code_runs_in_bash(executor: CodeExecutor) -> None:
    blocks = extract_code_blocks('```bash\r\nx=crlf\r\necho "$x"\r\n```\r\n')
    result = await executor.execute_code(CodeExecutionInput(blocks))
    assert result.output == "crlf\n"


async def test_custom_delimiters_end_to_end(executor: CodeExecutor) -> None:
    text = "<execute>python\nprint('custom')\n</execute>"
    blocks = extract_code_blocks(text, CodeBlockDelimiter("<execute>", "</execute>"))
    result = await executor.execute_code(CodeExecutionInput(blocks))
    assert result.output == "custom\n"


async def test_non_utf8_output_is_replaced_not_fatal(executor: CodeExecutor) -> None:
    code = "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe end\\n')\nsys.stderr.buffer.write(b'\\xc3\\n')"
    result = await executor.execute_code(run_input(("python", code)))
    assert result.blocks[0].stdout == "ok \ufffd\ufffd end\n"
    assert result.output == "ok \ufffd\ufffd end\n\ufffd\n"


async def test_no_blocks_gives_empty_output(executor: CodeExecutor) -> None:
    result = await executor.execute_code(CodeExecutionInput([]))
    assert result.output == "" and result.blocks == () and result.ok


# -- construction and lifetime ------------------------------------------------------------


async def test_limits_the_engine_cannot_enforce_fail_before_running(local_engine: BaseEngine) -> None:
    with pytest.raises(CapabilityError, match="pids"):
        CodeExecutor(local_engine, limits=ResourceLimits(pids=10))


async def test_enforced_limits_apply_to_blocks(local_engine: BaseEngine) -> None:
    executor = CodeExecutor(local_engine, limits=ResourceLimits(output_bytes=1000))
    result = await executor.execute_code(run_input(("python", "print('x' * 100_000)")))
    assert len(result.blocks[0].stdout) < 2000
    assert "omitted" in result.blocks[0].stdout


async def test_close_closes_only_an_owned_engine(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path) as eng:
        await CodeExecutor(eng).close()
        assert eng.manager is not None  # still open
        owning = CodeExecutor(eng, owns_engine=True)
        await owning.close()
        with pytest.raises(UsageError):
            _ = eng.manager
        with pytest.raises(UsageError, match="closed"):
            await owning.execute_code(run_input(("sh", "true")))


async def test_code_executor_opens_its_engine_lazily_and_closes_it(tmp_path: Path) -> None:
    ex = execspace.code_executor("local", workspace_root=tmp_path / "lazy", timeout=20)
    assert ex.engine is None
    result = await ex.execute_code(run_input(("py", "print('lazy')")))
    assert result.output == "lazy\n"
    engine = ex.engine
    assert engine is not None and engine.name == "local"
    await ex.close()
    with pytest.raises(UsageError):
        _ = engine.manager


async def test_code_executor_as_async_context_manager(tmp_path: Path) -> None:
    async with execspace.code_executor("local", workspace_root=tmp_path) as ex:
        assert ex.engine is not None
        result = await ex.execute_code(run_input(("sh", "echo ctx"), execution_id="c"))
        assert result.output == "ctx\n"
        engine = ex.engine
    with pytest.raises(UsageError):
        _ = engine.manager


def test_executor_needs_an_engine_or_an_opener() -> None:
    with pytest.raises(UsageError):
        CodeExecutor()


def test_blocks_back_to_back_on_one_line() -> None:
    delim = CodeBlockDelimiter("<execute>", "</execute>")
    text = "<execute>bash\nls</execute><execute>py\nprint(1)</execute>"
    assert extract_code_blocks(text, delim) == [CodeBlock("bash", "ls"), CodeBlock("py", "print(1)")]


def test_an_unclosed_fence_yields_nothing_quickly() -> None:
    started = time.monotonic()
    assert extract_code_blocks("<s>x\n" * 20_000, CodeBlockDelimiter("<s>", "</s>")) == []
    assert time.monotonic() - started < 2


async def test_executor_runs_over_another_engine_with_its_own_path_view(tmp_path: Path) -> None:
    from execspace.registry import probe_backend

    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox backend unavailable: {probe.reason}")
    from tests.support import make_traversable

    make_traversable(tmp_path)  # the sandbox uid must traverse down to the workspace
    async with execspace.code_executor("sandbox", workspace_root=tmp_path, timeout=30) as ex:
        assert ex.engine is not None
        ws = await ex.engine.manager.create_workspace("sb")
        code = "import os, sys\nprint(sys.argv[0])\nopen(os.environ['OUTPUT_DIR'] + '/s.txt', 'w').write('S')"
        result = await ex.execute_code(run_input(("python", code), ("sh", "pwd"), execution_id="sb"))
    lines = result.output.splitlines()
    assert lines[0].startswith(f"{ws.path}/src/code_") and lines[1] == f"{ws.path}/work"
    assert [(f.name, f.content) for f in result.output_files] == [("out/s.txt", b"S")]


async def test_unchanged_outputs_are_listed_not_read(
    executor: CodeExecutor, local_engine: BaseEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changes are found by the listing (size, mtime): only new or changed files are read, never the rest."""
    ws = await local_engine.manager.create_workspace("listed")
    await local_engine.fs.put_files(ws, [execspace.PutFile(f"out/old{i}.txt", b"x" * 100) for i in range(50)])
    read: list[str] = []
    collect = local_engine.fs.collect

    async def counting_collect(ws: execspace.Workspace, patterns: object, **caps: int) -> list[execspace.File]:
        files = await collect(ws, patterns, **caps)  # type: ignore[arg-type]
        read.extend(f.name for f in files)
        return files

    monkeypatch.setattr(local_engine.fs, "collect", counting_collect)
    result = await executor.execute_code(
        run_input(("bash", "echo n > $OUTPUT_DIR/new.txt; echo y > $OUTPUT_DIR/old7.txt"), execution_id="listed")
    )
    assert sorted(f.name for f in result.output_files) == ["out/new.txt", "out/old7.txt"]
    assert sorted(read) == ["out/new.txt", "out/old7.txt"]


# -- engines with kernels (SupportsKernels) --------------------------------------------------


class _PythonKernels:
    """Kernels that answer python blocks themselves: where the executor sends a block shows in its text."""

    def __init__(self) -> None:
        self.blocks: list[str] = []

    def handles(self, tag: str) -> bool:
        return tag.split()[0] in ("python", "py")

    async def run_block(
        self,
        ws: execspace.Workspace,
        block: CodeBlock,
        index: int,
        *,
        timeout: float | None,
        limits: ResourceLimits,
    ) -> tuple[execspace.BlockResult, str]:
        self.blocks.append(block.code)
        return execspace.BlockResult(index, block.language, 0, "kernel\n", "", 0.0), "kernel\n"


async def test_blocks_of_the_kernels_language_go_to_the_engines_kernels(local_engine: BaseEngine) -> None:
    assert not isinstance(local_engine, execspace.SupportsKernels)  # the plain engine has none
    kernels = _PythonKernels()
    parts = (local_engine.manager, local_engine.fs, local_engine.runner, local_engine.describe())
    engine = execspace.KernelEngine("local", *parts, kernels)
    assert isinstance(engine, execspace.SupportsKernels) and isinstance(engine.kernels, execspace.Kernels)
    result = await CodeExecutor(engine, timeout=30.0).execute_code(run_input(("python", "x = 1"), ("bash", "echo sh")))
    assert result.ok and result.output == "kernel\nsh\n"
    assert kernels.blocks == ["x = 1"]  # bash ran as a program
