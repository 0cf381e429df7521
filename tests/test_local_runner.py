"""The local backend's process handling, with real processes: exit codes, environment,
stdin/stdout at scale, timeouts that kill whole trees, cancellation, rlimits, fd hygiene."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import (
    BaseEngine,
    CapabilityError,
    EnvPolicy,
    PathDenied,
    PutFile,
    ResourceLimits,
    RunProgramSpec,
    RunResult,
    Workspace,
    WorkspacePolicy,
)
from execspace.testing.processes import new_tag, tagged, wait_no_process

PY = sys.executable
MIB = 1024 * 1024
WORKSPACE_VARS = {
    "WORKSPACE_DIR",
    "WORK_DIR",
    "OUTPUT_DIR",
    "RUN_DIR",
    "SKILLS_DIR",
    "HOME",
    "TMPDIR",
    "TMP",
    "TEMP",
}


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


async def py(engine: BaseEngine, ws: Workspace, code: str, **kw: object) -> RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec(PY, ["-c", textwrap.dedent(code)], **kw))  # type: ignore[arg-type]


async def sh(engine: BaseEngine, ws: Workspace, script: str, **kw: object) -> RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("/bin/sh", ["-c", script], **kw))  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def dead(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` is gone (or a zombie) within ``within`` seconds: a process sent SIGKILL dies when the
    kernel next schedules it, which a loaded machine may delay past the moment its group's leader was reaped."""
    deadline = time.monotonic() + within
    while alive(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    return not alive(pid)


async def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} was never written")


def parse_env(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


# -- exit codes and streams -----------------------------------------------------------------------


@pytest.mark.parametrize(("script", "code"), [("exit 0", 0), ("exit 3", 3), ("exit 255", 255), ("kill -9 $$", -9)])
async def test_exit_codes(engine: BaseEngine, ws: Workspace, script: str, code: int) -> None:
    r = await sh(engine, ws, script)
    assert r.exit_code == code
    assert r.ok is (code == 0)
    assert r.signal == (9 if code == -9 else None)
    assert not r.timed_out and r.limit_hit is None


async def test_stdout_and_stderr_are_separate(engine: BaseEngine, ws: Workspace) -> None:
    r = await sh(engine, ws, "echo to-out; echo to-err >&2; echo more-out")
    assert r.stdout == "to-out\nmore-out\n"
    assert r.stderr == "to-err\n"
    assert r.stdout_total_bytes == len(r.stdout) and r.stderr_total_bytes == len(r.stderr)
    assert r.run_dir.startswith("runs/") and (host(ws) / r.run_dir).is_dir()


async def test_runs_in_work_dir_with_workspace_variables(engine: BaseEngine, ws: Workspace) -> None:
    r = await sh(engine, ws, 'pwd; echo "$WORKSPACE_DIR|$OUTPUT_DIR|$RUN_DIR|$HOME|$TMPDIR"')
    cwd, dirs = r.stdout.splitlines()
    root = str(host(ws))
    assert cwd == f"{root}/work"
    assert dirs == f"{root}|{root}/out|{root}/{r.run_dir}|{root}/home|{root}/tmp"


# -- environment policy -----------------------------------------------------------------------


@pytest.fixture
def host_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", "sk-host-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-host-secret")
    monkeypatch.setenv("MY_PLAIN_VAR", "plain")
    monkeypatch.setenv("MY_OTHER_VAR", "other")
    monkeypatch.setenv("LANG", "C.UTF-8")


async def env_seen(tmp_path: Path, policy: EnvPolicy | None, **spec: object) -> dict[str, str]:
    async with execspace.open_engine("local", workspace_root=tmp_path / "envws", env_policy=policy) as eng:
        ws = await eng.manager.create_workspace("env")
        r = await eng.runner.run_program(ws, RunProgramSpec("env", **spec))  # type: ignore[arg-type]
        assert r.exit_code == 0, r.stderr
        return parse_env(r.stdout)


@pytest.mark.usefixtures("host_env")
async def test_default_env_hides_secrets_and_non_core(tmp_path: Path) -> None:
    env = await env_seen(tmp_path, None)
    assert "MY_API_KEY" not in env and "GITHUB_TOKEN" not in env
    assert "sk-host-secret" not in "".join(env.values())
    assert "MY_PLAIN_VAR" not in env
    assert env["LANG"] == "C.UTF-8"
    assert env["HOME"].endswith("/home")
    assert env.keys() >= WORKSPACE_VARS


@pytest.mark.usefixtures("host_env")
async def test_inherit_all_still_drops_secrets(tmp_path: Path) -> None:
    env = await env_seen(tmp_path, EnvPolicy(inherit="all"))
    assert env["MY_PLAIN_VAR"] == "plain" and env["MY_OTHER_VAR"] == "other"
    assert "MY_API_KEY" not in env and "GITHUB_TOKEN" not in env
    everything = await env_seen(tmp_path, EnvPolicy(inherit="all", exclude_secrets=False))
    assert everything["MY_API_KEY"] == "sk-host-secret"


@pytest.mark.usefixtures("host_env")
async def test_inherit_none_and_core(tmp_path: Path) -> None:
    none = await env_seen(tmp_path, EnvPolicy(inherit="none"))
    assert set(none) == WORKSPACE_VARS | {"PATH", "EXECSPACE_RUN"}
    assert none["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    core = await env_seen(tmp_path, EnvPolicy(inherit="core"))
    assert core["PATH"] == os.environ["PATH"]
    assert "MY_PLAIN_VAR" not in core and core["LANG"] == "C.UTF-8"


@pytest.mark.usefixtures("host_env")
async def test_include_only_and_exclude_patterns(tmp_path: Path) -> None:
    only = await env_seen(tmp_path, EnvPolicy(inherit="all", include_only=["MY_PLAIN_*", "LANG"]))
    assert set(only) == WORKSPACE_VARS | {"PATH", "EXECSPACE_RUN", "MY_PLAIN_VAR", "LANG"}
    excluded = await env_seen(tmp_path, EnvPolicy(inherit="all", exclude=["MY_*_VAR"]))
    assert "MY_PLAIN_VAR" not in excluded and "MY_OTHER_VAR" not in excluded
    assert excluded["LANG"] == "C.UTF-8"
    # include_only cannot bring a secret back: secrets are dropped first
    sneaky = await env_seen(tmp_path, EnvPolicy(inherit="all", include_only=["MY_*"]))
    assert "MY_API_KEY" not in sneaky and sneaky["MY_PLAIN_VAR"] == "plain"


@pytest.mark.usefixtures("host_env")
async def test_policy_set_and_spec_env(tmp_path: Path) -> None:
    env = await env_seen(
        tmp_path, EnvPolicy(set={"A": "policy", "B": "policy"}), env={"B": "spec", "MY_API_KEY": "given"}
    )
    assert env["A"] == "policy" and env["B"] == "spec"
    assert env["MY_API_KEY"] == "given"  # passed on purpose by the caller


@pytest.mark.usefixtures("host_env")
async def test_clean_env_has_only_path_workspace_and_spec(tmp_path: Path) -> None:
    env = await env_seen(tmp_path, EnvPolicy(inherit="all", exclude_secrets=False), clean_env=True, env={"X": "1"})
    assert set(env) == WORKSPACE_VARS | {"PATH", "EXECSPACE_RUN", "X"}
    assert env["X"] == "1"


async def test_workspace_variables_win_over_spec_env(tmp_path: Path) -> None:
    env = await env_seen(
        tmp_path, None, env={"HOME": "/root", "WORKSPACE_DIR": "/", "OUTPUT_DIR": "/etc", "TMPDIR": "/"}
    )
    assert env["HOME"].endswith("/home") and env["HOME"] != "/root"
    assert env["WORKSPACE_DIR"] != "/" and env["OUTPUT_DIR"].endswith("/out") and env["TMPDIR"].endswith("/tmp")


# -- cwd and command resolution ---------------------------------------------------------------


@pytest.mark.parametrize("cwd", ["..", "../..", "work/../../..", "out/link"])
async def test_cwd_outside_workspace_is_refused(engine: BaseEngine, ws: Workspace, tmp_path: Path, cwd: str) -> None:
    (host(ws) / "out" / "link").symlink_to(tmp_path, target_is_directory=True)
    marker = tmp_path / "ran"
    with pytest.raises(PathDenied):
        await sh(engine, ws, f"touch {marker}", cwd=cwd)
    assert not marker.exists()


async def test_an_absolute_cwd_is_a_directory_of_the_host(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    """A local program is a program of the host: an absolute cwd is where it starts, as in a shell (a relative one
    stays in the workspace, above); nothing is made for it."""
    r = await sh(engine, ws, "pwd", cwd=str(tmp_path))
    assert (r.exit_code, r.stdout) == (0, f"{tmp_path}\n"), r.stderr
    assert not (host(ws) / str(tmp_path).lstrip("/")).exists()


async def test_symlinked_runs_dir_is_refused(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    r = await sh(engine, ws, f"rm -rf ../runs && ln -s {outside} ../runs")
    assert r.exit_code == 0, r.stderr
    with pytest.raises(PathDenied):
        await sh(engine, ws, "echo should not run")
    assert list(outside.iterdir()) == [], "a run directory was created through the planted link"


async def test_cwd_inside_is_created(engine: BaseEngine, ws: Workspace) -> None:
    r = await sh(engine, ws, "pwd", cwd="work/new/dir")
    assert r.stdout.strip() == f"{host(ws)}/work/new/dir"
    r = await sh(engine, ws, "pwd", cwd="")
    assert r.stdout.strip() == str(host(ws))


def make_tool(directory: Path, name: str, says: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tool = directory / name
    tool.write_text(f"#!/bin/sh\necho {says}\n")
    tool.chmod(0o755)


async def test_bare_command_uses_the_runs_path(
    engine: BaseEngine, ws: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tool(tmp_path / "runbin", "mytool", "from-run-path")
    make_tool(tmp_path / "parentbin", "mytool", "from-parent-path")
    make_tool(tmp_path / "parentbin", "onlyparent", "from-parent-path")
    monkeypatch.setenv("PATH", f"{tmp_path / 'parentbin'}:{os.environ['PATH']}")
    run_path = f"{tmp_path / 'runbin'}:/usr/bin:/bin"
    r = await engine.runner.run_program(ws, RunProgramSpec("mytool", env={"PATH": run_path}))
    assert r.stdout == "from-run-path\n"
    r = await engine.runner.run_program(ws, RunProgramSpec("onlyparent", env={"PATH": run_path}))
    assert r.exit_code == 127
    assert "onlyparent" in r.stderr and "not found" in r.stderr


async def test_missing_command_is_127(engine: BaseEngine, ws: Workspace) -> None:
    r = await engine.runner.run_program(ws, RunProgramSpec("no-such-command-xyz"))
    assert r.exit_code == 127
    assert "no-such-command-xyz" in r.stderr and "not found" in r.stderr
    with pytest.raises(FileNotFoundError):
        await engine.runner.start_program(ws, RunProgramSpec("no-such-command-xyz"))


async def test_missing_interpreter_is_127_with_a_clear_message(engine: BaseEngine, ws: Workspace) -> None:
    await engine.fs.put_files(ws, [PutFile("work/script", "#!/nonexistent/python9\nprint(1)\n", 0o755)])
    r = await engine.runner.run_program(ws, RunProgramSpec("./script"))
    assert r.exit_code == 127
    assert "./script" in r.stderr
    assert "interpreter" in r.stderr or "/nonexistent/python9" in r.stderr


async def test_not_executable_is_126(engine: BaseEngine, ws: Workspace) -> None:
    await engine.fs.put_files(ws, [PutFile("work/data.txt", "just data", 0o644)])
    r = await engine.runner.run_program(ws, RunProgramSpec("./data.txt"))
    assert r.exit_code == 126  # even root cannot exec a file without any x bit
    assert "data.txt" in r.stderr


# -- stdin and output at scale ------------------------------------------------------------------


async def test_huge_stdin_is_piped_byte_exact(engine: BaseEngine, ws: Workspace) -> None:
    data = os.urandom(50 * MIB)
    r = await sh(engine, ws, 'cat > "$OUTPUT_DIR/in.bin"', stdin=data, timeout=60)
    assert r.exit_code == 0, r.stderr
    written = (host(ws) / "out" / "in.bin").read_bytes()
    assert len(written) == len(data)
    assert hashlib.sha256(written).digest() == hashlib.sha256(data).digest()


@pytest.mark.parametrize("script", ["true", "sleep 0.3", "exec 0<&-; echo closed"])
async def test_program_ignoring_stdin_does_not_hang(engine: BaseEngine, ws: Workspace, script: str) -> None:
    async with asyncio.timeout(15):
        r = await sh(engine, ws, script, stdin=os.urandom(20 * MIB), timeout=10)
    assert r.exit_code == 0 and not r.timed_out
    assert r.duration < 5


async def test_str_stdin(engine: BaseEngine, ws: Workspace) -> None:
    r = await engine.runner.run_program(ws, RunProgramSpec("cat", stdin="héllo\n"))
    assert r.stdout == "héllo\n"


def peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


def reset_peak_rss() -> None:
    # "5" resets VmHWM to the current RSS, so earlier tests' peaks do not hide ours
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


async def test_output_flood_is_bounded(engine: BaseEngine, ws: Workspace) -> None:
    total = 1_000_000_000
    limit = 256 * 1024
    reset_peak_rss()
    before = peak_rss_bytes()
    r = await engine.runner.run_program(
        ws,
        RunProgramSpec("head", ["-c", str(total), "/dev/zero"], limits=ResourceLimits(output_bytes=limit), timeout=60),
    )
    growth = peak_rss_bytes() - before
    assert r.exit_code == 0 and not r.timed_out
    assert r.stdout_total_bytes == total
    assert r.stdout_truncated
    assert b"bytes omitted" in r.raw_stdout
    assert limit <= len(r.raw_stdout) <= limit + 100
    assert r.raw_stdout.startswith(b"\0" * 1000) and r.raw_stdout.endswith(b"\0" * 1000)
    assert growth < 200 * MIB, f"RSS grew by {growth / MIB:.0f} MiB"


async def test_stderr_flood_with_default_cap(engine: BaseEngine, ws: Workspace) -> None:
    r = await py(engine, ws, "import sys\nfor _ in range(40): sys.stderr.write('e' * 100_000)\nprint('done')")
    assert r.stdout == "done\n"
    assert r.stderr_total_bytes == 4_000_000 and r.stderr_truncated
    assert len(r.raw_stderr) <= 1024 * 1024 + 100


async def test_non_utf8_output(engine: BaseEngine, ws: Workspace) -> None:
    raw = b"ok \xff\xfe bad \xc3( end\n"
    r = await py(engine, ws, f"import sys; sys.stdout.buffer.write({raw!r})")
    assert r.raw_stdout == raw
    assert "\ufffd" in r.stdout and r.stdout.startswith("ok ") and r.stdout.endswith(" end\n")


# -- timeouts and leftovers ---------------------------------------------------------------------

DAEMON = """
import os, sys, time
print("before-timeout", flush=True)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        if sys.argv[2] == "close":
            for stream in (0, 1, 2):
                os.close(stream)  # let go of our pipes: only the run marker can find us now
        while True:
            os.write(fd, b"x")
            time.sleep(0.01)
    os._exit(0)
{tail}
"""


@pytest.mark.parametrize("pipes", ["close", "keep"])
async def test_timeout_kills_escaped_daemon_and_keeps_partial_output(
    engine: BaseEngine, ws: Workspace, tmp_path: Path, pipes: str
) -> None:
    log = tmp_path / "daemon.log"
    code = DAEMON.format(tail="time.sleep(60)")
    tag = new_tag("daemon")
    spec = RunProgramSpec(PY, ["-c", code, str(log), pipes], timeout=1.0, env=tagged(tag))
    r = await engine.runner.run_program(ws, spec)
    assert r.timed_out and r.limit_hit == "timeout"
    assert r.exit_code < 0
    assert "before-timeout" in r.stdout
    assert r.duration < 10
    assert log.exists()
    assert not wait_no_process(tag), "the daemon survived the run"
    assert not r.ok


@pytest.mark.parametrize("pipes", ["close", "keep"])
async def test_escaped_daemon_is_killed_after_normal_exit(
    engine: BaseEngine, ws: Workspace, tmp_path: Path, pipes: str
) -> None:
    log = tmp_path / "daemon.log"
    code = DAEMON.format(tail="time.sleep(0.3)")
    tag = new_tag("daemon")
    spec = RunProgramSpec(PY, ["-c", code, str(log), pipes], timeout=30, env=tagged(tag))
    r = await engine.runner.run_program(ws, spec)
    assert r.exit_code == 0 and not r.timed_out
    assert log.exists()
    assert not wait_no_process(tag), "the daemon survived the run"


async def test_background_child_is_killed_after_normal_exit(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    r = await sh(engine, ws, f"sleep 300 & echo $! > {pidfile}; echo main-done", timeout=30)
    assert r.exit_code == 0 and r.stdout == "main-done\n"
    assert r.duration < 5
    assert await dead(int(pidfile.read_text()))


async def test_background_child_holding_the_pipe_does_not_block(engine: BaseEngine, ws: Workspace) -> None:
    r = await sh(engine, ws, "(setsid sleep 300 &); echo started", timeout=30)
    assert r.exit_code == 0 and "started" in r.stdout
    assert r.duration < 5


# -- streaming handles --------------------------------------------------------------------------


async def test_stream_chunks_arrive_before_exit_and_stdin_round_trip(engine: BaseEngine, ws: Workspace) -> None:
    code = "import sys\nprint('ready', flush=True)\nline = sys.stdin.readline()\nprint(line.upper(), end='')"
    async with await engine.runner.start_program(ws, RunProgramSpec(PY, ["-c", code])) as h:
        chunks = h.stream()
        first = await asyncio.wait_for(anext(chunks), 10)
        # the program blocks on stdin, so this chunk came before exit
        assert first.stream == "stdout" and first.data == b"ready\n"
        await h.write_stdin("hello there\n")
        await h.close_stdin()
        rest = b"".join([c.data async for c in chunks if c.stream == "stdout"])
        result = await h.wait()
    assert rest == b"HELLO THERE\n"
    assert result.exit_code == 0
    assert result.stdout == "ready\nHELLO THERE\n"


async def test_stream_separates_stderr(engine: BaseEngine, ws: Workspace) -> None:
    async with await engine.runner.start_program(ws, RunProgramSpec("/bin/sh", ["-c", "echo o; echo e >&2"])) as h:
        got: dict[str, bytes] = {"stdout": b"", "stderr": b""}
        async for chunk in h.stream():
            got[chunk.stream] += chunk.data
        await h.wait()
    assert got == {"stdout": b"o\n", "stderr": b"e\n"}


async def test_stream_and_wait_from_different_tasks(engine: BaseEngine, ws: Workspace) -> None:
    code = "import time\nfor i in range(5):\n    print(i, flush=True)\n    time.sleep(0.05)"
    async with await engine.runner.start_program(ws, RunProgramSpec(PY, ["-c", code])) as h:
        first = asyncio.Event()

        async def consume() -> bytes:
            got = b""
            async for chunk in h.stream():
                got += chunk.data
                first.set()
            return got

        consumer = asyncio.create_task(consume())
        await asyncio.wait_for(first.wait(), 10)
        result = await h.wait()
        streamed = await asyncio.wait_for(consumer, 10)
    assert streamed == b"0\n1\n2\n3\n4\n" == result.raw_stdout


async def test_unstreamed_handle_output_does_not_block(engine: BaseEngine, ws: Workspace) -> None:
    code = "import sys\nfor _ in range(80): sys.stdout.write('y' * 65536)\nprint('end')"
    async with await engine.runner.start_program(ws, RunProgramSpec(PY, ["-c", code], timeout=20)) as h:
        result = await asyncio.wait_for(h.wait(), 20)
    assert result.exit_code == 0 and not result.timed_out
    assert result.stdout_total_bytes == 80 * 65536 + 4
    assert result.stdout.endswith("end\n")


async def test_kill_kills_the_tree(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    script = f"sleep 300 & echo $$ $! > {pids}; wait"
    async with await engine.runner.start_program(ws, RunProgramSpec("/bin/sh", ["-c", script])) as h:
        main, child = map(int, (await wait_for_file(pids)).split())
        assert h.pid == main and alive(main) and alive(child)
        await h.kill()
        result = await h.wait()
    assert result.exit_code < 0
    assert not alive(main) and await dead(child)  # the leader was reaped; its group was sent SIGKILL


async def test_leaving_the_handle_block_kills(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    async with await engine.runner.start_program(
        ws, RunProgramSpec("/bin/sh", ["-c", f"echo $$ > {pids}; sleep 300"])
    ) as h:
        main = int(await wait_for_file(pids))
    assert h.pid == main
    assert not alive(main)


async def test_cancelling_run_program_kills_the_process(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    task = asyncio.create_task(sh(engine, ws, f"sleep 300 & echo $$ $! > {pids}; wait", timeout=None))
    main, child = map(int, (await wait_for_file(pids)).split())
    assert alive(main) and alive(child)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # killed on the way out; on a loaded machine it may take a moment to be gone
    assert await dead(main)
    assert await dead(child)


async def test_cancelling_a_start_while_its_pipes_are_wired_kills_the_whole_group(
    engine: BaseEngine, ws: Workspace, tmp_path: Path
) -> None:
    """Cancelled after the program began but before asyncio connected its pipes (a loaded machine delays that):
    its group dies, the child holding its pipes too, and the cancellation returns instead of waiting for them."""
    pids = tmp_path / "pids"
    task = asyncio.create_task(sh(engine, ws, f"sleep 300 & echo $$ $! > {pids}; wait", timeout=None))
    while not _written(pids):
        await asyncio.sleep(0)  # one step of the start
        deadline = time.monotonic() + 0.2
        while not _written(pids) and time.monotonic() < deadline:
            time.sleep(0.005)  # the loop held up: the start stays where that step left it
    main, child = map(int, pids.read_text().split())
    task.cancel()
    try:
        done, _ = await asyncio.wait({task}, timeout=20)
        assert task in done and task.cancelled()
        assert await dead(main) and await dead(child)
    finally:
        for pid in (main, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _written(path: Path) -> bool:
    return path.exists() and path.read_text().endswith("\n")


# -- limits -----------------------------------------------------------------------------------


async def test_cpu_seconds_limit(engine: BaseEngine, ws: Workspace) -> None:
    r = await py(engine, ws, "while True: pass", limits=ResourceLimits(cpu_seconds=1), timeout=20)
    assert r.limit_hit == "cpu_seconds"
    assert r.exit_code != 0 and not r.timed_out
    assert r.duration < 10


async def test_file_size_limit(engine: BaseEngine, ws: Workspace) -> None:
    limits = ResourceLimits(file_size_bytes=MIB)
    r = await engine.runner.run_program(
        ws, RunProgramSpec("dd", ["if=/dev/zero", "of=../out/big", "bs=64K", "count=100"], limits=limits)
    )
    assert r.limit_hit == "file_size_bytes"
    assert r.exit_code != 0
    assert (host(ws) / "out" / "big").stat().st_size <= MIB
    # Python ignores SIGXFSZ: it gets EFBIG instead, but the file is still capped
    r = await py(engine, ws, "open('../out/big2', 'wb').write(b'x' * 3_000_000)", limits=limits)
    assert r.exit_code != 0
    assert (host(ws) / "out" / "big2").stat().st_size <= MIB


async def test_memory_limit(engine: BaseEngine, ws: Workspace) -> None:
    limits = ResourceLimits(memory_bytes=200 * MIB)
    r = await py(engine, ws, "b = bytearray(1024 ** 3); print('allocated')", limits=limits)
    assert r.exit_code != 0
    assert "allocated" not in r.stdout
    assert "MemoryError" in r.stderr
    ok = await py(engine, ws, "b = bytearray(10 * 1024 ** 2); print('allocated')", limits=limits)
    assert ok.exit_code == 0 and ok.stdout == "allocated\n"


@pytest.mark.parametrize(
    "spec",
    [
        RunProgramSpec("/bin/sh", ["-c", "touch ../ran"], limits=ResourceLimits(pids=10)),
        RunProgramSpec("/bin/sh", ["-c", "touch ../ran"], network="off"),
    ],
    ids=["pids", "network-off"],
)
async def test_unenforceable_requests_fail_before_running(
    engine: BaseEngine, ws: Workspace, spec: RunProgramSpec
) -> None:
    runs_before = os.listdir(host(ws) / "runs")
    with pytest.raises(CapabilityError):
        await engine.runner.run_program(ws, spec)
    with pytest.raises(CapabilityError):
        await engine.runner.start_program(ws, spec)
    assert not (host(ws) / "ran").exists()
    assert os.listdir(host(ws) / "runs") == runs_before


async def test_disk_limit(engine: BaseEngine) -> None:
    ws = await engine.manager.create_workspace("disk", WorkspacePolicy(max_disk_bytes=MIB))
    small = await sh(engine, ws, "head -c 1000 /dev/zero > ../out/small")
    assert small.limit_hit is None
    big = await sh(engine, ws, "head -c 2000000 /dev/zero > ../out/big")
    assert big.exit_code == 0
    assert big.limit_hit == "disk_bytes"


# -- concurrency and resource hygiene --------------------------------------------------------------


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_many_concurrent_runs_do_not_leak_fds(engine: BaseEngine, ws: Workspace) -> None:
    await engine.runner.run_program(ws, RunProgramSpec("/bin/true"))  # warm up the loop's machinery
    before = open_fds()
    results = await asyncio.gather(*(engine.runner.run_program(ws, RunProgramSpec("/bin/true")) for _ in range(200)))
    assert [r.exit_code for r in results] == [0] * 200
    assert len({r.run_dir for r in results}) == 200
    assert open_fds() == before


async def test_handles_do_not_leak_fds(engine: BaseEngine, ws: Workspace) -> None:
    await engine.runner.run_program(ws, RunProgramSpec("/bin/true"))
    before = open_fds()
    for _ in range(20):
        async with await engine.runner.start_program(ws, RunProgramSpec("/bin/sleep", ["30"])) as h:
            await h.kill()
    assert open_fds() == before


@pytest.fixture
async def quick_engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    async with execspace.open_engine("local", workspace_root=tmp_path / "q", kill_grace=0.2) as eng:
        yield eng


async def test_sigterm_ignoring_program_is_killed_after_grace(quick_engine: BaseEngine) -> None:
    ws = await quick_engine.manager.create_workspace("grace")
    code = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print('armed', flush=True)
        time.sleep(60)
        """
    r = await py(quick_engine, ws, code, timeout=1)
    assert r.timed_out and r.exit_code == -signal.SIGKILL
    assert r.stdout == "armed\n"
    assert r.duration < 5


async def test_runs_that_draw_the_same_run_dir_name_get_their_own(
    engine: BaseEngine, ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    import execspace.process.preparation as preparation

    names = iter(["runs/20260101T000000-aaaaaa", "runs/20260101T000000-aaaaaa", "runs/20260101T000000-bbbbbb"])
    monkeypatch.setattr(preparation, "new_run_name", lambda: next(names))
    first = await sh(engine, ws, 'echo one > "$RUN_DIR/n"')
    second = await sh(engine, ws, 'echo two > "$RUN_DIR/n"')
    assert (first.run_dir, second.run_dir) == ("runs/20260101T000000-aaaaaa", "runs/20260101T000000-bbbbbb")
    assert (host(ws) / first.run_dir / "n").read_text() == "one\n"
    assert (host(ws) / second.run_dir / "n").read_text() == "two\n"
