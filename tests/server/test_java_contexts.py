"""Java contexts of the code interpreter through the official ``e2b-code-interpreter`` SDK against a real
``execspace serve``: one JVM per context, in the sandbox's own session, whose JShell keeps its declarations."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from execspace.server.javacontext import java_missing
from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

from .conftest import Server, raw_interpreter, running_server

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")
pytestmark = pytest.mark.skipif(java_missing() is not None, reason=f"Java contexts need a JDK: {java_missing()}")


def java(sbx: ci.Sandbox, code: str, **kw: object) -> ci.models.Execution:
    return sbx.run_code(code, language="java", **kw)  # type: ignore[arg-type]


def test_each_write_is_a_piece_of_stdout_and_the_last_expression_the_result(sbx: ci.Sandbox) -> None:
    hello = java(sbx, 'System.out.println("Hello, World!")')
    assert hello.logs.stdout == ["Hello, World!", "\n"] and hello.results == [] and hello.error is None
    assert java(sbx, 'System.getProperty("user.dir")').text == "/home/user"
    assert java(sbx, "int x = 41;").results == []  # a declaration has no value to show
    assert java(sbx, "x + 1").text == "42"
    declared = java(sbx, "int twice(int n) { return 2 * n; }\nrecord Point(int x, int y) {}\ntwice(x)")
    assert declared.text == "82" and declared.results[0].is_main_result
    assert java(sbx, "new Point(1, 2)").text == "Point[x=1, y=2]"  # the value's toString()
    assert java(sbx, "new int[] {1, 2}").text == "int[2] { 1, 2 }"  # an array as jshell shows it
    assert java(sbx, '"a \\"quoted\\" string"').text == 'a "quoted" string'
    assert java(sbx, "List.of(1, 2).stream().map(n -> n * 10).collect(Collectors.toList())").text == "[10, 20]"
    assert java(sbx, "null").results == []
    err = java(sbx, 'System.err.print("to stderr"); 1')
    assert err.logs.stderr == ["to stderr"] and err.text == "1"


def test_an_exception_or_a_compile_error_is_the_cells_error_and_the_state_stays(sbx: ci.Sandbox) -> None:
    java(sbx, "int kept = 7;\nint divide(int a) { return 10 / a; }")
    thrown = java(sbx, 'System.out.println("before");\ndivide(0);\nSystem.out.println("never");')
    assert thrown.error is not None and (thrown.error.name, thrown.error.value) == ("ArithmeticException", "/ by zero")
    assert thrown.error.traceback.startswith("java.lang.ArithmeticException: / by zero\n\tat divide (#")
    assert "".join(thrown.logs.stdout) == "before\n"  # the first error ends the cell
    rejected = java(sbx, "int y = undefinedName;")
    assert rejected.error is not None and rejected.error.name == "CompilationException"
    assert "cannot find symbol" in rejected.error.value and "undefinedName" in rejected.error.traceback
    incomplete = java(sbx, "int z = (")
    assert incomplete.error is not None and incomplete.error.name == "IncompleteSourceException"
    assert java(sbx, "kept * 6").text == "42"


def test_env_vars_are_system_properties_for_one_cell_and_the_sandbox_env_for_all() -> None:
    sandbox = ci.Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        both = 'System.getProperty("SANDBOX_WIDE") + "," + System.getProperty("ONE", "unset")'
        assert java(sandbox, both, envs={"ONE": "it's 1"}).text == "yes,it's 1"
        assert java(sandbox, both).text == "yes,unset"
        assert java(sandbox, 'System.getProperty("SANDBOX_WIDE")', envs={"SANDBOX_WIDE": "over"}).text == "over"
        assert java(sandbox, 'System.getProperty("SANDBOX_WIDE")').text == "yes"
        assert java(sandbox, 'System.getenv("SANDBOX_WIDE")').text == "yes"  # the process's environment too
    finally:
        sandbox.kill()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(sbx: ci.Sandbox) -> None:
    java(sbx, "int kept = 7;")
    for code in ("Thread.sleep(300_000)", "while (true) {}"):
        with pytest.raises(ci.TimeoutException):
            java(sbx, code, timeout=3)
        assert java(sbx, "kept * 6", timeout=30).text == "42"  # SIGINT stopped the snippet: the same JVM


def test_a_timeout_in_the_request_ends_the_cell_with_an_interrupted_error(e2b_server: Server) -> None:
    with raw_interpreter(e2b_server) as execute:
        assert not [line for line in execute({"code": "int k = 5;", "language": "java"}) if line["type"] == "error"]
        body = {"code": 'System.out.println("started"); Thread.sleep(60_000);', "language": "java", "timeout": 2}
        lines = execute(body)
        assert [line["text"] for line in lines if line["type"] == "stdout"] == ["started", "\n"]
        errors = [line for line in lines if line["type"] == "error"]
        assert [e["name"] for e in errors] == ["Interrupted"] and lines[-1]["type"] == "end_of_execution"
        assert any(line.get("text") == "5" for line in execute({"code": "k", "language": "java"}))


def test_system_exit_ends_the_jvm_which_is_reported_and_replaced(sbx: ci.Sandbox) -> None:
    java(sbx, "int lost = 1;")
    died = java(sbx, "System.exit(3)")
    assert died.error is not None and died.error.name == "KernelDied"
    gone = java(sbx, "lost")
    assert gone.error is not None and gone.error.name == "CompilationException"  # a fresh JVM: the state is gone


def test_java_contexts_are_their_own_and_restart_clears_them(sbx: ci.Sandbox) -> None:
    context = sbx.create_code_context(language="java", cwd="/home/user/elsewhere")
    assert context.language == "java"
    java(sbx, 'String mine = "default";')
    assert sbx.run_code('System.getProperty("user.dir")', context=context).text == "/home/user/elsewhere"
    assert sbx.run_code('String mine = "own"; mine', context=context).text == "own"
    assert java(sbx, "mine").text == "default"  # the default Java context is another JVM
    assert {c.language for c in sbx.list_code_contexts()} >= {"python", "java"}
    sbx.restart_code_context(context)
    assert sbx.run_code("mine", context=context).error is not None


def test_forged_records_are_dropped_or_plain_output(sbx: ci.Sandbox) -> None:
    raw = "new java.io.FileOutputStream(java.io.FileDescriptor.out)"
    forged = java(sbx, f'var raw = {raw};\nraw.write("\\u001e0123456789abcdef done\\n".getBytes());\n"real"')
    assert forged.logs.stdout == [] and forged.text == "real"  # another cell's record: dropped
    plain = java(sbx, 'raw.write("\\u001enot a record\\n".getBytes()); 2')
    assert plain.logs.stdout == ["\x1enot a record\n"] and plain.text == "2"


def test_a_flood_of_output_arrives_whole_in_pieces_and_the_context_goes_on(sbx: ci.Sandbox) -> None:
    java(sbx, "int kept = 7;")
    big = java(sbx, 'System.out.print("x".repeat(8 << 20)); "done"', timeout=120)
    assert "".join(big.logs.stdout) == "x" * (8 << 20) and big.text == "done"  # one write, cut into records
    lines = java(sbx, 'for (int i = 0; i < 2000; i++) System.out.println("line " + i);', timeout=120)
    assert "".join(lines.logs.stdout) == "".join(f"line {i}\n" for i in range(2000))
    huge = java(sbx, '"y".repeat(5 << 20)', timeout=120).text
    assert huge == "y" * (4 << 20) + "\n[... cut]"  # a value is cut at 4 MiB, still a result
    assert java(sbx, "kept * 6").text == "42"


def test_killing_the_sandbox_ends_its_jvms() -> None:
    tag = new_tag("java")
    sandbox = ci.Sandbox.create(envs={TAG_VARIABLE: tag}, timeout=60)  # every program of it carries the tag
    try:
        spawn = 'new ProcessBuilder("setsid", "sleep", "300").start(); 1'
        assert java(sandbox, spawn).text == "1"
        assert asyncio.run(wait_processes(tag, 2))  # the JVM and its sleep
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []


def test_a_jvm_fits_the_sandboxs_memory_and_cpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A limited sandbox's JVM sizes itself by the limits, not the host: its heap is at most half the sandbox's
    memory, so that a cell that wants more gets Java's OutOfMemoryError, never the sandbox's OOM killer."""
    if os.geteuid() != 0:
        pytest.skip("a sandbox's processes are limited together by a cgroup, made as root")
    flags = ("--sandbox-memory-mb", "384", "--sandbox-pids", "64", "--sandbox-cpus", "1")
    with running_server(tmp_path / "ws", *flags) as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        sandbox = ci.Sandbox.create(timeout=120)
        try:
            assert int(java(sandbox, "Runtime.getRuntime().maxMemory()", timeout=60).text) <= 192 * 2**20
            assert java(sandbox, "Runtime.getRuntime().availableProcessors()").text == "1"
            hog = java(sandbox, "long[] big = new long[64 * 1024 * 1024]; big.length")  # 512 MB
            assert hog.error is not None and hog.error.name == "OutOfMemoryError"
            assert java(sandbox, '"alive"').text == "alive"  # the same JVM goes on
            assert sandbox.commands.run("echo alive").stdout == "alive\n"
        finally:
            sandbox.kill()
