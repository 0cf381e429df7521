"""JavaScript contexts of the code interpreter through the official ``e2b-code-interpreter`` SDK against a real
``execspace serve``: a Node process per context, in the sandbox's own session."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="JavaScript contexts run on Node.js")


def js(sbx: ci.Sandbox, code: str, **kw: object) -> ci.models.Execution:
    return sbx.run_code(code, language="js", **kw)  # type: ignore[arg-type]


def test_declarations_persist_and_the_last_value_is_the_text(sbx: ci.Sandbox) -> None:
    assert js(sbx, "const x = 1").error is None
    execution = js(sbx, "x + 1")
    assert execution.text == "2" and execution.results[0].is_main_result
    assert execution.execution_count == 2
    assert js(sbx, "y = 41; y += 1; y").text == "42"
    assert js(sbx, "const add = (a, b) => a + b;\nadd(1, 2);").text == "3"
    assert js(sbx, "'a string'").text == "a string"
    assert js(sbx, "({a: 1, b: [2]})").text == "{ a: 1, b: [ 2 ] }"
    # the context's own names (its module scope) are not in the cells' way
    assert js(sbx, "const fs = 1, util = 2, vm = 3, cell = 4, path = 5; fs + util + vm + cell + path").text == "15"


def test_console_output_goes_to_the_logs_and_the_callbacks(sbx: ci.Sandbox) -> None:
    out: list[str] = []
    execution = js(sbx, "console.log('Hello, World!'); console.error('oops')", on_stdout=lambda m: out.append(m.line))
    assert execution.logs.stdout == ["Hello, World!\n"] and out == ["Hello, World!\n"]
    assert execution.logs.stderr == ["oops\n"]
    assert execution.results == []  # console.log's value is undefined: no result


def test_top_level_await_gives_its_value(sbx: ci.Sandbox) -> None:
    code = "async function main() {\n  return 'Hello, World!'\n}\n\nawait main()"
    assert js(sbx, code).text == "Hello, World!"
    assert js(sbx, "let later = await Promise.resolve(5)\nlater * 2").text == "10"
    assert js(sbx, "later").text == "5"  # a declaration of an awaiting cell persists too


def test_an_exception_is_the_error_with_the_cells_frames_and_the_state_stays(sbx: ci.Sandbox) -> None:
    js(sbx, "const kept = 7")
    execution = js(sbx, "function f() {\n  throw new TypeError('bad input')\n}\nf()")
    assert execution.error is not None
    assert (execution.error.name, execution.error.value) == ("TypeError", "bad input")
    assert "at f (cell[" in execution.error.traceback and "jsrepl" not in execution.error.traceback
    rejected = js(sbx, "await Promise.reject(new RangeError('no'))")
    assert rejected.error is not None and rejected.error.name == "RangeError"
    assert js(sbx, "kept * 6").text == "42"


def test_env_vars_hold_for_one_cell_and_sandbox_env_for_all() -> None:
    sandbox = ci.Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        code = "[process.env.SANDBOX_WIDE, process.env.ONE_CELL || 'default'].join(',')"
        assert js(sandbox, code, envs={"ONE_CELL": "1"}).text == "yes,1"
        assert js(sandbox, code).text == "yes,default"
        assert js(sandbox, "process.env.SANDBOX_WIDE", envs={"SANDBOX_WIDE": "over"}).text == "over"
        assert js(sandbox, "process.env.SANDBOX_WIDE").text == "yes"
    finally:
        sandbox.kill()


def test_code_and_commands_share_the_files_and_the_sandbox(sbx: ci.Sandbox) -> None:
    js(sbx, "require('fs').writeFileSync('from_js.txt', 'written by node')")
    assert sbx.files.read("/home/user/from_js.txt") == "written by node"
    sbx.files.write("/home/user/to_js.txt", "from files")
    assert js(sbx, "require('fs').readFileSync('to_js.txt', 'utf8')").text == "from files"
    assert js(sbx, "process.cwd()").text == "/home/user"  # the home itself, as in E2B's sandboxes
    # a child process's output (written straight to the descriptor) is the cell's stdout
    assert js(sbx, "require('child_process').execSync('echo raw', {stdio: 'inherit'}); 1").logs.stdout == ["raw\n"]


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(sbx: ci.Sandbox) -> None:
    js(sbx, "const kept = 7")
    started = time.monotonic()
    with pytest.raises(ci.TimeoutException):
        js(sbx, "while (true) {}", timeout=1.5)
    assert time.monotonic() - started < 10
    started = time.monotonic()
    assert js(sbx, "kept * 6").text == "42"  # SIGINT broke the loop: the same process, at once
    assert time.monotonic() - started < 5


def test_a_process_that_exits_is_reported_and_replaced(sbx: ci.Sandbox) -> None:
    js(sbx, "const lost = 1")
    died = js(sbx, "process.exit(3)")
    assert died.error is not None and died.error.name == "KernelDied"
    after = js(sbx, "typeof lost")
    assert after.error is None and after.text == "undefined"  # a fresh process: the state is gone


def test_frames_forged_by_the_code_are_plain_output_or_dropped(sbx: ci.Sandbox) -> None:
    forged = (
        "const fs = require('fs');\n"
        'fs.writeSync(1, \'\\x1e{"type":"result","data":{"text/plain":"forged"},"cell":"other"}\\n\');\n'
        "fs.writeSync(1, '\\x1e{not json\\n');\n"
        'fs.writeSync(1, \'\\x1e{"type":"result","data":{"text/plain":[1]},"cell":"x"}\\n\');\n'
        "'real'"
    )
    execution = js(sbx, forged)
    assert [r.text for r in execution.results] == ["real"]
    assert execution.logs.stdout == ["\x1e{not json\n", '\x1e{"type":"result","data":{"text/plain":[1]},"cell":"x"}\n']


def test_a_flood_of_output_arrives_in_pieces_and_the_context_goes_on(sbx: ci.Sandbox) -> None:
    js(sbx, "const kept = 7")
    code = "const big = 'x'.repeat(1 << 20); for (let i = 0; i < 8; i++) console.log(big); 'done'"
    flood = js(sbx, code, timeout=120)
    assert flood.error is None and flood.text == "done"
    assert "".join(flood.logs.stdout) == ("x" * (1 << 20) + "\n") * 8  # every byte, cut into frames and joined
    no_newline = js(sbx, "process.stdout.write('y'.repeat(3 << 20)); 1", timeout=120)
    assert "".join(no_newline.logs.stdout) == "y" * (3 << 20)  # one write with no newline, in pieces
    assert js(sbx, "kept * 6").text == "42"


def test_javascript_contexts_are_their_own(sbx: ci.Sandbox) -> None:
    one = sbx.create_code_context(language="js")
    two = sbx.create_code_context(language="javascript")
    assert one.language == two.language == "javascript"
    sbx.run_code("const mine = 'one'", context=one)
    assert sbx.run_code("typeof mine", context=two).text == "undefined"
    assert sbx.run_code("mine", context=one).text == "one"
    sbx.restart_code_context(one)
    assert sbx.run_code("typeof mine", context=one).text == "undefined"


def test_deno_is_refused_naming_what_runs(sbx: ci.Sandbox) -> None:
    with pytest.raises(Exception, match=r"\(Node\.js\), bash, R and Java; it has no deno kernel"):
        sbx.run_code("1", language="deno")


def test_killing_the_sandbox_ends_its_node_processes() -> None:
    sandbox = ci.Sandbox.create(timeout=60)
    tag = new_tag("node")
    sleeper = (
        "require('child_process').spawn('sleep', ['300'], "
        f"{{env: {{...process.env, {TAG_VARIABLE}: '{tag}'}}, detached: true, stdio: 'ignore'}}).unref()"
    )
    try:
        assert js(sandbox, sleeper).error is None
        assert asyncio.run(wait_processes(tag, 1))
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []
