"""workspace_exec and its session tools, on the local and the sandbox backend.

Every behaviour is observed through what the tool returns to the model and what the
host then finds in the workspace; policy-mode tests use the real CommandPolicy.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import execspace
from execspace import BaseEngine, Capabilities, InvalidSpec, PutFile, Workspace
from execspace.process.capture import HeadTailBuffer
from execspace.testing.processes import new_tag, wait_no_process
from execspace.tools.envscrub import EnvAllowList, dropped_names, scrub
from execspace.tools.schema import SCHEMA_KEYWORDS, InvalidArguments, ToolSpec, check_arguments
from execspace.tools.workspace_exec import WorkspaceExecTool, fit_output, normalize_cwd, split_budget
from tests import bindings

try:
    from execspace.tools.shellpolicy import CommandPolicy
except ImportError:  # written concurrently; policy tests wait for it
    CommandPolicy = None  # type: ignore[assignment,misc]

try:
    import jsonschema
except ImportError:
    jsonschema = None

pytestmark = pytest.mark.timeout(60)
needs_policy = pytest.mark.skipif(CommandPolicy is None, reason="execspace.tools.shellpolicy is not written yet")

any_engine = bindings.any_engine
WS_ID = "tools/user/exec"


@pytest.fixture
async def tool(any_engine: BaseEngine) -> AsyncIterator[WorkspaceExecTool]:
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID) as t:
        yield t


@pytest.fixture
async def ws(any_engine: BaseEngine) -> Workspace:
    return await any_engine.manager.create_workspace(WS_ID)


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


async def run(tool: WorkspaceExecTool, command: str, **args: Any) -> dict[str, Any]:
    result = await tool.call({"command": command, **args})
    json.dumps(result)  # whatever comes back must be JSON for the model
    return result


# -- foreground runs ---------------------------------------------------------------------


async def test_exit_code_streams_and_duration(tool: WorkspaceExecTool) -> None:
    r = await run(tool, "echo out; echo err >&2; exit 3")
    assert (r["status"], r["exit_code"], r["timed_out"]) == ("exited", 3, False)
    assert (r["stdout"], r["stderr"]) == ("out\n", "err\n")
    assert 0 <= r["duration_sec"] < 10
    assert "files" not in r and "stdout_truncated" not in r


async def test_missing_program_is_127_and_bash_features_work(tool: WorkspaceExecTool) -> None:
    r = await run(tool, "no-such-program-xyz")
    assert r["exit_code"] == 127 and "not found" in r["stderr"]
    r = await run(tool, "a=(1 2 3); echo ${#a[@]} $((6*7)); [[ x == x ]] && echo bash")
    assert r["stdout"] == "3 42\nbash\n"


async def test_starts_in_work_and_sees_workspace_variables(tool: WorkspaceExecTool, ws: Workspace) -> None:
    r = await run(tool, 'pwd; echo "$OUTPUT_DIR"')
    assert r["stdout"] == f"{ws.path}/work\n{ws.path}/out\n"


async def test_stdin_and_env_reach_the_command(tool: WorkspaceExecTool) -> None:
    r = await run(tool, 'tr a-z A-Z; echo "$GREETING-$OTHER"', stdin="abc\n", env={"GREETING": "hi", "OTHER": "x y"})
    assert r["stdout"] == "ABC\nhi-x y\n"


async def test_timeout_kills_and_keeps_partial_output(tool: WorkspaceExecTool) -> None:
    t0 = time.monotonic()
    r = await run(tool, "echo started; sleep 30; echo never", timeout_sec=1)
    assert r["timed_out"] is True and r["stdout"] == "started\n"
    assert time.monotonic() - t0 < 10


async def test_state_persists_between_calls(tool: WorkspaceExecTool) -> None:
    await run(tool, "echo 41 > n.txt")
    r = await run(tool, "echo $(( $(cat n.txt) + 1 ))")
    assert r["stdout"] == "42\n"


# -- output budget -----------------------------------------------------------------------


async def test_output_over_budget_keeps_head_and_tail_utf8_safe(any_engine: BaseEngine) -> None:
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID, output_budget=1000) as tool:
        # 3-byte characters: a naive byte cut would leave broken ones at both edges of the marker
        script = "import sys; sys.stdout.buffer.write(('BEGIN' + '€' * 5000 + 'END').encode())"
        r = await run(tool, f'python3 -c "{script}"')
    total = 5 + 3 * 5000 + 3
    assert r.get("stdout_truncated") is True and r["stdout_total_bytes"] == total, r
    text = r["stdout"]
    assert text.startswith("BEGIN€") and text.endswith("€END") and "\ufffd" not in text
    head, marker, tail = text.partition("\n[... execspace: ")
    omitted = int(marker and tail.split(" ", 1)[0])
    kept = len(head.encode()) + len(tail.split("...]\n", 1)[1].encode())
    assert kept <= 1000 and omitted == total - kept


async def test_budget_is_shared_between_streams(any_engine: BaseEngine) -> None:
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID, output_budget=1000) as tool:
        r = await run(tool, "head -c 50000 /dev/zero | tr '\\0' o; echo short-error >&2")
    assert r["stderr"] == "short-error\n" and "stderr_truncated" not in r
    assert r["stdout_total_bytes"] == 50000
    assert len(r["stdout"].encode()) + len(r["stderr"].encode()) < 1000 + 60  # the budget plus one marker


def test_split_budget() -> None:
    assert split_budget(100, 30, 20) == (30, 20)
    assert split_budget(100, 500, 20) == (80, 20)
    assert split_budget(100, 20, 500) == (20, 80)
    assert split_budget(100, 500, 500) == (50, 50)


# repeated text: long enough that the capture itself often cuts, with multi-byte characters at every edge
_streams = st.builds(lambda piece, n: (piece * n).encode(), st.text(max_size=40), st.integers(0, 300))


@given(data=_streams, limit=st.integers(min_value=1, max_value=400))
@example(data=("é" * 2000).encode(), limit=101)
def test_fit_output_of_a_capture_equals_one_cut_of_the_whole_stream(data: bytes, limit: int) -> None:
    # the tool cuts what the runner captured (2*budget + slack); that must be the same as cutting the whole stream
    capture = HeadTailBuffer(2 * limit + 64)
    capture.write(data)
    direct = HeadTailBuffer(limit)
    direct.write(data)
    assert fit_output(capture.getvalue(), len(data), limit) == direct.getvalue()


# -- cwd ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cwd", "expected"),
    [
        (None, "work"),
        ("", "work"),
        ("out", "out"),
        ("./work/sub/", "work/sub"),
        ("$OUTPUT_DIR/x", "out/x"),
        ("${RUN_DIR}", "runs"),
        ("skills/s", "skills/s"),
    ],
)
def test_normalize_cwd_accepts(cwd: str | None, expected: str) -> None:
    assert normalize_cwd(cwd) == expected


@pytest.mark.parametrize(
    "cwd",
    [".", "/", "/etc", "/workspace/work", "../x", "work/../..", "work/../../x", "work/*", "out/[ab]", "out/{a,b}",
     "src", "home", "tmp", "metadata.json", "$WORKSPACE_DIR", "work\\x", "work/\nx"],
)  # fmt: skip
async def test_bad_cwd_is_refused_and_nothing_runs(tool: WorkspaceExecTool, ws: Workspace, cwd: str) -> None:
    r = await run(tool, "touch $WORKSPACE_DIR/out/ran", cwd=cwd)
    assert r["status"] == "error" and r["error_type"] == "PathDenied", r
    assert not (host(ws) / "out" / "ran").exists()


async def test_cwd_runs_there(tool: WorkspaceExecTool, ws: Workspace) -> None:
    r = await run(tool, "pwd", cwd="$OUTPUT_DIR/deep/er")
    assert r["stdout"] == f"{ws.path}/out/deep/er\n"


async def test_cwd_through_a_planted_symlink_is_refused(tool: WorkspaceExecTool, tmp_path: Path) -> None:
    assert (await run(tool, "ln -s / escape"))["exit_code"] == 0
    r = await run(tool, "touch pwned-by-cwd", cwd="work/escape/tmp")
    assert r["status"] == "error" and r["error_type"] == "PathDenied"
    assert not Path("/tmp/pwned-by-cwd").exists()


# -- files under out/ --------------------------------------------------------------------


async def test_created_and_modified_files_under_out_are_listed(tool: WorkspaceExecTool, tmp_path: Path) -> None:
    r = await run(tool, 'echo a,b > "$OUTPUT_DIR/t.csv"; echo keep > "$OUTPUT_DIR/same.txt"; echo x > scratch.txt')
    assert r["files"] == [
        {"path": "out/same.txt", "size": 5, "mime_type": "text/plain", "change": "created"},
        {"path": "out/t.csv", "size": 4, "mime_type": "text/csv", "change": "created"},
    ]
    secret = tmp_path / "host-secret.txt"
    secret.write_text("s")
    secret.chmod(0o644)
    r = await run(
        tool,
        'echo a,c > "$OUTPUT_DIR/t.csv"; mkdir -p "$OUTPUT_DIR/d"; '
        'printf "\\x89PNG\\r\\n\\x1a\\n" > "$OUTPUT_DIR/d/p.png"; '
        f'ln -s {secret} "$OUTPUT_DIR/link"',
    )
    # same size rewrite is seen; the unchanged file and the symlink are not listed
    assert r["files"] == [
        {"path": "out/d/p.png", "size": 8, "mime_type": "image/png", "change": "created"},
        {"path": "out/t.csv", "size": 4, "mime_type": "text/csv", "change": "modified"},
    ]
    assert "files" not in await run(tool, "true")


async def test_out_replaced_by_a_symlink_lists_nothing(tool: WorkspaceExecTool, ws: Workspace) -> None:
    r = await run(tool, 'rm -rf "$OUTPUT_DIR" && ln -s /etc "$OUTPUT_DIR"; echo done')
    assert r["stdout"] == "done\n" and "files" not in r
    if tool.engine.name == "local":  # the sandbox does not even let the program replace out/ itself
        assert (host(ws) / "out").is_symlink()


async def test_many_new_files_are_counted_not_all_listed(tool: WorkspaceExecTool) -> None:
    r = await run(tool, 'for i in $(seq 1 60); do echo $i > "$OUTPUT_DIR/f$i"; done')
    assert len(r["files"]) == 50 and r["files_not_listed"] == 10


# -- arguments ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"command": ""},
        {"command": "   "},
        {"command": 5},
        {"command": "ls", "cwd": 3},
        {"command": "ls", "env": {"A": 1}},
        {"command": "ls", "env": ["A=1"]},
        {"command": "ls", "timeout_sec": 0},
        {"command": "ls", "timeout_sec": 10**6},
        {"command": "ls", "timeout_sec": True},
        {"command": "ls", "background": "yes"},
        {"command": "ls", "shell": "sh"},
        {"command": "a\0b"},
    ],
)
async def test_bad_arguments_are_errors_for_the_model(tool: WorkspaceExecTool, args: dict[str, Any]) -> None:
    r = await tool.call(args)
    assert r["status"] == "error" and r["error_type"] == "InvalidArguments", r
    assert r["error"]


async def test_invalid_env_name_is_an_error(tool: WorkspaceExecTool) -> None:
    r = await run(tool, "true", env={"A=B": "x"})
    assert r["status"] == "error" and "environment variable" in r["error"]


# -- policy mode -------------------------------------------------------------------------


@pytest.fixture
async def policy_tool(any_engine: BaseEngine) -> AsyncIterator[WorkspaceExecTool]:
    assert CommandPolicy is not None
    policy = CommandPolicy(allow=["echo", "printenv", "tr", "touch", "cat", "pwd"])
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID, policy=policy, env_allow=["GOOD_VALUE"]) as t:
        yield t


@needs_policy
async def test_policy_accepts_simple_pipelines(policy_tool: WorkspaceExecTool) -> None:
    r = await run(policy_tool, "echo 'hello world' | tr a-z A-Z && echo done", cwd="out")
    assert (r["exit_code"], r["stdout"]) == (0, "HELLO WORLD\ndone\n")
    assert "RESTRICTED" in policy_tool.spec.description and "printenv" in policy_tool.spec.description


@needs_policy
@pytest.mark.parametrize(
    ("command", "rule"),
    [
        ("touch $OUTPUT_DIR/ran", "variable-expansion"),
        ("touch ran; echo $(id)", "command-substitution"),
        ("touch ran > x", None),
        ("bash -c 'touch ran'", "builtin-deny"),
        ("touch ran; ls", "not-allowed"),
        ("touch ran &", None),
    ],
)
async def test_policy_rejects_and_nothing_runs(
    policy_tool: WorkspaceExecTool, ws: Workspace, command: str, rule: str | None
) -> None:
    r = await run(policy_tool, command)
    assert r["status"] == "error" and r["error_type"] == "CommandRejected", r
    assert r["rule"] == rule if rule else r["rule"]
    assert not (host(ws) / "work" / "ran").exists()


@needs_policy
async def test_policy_mode_scrubs_the_environment(policy_tool: WorkspaceExecTool, ws: Workspace) -> None:
    hijack = '#!/bin/sh\ntouch "$WORKSPACE_DIR/out/hijacked"\n'
    await policy_tool.engine.fs.put_files(
        ws,
        [PutFile("work/evil.sh", 'touch "$WORKSPACE_DIR/out/bash_env_ran"\n'), PutFile("work/printenv", hijack, 0o755)],
    )
    env = {
        "LD_PRELOAD": "/nonexistent/evil.so",
        "LD_LIBRARY_PATH": "/nonexistent",
        "BASH_ENV": f"{ws.path}/work/evil.sh",
        "ENV": f"{ws.path}/work/evil.sh",
        "BASH_FUNC_echo%%": "() { touch pwned; }",
        "SHELLOPTS": "xtrace",
        "PS4": "pwned",
        "PATH": f"{ws.path}/work",
        "IFS": "e",
        "GOOD_VALUE": "kept",
    }
    r = await run(policy_tool, "printenv", env=env)
    assert r["exit_code"] == 0, r
    seen = dict(line.split("=", 1) for line in r["stdout"].splitlines())
    assert seen["GOOD_VALUE"] == "kept"
    for name in ("LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV", "BASH_FUNC_echo%%", "SHELLOPTS", "PS4", "IFS"):
        assert name not in seen
    assert seen["PATH"] != f"{ws.path}/work" and seen["HOME"] == f"{ws.path}/home"
    assert r["env_dropped"] == sorted(set(env) - {"GOOD_VALUE"})
    assert not (host(ws) / "out" / "bash_env_ran").exists() and not (host(ws) / "out" / "hijacked").exists()
    assert r["stderr"] == ""  # no xtrace: SHELLOPTS did not arrive


@needs_policy
async def test_policy_mode_does_not_inherit_the_host_environment(
    policy_tool: WorkspaceExecTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")  # a core variable: inherited outside policy mode
    r = await run(policy_tool, "printenv")
    assert "LANG=" not in r["stdout"]
    if policy_tool.engine.name == "container":
        return  # containers never receive host variables, with a policy or without: nothing to contrast
    async with WorkspaceExecTool(policy_tool.engine, workspace_id=WS_ID) as free:
        assert "LANG=C.UTF-8" in (await run(free, "printenv"))["stdout"]


class NoCleanEnv:
    """A real engine whose capabilities say it cannot give a clean environment (one fact changed)."""

    def __init__(self, inner: BaseEngine) -> None:
        self._inner = inner
        self.name = inner.name
        self.manager = inner.manager
        self.fs = inner.fs
        self.runner = inner.runner

    def describe(self) -> Capabilities:
        return dataclasses.replace(self._inner.describe(), clean_env=False)

    async def aclose(self) -> None:
        await self._inner.aclose()


@needs_policy
async def test_policy_mode_fails_closed_without_clean_env(any_engine: BaseEngine, ws: Workspace) -> None:
    assert CommandPolicy is not None
    engine = NoCleanEnv(any_engine)
    assert isinstance(engine, execspace.Engine)
    async with WorkspaceExecTool(engine, workspace_id=WS_ID, policy=CommandPolicy(allow=["touch"])) as tool:
        r = await run(tool, "touch ran")
    assert r["status"] == "error" and r["error_type"] == "CapabilityError"
    assert "clean environment" in r["error"] and "Nothing was run" in r["error"]
    assert not (host(ws) / "work" / "ran").exists()
    # the same engine without a policy runs: the gate belongs to policy mode
    async with WorkspaceExecTool(engine, workspace_id=WS_ID) as tool:
        r = await run(tool, "touch ran")
        assert r["exit_code"] == 0, r
    assert (host(ws) / "work" / "ran").exists()


def test_scrub_drops_exactly_the_dangerous_names() -> None:
    env = {
        "OK": "1",
        "_also_ok2": "2",
        "HOME": "h",
        "LD_AUDIT": "x",
        "DYLD_INSERT_LIBRARIES": "x",
        "BASH_FUNC_ls%%": "x",
        "CDPATH": "x",
        "GLOBIGNORE": "x",
        "PROMPT_COMMAND": "x",
        "BASHOPTS": "x",
        "SHELL": "x",
        "1BAD": "x",
        "A-B": "x",
        "A\n": "x",
        "": "x",
        "ÄÖ": "x",
    }
    allow = EnvAllowList([n for n in env if n in ("OK", "_also_ok2")])
    assert scrub(env, allow) == {"OK": "1", "_also_ok2": "2"}
    assert dropped_names(env, allow) == sorted(set(env) - {"OK", "_also_ok2"})


# -- background sessions -----------------------------------------------------------------


async def start(tool: WorkspaceExecTool, command: str, **args: Any) -> str:
    r = await run(tool, command, background=True, **args)
    assert r["status"] == "running", r
    return str(r["session_id"])


async def poll_until_exited(tool: WorkspaceExecTool, sid: str, limit: float = 20) -> tuple[str, dict[str, Any]]:
    text = ""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        r = await tool.poll({"session_id": sid, "wait_ms": 1000})
        text += r["output"]
        if r["status"] != "running":
            return text, r
    raise AssertionError(f"session {sid} still running; output so far {text!r}")


async def test_background_returns_at_once_then_write_poll_and_exit(tool: WorkspaceExecTool) -> None:
    t0 = time.monotonic()
    sid = await start(tool, 'echo ready; while read -r line; do echo "got $line"; done; echo bye; exit 4')
    assert time.monotonic() - t0 < 5
    r = await tool.poll({"session_id": sid, "wait_ms": 5000})
    assert (r["status"], r["output"], r["offset"], r["next_offset"]) == ("running", "ready\n", 0, 6)
    r = await tool.write_stdin({"session_id": sid, "input": "one", "append_newline": True, "wait_ms": 5000})
    assert (r["output"], r["offset"], r["next_offset"]) == ("got one\n", 6, 14)
    r = await tool.poll({"session_id": sid, "wait_ms": 0})
    assert (r["status"], r["output"]) == ("running", "")
    r = await tool.write_stdin({"session_id": sid, "input": "two\n", "close_stdin": True, "wait_ms": 5000})
    text, last = await poll_until_exited(tool, sid) if r["status"] == "running" else ("", r)
    assert r["output"] + text == "got two\nbye\n"
    assert (last["status"], last["exit_code"], last["timed_out"]) == ("exited", 4, False)
    # read to the end: the session is gone
    gone = await tool.poll({"session_id": sid})
    assert gone["status"] == "error" and gone["error_type"] == "UnknownSession"
    assert tool.session_ids == []


async def test_session_reports_files_on_exit(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, 'sleep 0.2; echo r > "$OUTPUT_DIR/report.txt"')
    _, last = await poll_until_exited(tool, sid)
    assert last.get("files") == [{"path": "out/report.txt", "size": 2, "mime_type": "text/plain", "change": "created"}]


async def test_initial_stdin_of_a_background_session(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, "head -n 1", stdin="first line\n")
    text, last = await poll_until_exited(tool, sid)
    assert text == "first line\n" and last["exit_code"] == 0


async def test_kill_stops_the_whole_tree(tool: WorkspaceExecTool, ws: Workspace) -> None:
    tag = new_tag("late")  # in the shell's command line, and so in its forked subshell's
    sid = await start(tool, f": {tag}; (sleep 1; touch late-child) & sleep 1; touch late-main")
    await tool.poll({"session_id": sid, "wait_ms": 200})
    r = await tool.kill({"session_id": sid})
    assert r["status"] == "killed" and r["exit_code"] < 0
    assert tool.session_ids == []
    assert not wait_no_process(tag), "a shell of the killed session is left"
    assert not (host(ws) / "work" / "late-child").exists() and not (host(ws) / "work" / "late-main").exists()
    assert (await tool.kill({"session_id": sid}))["error_type"] == "UnknownSession"


async def test_tty_session_runs_on_a_terminal(tool: WorkspaceExecTool, any_engine: BaseEngine) -> None:
    command = '[ -t 0 ] && stty size; read -r x; echo "got $x"'
    if not any_engine.describe().pty:
        r = await run(tool, command, background=True, tty=True)
        assert r["status"] == "error" and r["error_type"] == "CapabilityError", r
        return
    sid = await start(tool, command, tty=True)
    r = await tool.poll({"session_id": sid, "wait_ms": 5000})
    assert r["output"] == "24 80\r\n", r
    r = await tool.write_stdin({"session_id": sid, "input": "hi", "append_newline": True, "wait_ms": 5000})
    text, last = await poll_until_exited(tool, sid) if r["status"] == "running" else ("", r)
    assert r["output"] + text == "hi\r\ngot hi\r\n"  # the terminal echoes the input
    assert last["exit_code"] == 0


async def test_a_signal_reaches_the_session_and_it_goes_on(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, 'trap "echo caught" INT; echo ready; while :; do sleep 0.05; done')
    assert (await tool.poll({"session_id": sid, "wait_ms": 5000}))["output"] == "ready\n"
    r = await tool.kill({"session_id": sid, "signal": "INT", "wait_ms": 5000})
    assert (r["status"], r["output"]) == ("running", "caught\n"), r
    r = await tool.kill({"session_id": sid})
    assert r["status"] == "killed" and tool.session_ids == []


async def test_session_timeout(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, "echo hi; sleep 30", timeout_sec=1)
    text, last = await poll_until_exited(tool, sid)
    assert text == "hi\n" and last["timed_out"] is True and last["status"] == "exited"


async def test_exited_unread_sessions_are_reaped_after_the_ttl(any_engine: BaseEngine) -> None:
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID, session_ttl=0.3) as tool:
        sid = await start(tool, "echo bye")
        keep = await start(tool, "sleep 30")
        await asyncio.sleep(1.5)  # "echo bye" exits at once; nobody reads it within the TTL
        assert sid in tool.session_ids  # reaping is lazy: the next call does it
        r = await tool.poll({"session_id": sid})
        assert r["error_type"] == "UnknownSession"
        assert tool.session_ids == [keep]  # running sessions are never reaped


async def test_poll_of_a_big_burst_keeps_head_and_tail(any_engine: BaseEngine) -> None:
    async with WorkspaceExecTool(any_engine, workspace_id=WS_ID, output_budget=1000) as tool:
        sid = await start(tool, "echo first; head -c 100000 /dev/zero | tr '\\0' z; echo; echo last; sleep 30")
        await asyncio.sleep(1.5)  # the burst lands before anyone looks
        r = await tool.poll({"session_id": sid, "wait_ms": 0})
        await tool.kill({"session_id": sid})
    assert r["output"].startswith("first\nzzz") and r["output"].endswith("zzz\nlast\n")
    assert r["output_truncated"] is True and r["next_offset"] == 6 + 100000 + 1 + 5
    assert len(r["output"].encode()) < 1000 + 60


async def test_utf8_split_across_polls_is_decoded_whole(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, "printf '\\xe2\\x82'; sleep 0.5; printf '\\xac!'")
    first = await tool.poll({"session_id": sid, "wait_ms": 300})
    text, _ = await poll_until_exited(tool, sid)
    assert first["output"] + text == "€!"


async def test_write_to_an_exited_session_says_so(tool: WorkspaceExecTool) -> None:
    sid = await start(tool, "echo done")
    await asyncio.sleep(1)
    r = await tool.write_stdin({"session_id": sid, "input": "x"})
    assert r["status"] == "exited" and r["output"] == "done\n" and "not sent" in r["note"]


async def test_session_limit_and_aclose_kills_everything(any_engine: BaseEngine, ws: Workspace) -> None:
    tool = WorkspaceExecTool(any_engine, workspace_id=WS_ID, max_sessions=2)
    tag = new_tag("session")  # in each shell's command line
    await start(tool, f": {tag}; sleep 1; touch survived-1")
    await start(tool, f": {tag}; sleep 1; touch survived-2")
    r = await run(tool, "true", background=True)
    assert r["status"] == "error" and "limit" in r["error"]
    await tool.aclose()
    assert tool.session_ids == []
    assert not wait_no_process(tag), "a shell of a closed session is left"
    assert not list((host(ws) / "work").glob("survived-*"))


async def test_sessions_belong_to_their_tool_instance(any_engine: BaseEngine) -> None:
    async with (
        WorkspaceExecTool(any_engine, workspace_id=WS_ID) as one,
        WorkspaceExecTool(any_engine, workspace_id=WS_ID) as two,
    ):
        sid = await start(one, "sleep 30")
        assert (await two.poll({"session_id": sid}))["error_type"] == "UnknownSession"
        assert (await one.kill({"session_id": sid}))["status"] == "killed"


async def test_dispatch_by_name_and_resolver(any_engine: BaseEngine, ws: Workspace) -> None:
    async def resolve() -> Workspace:
        return ws

    async with WorkspaceExecTool(any_engine, resolver=resolve, name_prefix="ws_") as tool:
        assert [t.spec.name for t in tool.tools()] == ["ws_exec", "ws_poll", "ws_write_stdin", "ws_kill"]
        r = await tool.dispatch("ws_exec", {"command": "echo via-dispatch", "background": True})
        assert "ws_poll" in r["hint"]
        text, _ = await poll_until_exited(tool, r["session_id"])
        assert text == "via-dispatch\n"
        unknown = await tool.dispatch("nope", {})  # a tool error is a result the model sees, never an exception
        assert unknown["status"] == "error" and unknown["error_type"] == "UsageError"
        assert "no tool named 'nope'" in unknown["error"] and "ws_exec" in unknown["error"]
        # OpenAI sends function.arguments as the JSON text of the object
        r = await tool.dispatch("ws_exec", '{"command": "echo from-json-text"}')
        assert (r["status"], r["exit_code"], r["stdout"]) == ("exited", 0, "from-json-text\n"), r
        bad = await tool.dispatch("ws_exec", '{"command": ')
        assert bad["error_type"] == "InvalidArguments" and "not JSON" in bad["error"]
    with pytest.raises(InvalidSpec):
        WorkspaceExecTool(any_engine)
    with pytest.raises(InvalidSpec):
        WorkspaceExecTool(any_engine, workspace_id="a", resolver=resolve)


# -- schemas -----------------------------------------------------------------------------


def specs() -> list[ToolSpec]:
    class Unused:  # specs are built without touching the engine
        pass

    tool = WorkspaceExecTool(Unused(), workspace_id="x")  # type: ignore[arg-type]
    return [t.spec for t in tool.tools()]


def test_renderings_for_openai_and_anthropic() -> None:
    for spec in specs():
        oa, an, flat = spec.openai(), spec.anthropic(), spec.openai_responses()
        assert oa == {"type": "function", "function": {"name": spec.name, "description": spec.description,
                                                       "parameters": spec.json_schema()}}  # fmt: skip
        assert an == {"name": spec.name, "description": spec.description, "input_schema": spec.json_schema()}
        assert flat["name"] == spec.name and flat["parameters"] == spec.json_schema()
        json.dumps([oa, an, flat])
        oa["function"]["parameters"]["properties"].clear()  # a caller's change does not reach the spec
        assert spec.parameters["properties"]


def _structural_check(schema: Mapping[str, Any]) -> None:
    """What a JSON-schema validator would refuse, for when jsonschema is not installed."""
    assert set(schema) <= SCHEMA_KEYWORDS
    assert schema.get("type") in (None, "object", "string", "integer", "number", "boolean", "array")
    for name, prop in schema.get("properties", {}).items():
        assert isinstance(name, str) and isinstance(prop.get("description", ""), str)
        _structural_check(prop)
    assert set(schema.get("required", ())) <= set(schema.get("properties", {}))
    if isinstance(schema.get("additionalProperties"), dict):
        _structural_check(schema["additionalProperties"])


GOOD: dict[str, list[dict[str, Any]]] = {
    "workspace_exec": [
        {"command": "ls"},
        {"command": "ls", "cwd": "out", "env": {"A": "b"}, "stdin": "", "timeout_sec": 2.5, "background": True},
    ],
    "workspace_poll": [{"session_id": "s-1"}, {"session_id": "s-1", "wait_ms": 0}],
    "workspace_write_stdin": [{"session_id": "s-1", "input": "x", "append_newline": True, "close_stdin": False}],
    "workspace_kill": [{"session_id": "s-1"}],
}
BAD: dict[str, list[dict[str, Any]]] = {
    "workspace_exec": [{}, {"command": "ls", "extra": 1}, {"command": "ls", "env": {"A": 2}}, {"command": 1}],
    "workspace_poll": [{}, {"session_id": "s", "wait_ms": -1}, {"session_id": "s", "wait_ms": 10**9}],
    "workspace_write_stdin": [{"session_id": "s"}, {"session_id": "s", "input": 3}],
    "workspace_kill": [{"session_id": ""}, {"session_id": "s", "signal": 9}],
}


def test_schemas_are_valid_and_agree_with_the_argument_check() -> None:
    for spec in specs():
        schema = spec.json_schema()
        if jsonschema is not None:
            jsonschema.Draft202012Validator.check_schema(schema)
        _structural_check(schema)
        for args in GOOD[spec.name]:
            check_arguments(schema, args)
            if jsonschema is not None:
                jsonschema.validate(args, schema)
        for args in BAD[spec.name]:
            with pytest.raises(InvalidArguments):
                check_arguments(schema, args)
            if jsonschema is not None:
                with pytest.raises(jsonschema.ValidationError):
                    jsonschema.validate(args, schema)


def test_check_arguments_fills_defaults_and_toolspec_refuses_bad_specs() -> None:
    schema = specs()[0].parameters
    assert check_arguments(schema, {"command": "ls"})["background"] is False
    with pytest.raises(InvalidArguments):
        check_arguments(schema, ["ls"])
    assert check_arguments(schema, '{"command": "ls"}') == check_arguments(schema, {"command": "ls"})
    for text in ('["ls"]', '"ls"', "not json"):
        with pytest.raises(InvalidArguments):
            check_arguments(schema, text)
    obj = {"type": "object", "properties": {}}
    with pytest.raises(InvalidSpec):
        ToolSpec("bad name", "d", obj)
    with pytest.raises(InvalidSpec):
        ToolSpec("ok", " ", obj)
    with pytest.raises(InvalidSpec):
        ToolSpec("ok", "d", {"type": "string"})
    with pytest.raises(InvalidSpec):
        ToolSpec("ok", "d", {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}})
    with pytest.raises(InvalidSpec):
        ToolSpec("ok", "d", {"type": "object", "properties": {}, "required": ["a"]})


def test_policy_mode_insists_on_the_proven_shell() -> None:
    class AllowAll:
        def check(self, command: str) -> list[list[str]]:
            return []

    with pytest.raises(InvalidSpec):
        WorkspaceExecTool(object(), workspace_id="x", policy=AllowAll(), shell=("sh", "-c"))  # type: ignore[arg-type]
    WorkspaceExecTool(object(), workspace_id="x", shell=("sh", "-c"))  # type: ignore[arg-type]
