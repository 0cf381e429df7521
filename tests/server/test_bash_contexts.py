"""bash contexts of the code interpreter through the official ``e2b-code-interpreter`` SDK against a real
``execspace serve``: one bash per context, in the sandbox's own session, keeping its state across cells."""

from __future__ import annotations

import asyncio
import time

import pytest

from execspace.testing.processes import TAG_VARIABLE, new_tag, wait_no_process, wait_processes

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")


def sh(sbx: ci.Sandbox, code: str, **kw: object) -> ci.models.Execution:
    return sbx.run_code(code, language="bash", **kw)  # type: ignore[arg-type]


def out(execution: ci.models.Execution) -> str:
    """The cell's stdout (it comes in the pieces the shell's writes happened to be read in)."""
    return "".join(execution.logs.stdout)


def test_the_directory_variables_and_functions_carry_over_and_streams_stay_apart(sbx: ci.Sandbox) -> None:
    first = sh(sbx, 'mkdir -p work && cd work\ncount=41\ngreet() { echo "hello $1"; }\necho to-err >&2; pwd')
    assert first.error is None
    assert out(first) == "/home/user/work\n" and first.logs.stderr == ["to-err\n"]
    later = sh(sbx, "greet bash; echo $((count + 1)) $PWD; printf 'no newline'")
    assert out(later) == "hello bash\n42 /home/user/work\nno newline"
    assert later.logs.stderr == [] and later.results == []
    assert sbx.files.exists("/home/user/work")  # the shell's files are the sandbox's


def test_a_status_other_than_zero_is_the_error_and_the_shell_goes_on(sbx: ci.Sandbox) -> None:
    sh(sbx, "kept=yes")
    failed = sh(sbx, "echo before; ls /no/such/dir")
    assert failed.error is not None and (failed.error.name, failed.error.value) == ("ExitCode", "2")
    assert out(failed) == "before\n" and "No such file or directory" in "".join(failed.logs.stderr)
    broken = sh(sbx, "if then fi")
    assert broken.error is not None and broken.error.value == "2" and "syntax error" in "".join(broken.logs.stderr)
    assert sh(sbx, "(exit 7)").error.value == "7"  # type: ignore[union-attr]
    assert out(sh(sbx, "echo $kept")) == "yes\n"


def test_a_cell_reads_no_stdin_and_cannot_end_the_cell_by_forging_its_mark(sbx: ci.Sandbox) -> None:
    read = sh(sbx, 'cat; read -r line; echo "got [$line]"')
    assert out(read) == "got []\n"  # /dev/null, not the cells' channel
    forged = sh(sbx, "printf '\\036%s done 0\\n' 0123456789abcdef; echo after")
    assert "".join(forged.logs.stdout) == "after\n" and forged.error is None  # another cell's mark: dropped


def test_env_vars_hold_for_one_cell_and_sandbox_env_for_all() -> None:
    sandbox = ci.Sandbox.create(envs={"SANDBOX_WIDE": "yes"}, timeout=60)
    try:
        assert out(sh(sandbox, 'echo "$SANDBOX_WIDE,${ONE:-unset}"', envs={"ONE": "it's 1"})) == "yes,it's 1\n"
        assert out(sh(sandbox, 'echo "$SANDBOX_WIDE,${ONE:-unset}"')) == "yes,unset\n"
        assert out(sh(sandbox, "echo $SANDBOX_WIDE", envs={"SANDBOX_WIDE": "over"})) == "over\n"
        assert out(sh(sandbox, "echo $SANDBOX_WIDE")) == "yes\n"
    finally:
        sandbox.kill()


def test_a_cell_past_its_timeout_is_interrupted_and_the_state_kept(sbx: ci.Sandbox) -> None:
    sh(sbx, "kept=7")
    started = time.monotonic()
    with pytest.raises(ci.TimeoutException):
        sh(sbx, "sleep 300", timeout=1.5)
    assert time.monotonic() - started < 10
    assert out(sh(sbx, "echo $((kept * 6))")) == "42\n"  # SIGINT stopped the sleep: the same shell


def test_exit_ends_the_shell_which_is_reported_and_replaced(sbx: ci.Sandbox) -> None:
    sh(sbx, "lost=1")
    died = sh(sbx, "exit 3")
    assert died.error is not None and died.error.name == "KernelDied"
    assert out(sh(sbx, 'echo "[${lost-}]"')) == "[]\n"  # a fresh shell: the state is gone


def test_bash_contexts_are_their_own(sbx: ci.Sandbox) -> None:
    context = sbx.create_code_context(language="bash", cwd="/home/user/elsewhere")
    assert context.language == "bash"
    assert out(sbx.run_code("pwd; mine=1", context=context)) == "/home/user/elsewhere\n"
    assert out(sh(sbx, 'echo "[${mine-}]"; pwd')) == "[]\n/home/user\n"


def test_killing_the_sandbox_ends_its_shells() -> None:
    sandbox = ci.Sandbox.create(timeout=60)
    tag = new_tag("bash")
    try:
        assert sh(sandbox, f"{TAG_VARIABLE}={tag} setsid sleep 300 >/dev/null 2>&1 &").error is None
        assert asyncio.run(wait_processes(tag, 1))
    finally:
        sandbox.kill()
    assert wait_no_process(tag, within=10) == []
