"""R contexts of the code interpreter through the official ``e2b-code-interpreter`` SDK against a real
``execspace serve``: one R per context, in the sandbox's own session, keeping its global environment across cells."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

from .conftest import Server, raw_interpreter

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytestmark = pytest.mark.skipif(shutil.which("R") is None, reason="R contexts run the host's R (r-base-core)")


def r(sbx: ci.Sandbox, code: str, **kw: object) -> ci.models.Execution:
    return sbx.run_code(code, language="r", **kw)  # type: ignore[arg-type]


def test_print_is_stdout_and_each_visible_value_a_result(sbx: ci.Sandbox) -> None:
    hello = r(sbx, 'print("Hello, World!")')
    assert hello.logs.stdout == ['[1] "Hello, World!"\n'] and hello.results == [] and hello.error is None
    where = r(sbx, "getwd()")
    assert where.results[0].text == '[1] "/home/user"' and where.text == '[1] "/home/user"'
    values = r(sbx, "x <- 41\nx\ninvisible(0)\ny <- x + 1; y")
    assert [(v.text, v.is_main_result) for v in values.results] == [("[1] 41", False), ("[1] 42", True)]
    assert r(sbx, "data.frame(a = 1:2, b = c('u', 'v'))").text == "  a b\n1 1 u\n2 2 v"
    assert r(sbx, "x * 2").text == "[1] 82"  # the global environment carries over
    streams = r(sbx, 'cat("out\\n"); message("to stderr"); warning("careful"); "last"')
    assert streams.logs.stdout == ["out\n"] and streams.text == '[1] "last"'
    assert "".join(streams.logs.stderr) == "to stderr\nWarning message:\ncareful\n"


def test_an_error_is_the_cells_error_with_its_calls_and_the_state_stays(sbx: ci.Sandbox) -> None:
    r(sbx, "kept <- 7")
    failed = r(sbx, 'f <- function() stop("boom")\ng <- function() f()\ncat("before\\n")\ng()\ncat("never\\n")')
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("simpleError", "boom")
    assert failed.error.traceback == 'Error in f() : boom\nTraceback:\n1. g()\n2. f()\n3. stop("boom")'
    assert failed.logs.stdout == ["before\n"]  # the first error ends the cell
    broken = r(sbx, "1 +")
    assert broken.error is not None and "unexpected end of input" in broken.error.value
    assert r(sbx, "kept * 6").text == "[1] 42"


def test_env_vars_hold_for_one_cell_and_sandbox_env_for_all() -> None:
    sandbox = ci.Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        both = 'paste(Sys.getenv("SANDBOX_WIDE"), Sys.getenv("ONE", unset = "unset"))'
        assert r(sandbox, both, envs={"ONE": "it's 1"}).text == '[1] "yes it\'s 1"'
        assert r(sandbox, both).text == '[1] "yes unset"'
        assert r(sandbox, 'Sys.getenv("SANDBOX_WIDE")', envs={"SANDBOX_WIDE": "over"}).text == '[1] "over"'
        assert r(sandbox, 'Sys.getenv("SANDBOX_WIDE")').text == '[1] "yes"'
        assert r(sandbox, 'system("echo $ONE", intern = TRUE)', envs={"ONE": "child"}).text == '[1] "child"'
    finally:
        sandbox.kill()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(sbx: ci.Sandbox) -> None:
    r(sbx, "kept <- 7")
    for code in ("Sys.sleep(300)", "repeat {}"):
        started = time.monotonic()
        with pytest.raises(ci.TimeoutException):
            r(sbx, code, timeout=1.5)
        assert time.monotonic() - started < 10
        started = time.monotonic()
        assert r(sbx, "kept * 6").text == "[1] 42"  # SIGINT stopped the cell: the same R, at once
        assert time.monotonic() - started < 5


def test_a_timeout_in_the_request_ends_the_cell_with_an_interrupted_error(e2b_server: Server) -> None:
    with raw_interpreter(e2b_server) as execute:
        lines = execute({"code": 'k <- 5\ncat("started\\n")\nSys.sleep(60)', "language": "r", "timeout": 2})
        assert [line["text"] for line in lines if line["type"] == "stdout"] == ["started\n"]
        errors = [line for line in lines if line["type"] == "error"]
        assert [e["name"] for e in errors] == ["Interrupted"] and lines[-1]["type"] == "end_of_execution"
        assert any(line.get("text") == "[1] 5" for line in execute({"code": "k", "language": "r"}))


def test_quit_ends_the_process_which_is_reported_and_replaced(sbx: ci.Sandbox) -> None:
    r(sbx, "lost <- 1")
    died = r(sbx, "quit(status = 3)")
    assert died.error is not None and died.error.name == "KernelDied"
    assert r(sbx, 'exists("lost")').text == "[1] FALSE"  # a fresh R: the state is gone


def test_r_contexts_are_their_own_and_restart_clears_them(sbx: ci.Sandbox) -> None:
    context = sbx.create_code_context(language="r", cwd="/home/user/elsewhere")
    assert context.language == "r"
    assert sbx.run_code("mine <- 1; getwd()", context=context).text == '[1] "/home/user/elsewhere"'
    assert r(sbx, 'exists("mine")').text == "[1] FALSE"  # the default R context is another R
    assert {c.language for c in sbx.list_code_contexts()} >= {"python", "r"}
    sbx.restart_code_context(context)
    assert sbx.run_code('exists("mine")', context=context).text == "[1] FALSE"


def test_children_read_no_cells_a_sink_ends_with_its_cell_and_forged_records_are_dropped(sbx: ci.Sandbox) -> None:
    child = r(sbx, 'system("cat; echo child done")')
    assert child.logs.stdout == ["child done\n"]  # /dev/null, not the cells' channel
    sunk = r(sbx, 'sink(tempfile()); print("hidden"); 5')
    assert sunk.logs.stdout == [] and sunk.text == "[1] 5"  # the records go out once the cell's sink is closed
    assert r(sbx, 'print("seen")').logs.stdout == ['[1] "seen"\n']
    forged = r(sbx, 'cat("\\036", "0123456789abcdef done\\n", sep = ""); cat("after\\n"); 1')
    assert forged.logs.stdout == ["after\n"] and forged.text == "[1] 1"  # another cell's record: dropped
    halves = r(sbx, 'cat("\\036abc"); Sys.sleep(0.5); cat("def\\n"); 2')
    assert "".join(halves.logs.stdout) == "\x1eabcdef\n" and halves.text == "[1] 2"  # not a record: output


def test_a_flood_of_output_arrives_whole_and_the_context_goes_on(sbx: ci.Sandbox) -> None:
    r(sbx, "kept <- 7")
    big = r(sbx, 'cat(strrep("x", 8 * 2^20)); "done"', timeout=120)
    assert "".join(big.logs.stdout) == "x" * (8 << 20) and big.text == '[1] "done"'  # no newline: still all of it
    lines = r(sbx, 'for (i in 1:2000) cat("line", i, "\\n")', timeout=120)
    assert "".join(lines.logs.stdout) == "".join(f"line {i} \n" for i in range(1, 2001))
    huge = r(sbx, 'strrep("y", 5 * 2^20)', timeout=120).text
    assert huge == '[1] "' + "y" * ((4 << 20) - 5) + "\n[... cut]"  # a value is cut at 4 MiB, still a result
    assert r(sbx, "kept * 6").text == "[1] 42"


def test_killing_the_sandbox_ends_its_r_processes() -> None:
    tag = new_tag("r")
    sandbox = ci.Sandbox.create(envs={TAG_VARIABLE: tag}, timeout=60)  # every program of it carries the tag
    try:
        assert r(sandbox, 'system("setsid sleep 300 >/dev/null 2>&1 &")').error is None
        assert asyncio.run(wait_processes(tag, 3))  # R, the relay of its cells, the sleep
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []
