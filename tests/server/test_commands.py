"""envd's process service through the official SDK: output, exit codes, env, cwd, background, stdin, kill."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from e2b import AsyncSandbox, CommandExitException, Sandbox
from e2b.exceptions import SandboxException, TimeoutException

from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process

from .conftest import running_server


def _sleeping(tag: str) -> list[int]:
    """The tagged ``sleep`` processes."""
    found = []
    for pid in pids_with(tag):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep\0"):
                found.append(pid)
    return found


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create(envs={"FROM_SANDBOX": "sandbox", "BOTH": "sandbox"})
    yield sandbox
    sandbox.kill()


@pytest.fixture
async def asbx() -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create()
    yield sandbox
    await sandbox.kill()


def test_stdout_stderr_and_exit_codes(sbx: Sandbox) -> None:
    result = sbx.commands.run("echo out; echo err >&2; printf '\\xff'")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "out\n\ufffd", "err\n")
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo before; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stdout == "before\n"
    streamed: list[str] = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=streamed.append)
    assert "".join(streamed) == "1\n2\n3\n"


def test_env_vars_of_the_sandbox_and_the_call(sbx: Sandbox) -> None:
    out = sbx.commands.run("echo $FROM_SANDBOX $BOTH $FROM_CALL", envs={"BOTH": "call", "FROM_CALL": "c"}).stdout
    assert out == "sandbox call c\n"


def test_a_login_shell_reads_the_sandboxes_profile_and_gets_what_e2b_programs_expect(sbx: Sandbox) -> None:
    script = (
        'shopt -q login_shell && echo login; echo "$PATH"; echo "$USER"; '
        'test -d "$HOME" && touch "$HOME/.w" && echo home; command -v ls python3; head -1 /etc/profile'
    )
    lines = sbx.commands.run(script).stdout.splitlines()
    assert lines[0] == "login" and lines[2] == "user" and lines[3] == "home", lines
    assert lines[1].split(":")[:3] == ["/usr/local/bin", "/usr/bin", "/bin"], lines  # Debian's, as E2B's images
    assert lines[4].endswith("/ls") and lines[5].endswith("/python3"), lines
    assert lines[6].startswith("# /etc/profile of execspace serve's sandboxes"), lines  # not the host's
    with pytest.raises(CommandExitException) as refused:  # the sandbox's own, read-only
        sbx.commands.run("echo x >> /etc/profile")
    # read-only; as a machine's user (root only here) it is root's file, which the user may not write either
    assert "Read-only file system" in refused.value.stderr or "Permission denied" in refused.value.stderr


def test_cwd_is_the_home_a_directory_under_it_or_one_of_the_sandbox(sbx: Sandbox) -> None:
    sbx.files.write("sub/marker.txt", "here")
    # the home is a directory where programs see it, not a link to another name: pwd and tools agree with E2B's
    assert sbx.commands.run("pwd; test -L /home/user || echo dir").stdout == "/home/user\ndir\n"
    assert sbx.commands.run("pwd; pwd -P", cwd="/home/user/sub").stdout == "/home/user/sub\n/home/user/sub\n"
    assert sbx.commands.run("pwd", cwd="~/sub/").stdout == "/home/user/sub\n"
    assert sbx.commands.run("cat marker.txt", cwd="/home/user/sub").stdout == "here"
    assert sbx.commands.run("cat sub/marker.txt").stdout == "here"  # the default cwd is the home
    assert sbx.commands.run("pwd", cwd="/etc").stdout == "/etc\n"  # the sandbox's own (read-only) /etc
    assert sbx.commands.run("cat /home/user/sub/marker.txt", cwd="/").stdout == "here"  # the home is there too
    with pytest.raises(CommandExitException) as missing:
        sbx.commands.run("pwd", cwd="/no/such/dir")
    assert missing.value.exit_code == 1 and "/no/such/dir" in missing.value.stderr


def test_background_wait_list_and_kill(sbx: Sandbox) -> None:
    quick = sbx.commands.run("sleep 0.2; echo done", background=True)
    assert quick.wait().stdout == "done\n"
    slow = sbx.commands.run("sleep 60", background=True)
    assert slow.pid in [p.pid for p in sbx.commands.list()]
    assert slow.kill() is True
    with pytest.raises(CommandExitException) as killed:
        slow.wait()
    assert killed.value.exit_code == -1
    assert slow.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(slow.pid) is False


def test_stdin_and_close_stdin(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat; echo end", background=True, stdin=True)
    sbx.commands.send_stdin(handle.pid, "line one\n")
    sbx.commands.send_stdin(handle.pid, b"\x00\x01 bytes\n")
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "line one\n\x00\x01 bytes\nend\n"


def test_stream_input_in_order(sbx: Sandbox) -> None:
    handle = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(handle.pid, (f"chunk {i}\n" for i in range(50)))
    sbx.commands.close_stdin(handle.pid)
    assert handle.wait().stdout == "".join(f"chunk {i}\n" for i in range(50))


def test_connect_follows_a_running_command(sbx: Sandbox) -> None:
    handle = sbx.commands.run("read x; echo got $x", background=True, stdin=True)
    again = sbx.commands.connect(handle.pid)
    sbx.commands.send_stdin(handle.pid, "it\n")
    assert again.wait().stdout == "got it\n"
    assert handle.wait().stdout == "got it\n"


def test_timeout_raises_and_the_sandbox_still_works(sbx: Sandbox) -> None:
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert sbx.commands.run("echo alive").stdout == "alive\n"


def test_a_sandbox_cannot_see_another_ones_processes(sbx: Sandbox) -> None:
    other = Sandbox.create()
    try:
        handle = sbx.commands.run("sleep 60", background=True)
        assert handle.pid not in [p.pid for p in other.commands.list()]
        assert other.commands.kill(handle.pid) is False
        assert handle.pid in [p.pid for p in sbx.commands.list()]
    finally:
        other.kill()


def test_killing_the_sandbox_ends_its_commands(sbx: Sandbox) -> None:
    tag = new_tag("serve-kill")
    sbx.commands.run("sleep 600", background=True, envs=tagged(tag))
    deadline = time.monotonic() + 10
    while not _sleeping(tag) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _sleeping(tag)
    sbx.kill()
    assert wait_no_process(tag) == []
    with pytest.raises(SandboxException):
        sbx.commands.run("true")


def test_pty_size_input_and_exit_code(sbx: Sandbox) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.send_stdin(terminal.pid, b"stty size; test -t 0 && echo on-a-tty; exit 7\n")
    received: list[bytes] = []
    with pytest.raises(CommandExitException) as ended:
        terminal.wait(on_pty=received.append)
    assert ended.value.exit_code == 7
    shown = b"".join(received)
    assert b"24 80\r\n" in shown and b"on-a-tty\r\n" in shown


def test_pty_resize_reaches_the_program(sbx: Sandbox) -> None:
    from e2b.sandbox.commands.command_handle import PtySize

    terminal = sbx.pty.create(PtySize(rows=24, cols=80))
    sbx.pty.resize(terminal.pid, PtySize(rows=33, cols=111))
    sbx.pty.send_stdin(terminal.pid, b"stty size; exit\n")
    received: list[bytes] = []
    terminal.wait(on_pty=received.append)
    assert b"33 111" in b"".join(received)
    assert sbx.pty.kill(terminal.pid) is False  # it has ended


async def test_async_commands(asbx: AsyncSandbox) -> None:
    result = await asbx.commands.run("echo $((6 * 7))")
    assert result.stdout == "42\n"
    with pytest.raises(CommandExitException):
        await asbx.commands.run("false")
    handle = await asbx.commands.run("cat", background=True, stdin=True)
    await asbx.commands.send_stdin(handle.pid, "async\n")
    await asbx.commands.close_stdin(handle.pid)
    assert (await handle.wait()).stdout == "async\n"


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_stopped_server_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: int) -> None:
    """Stopped as a user stops it (SIGTERM, Ctrl-C), the server kills every sandbox and removes its workspace;
    killed (SIGKILL), it leaves no process either (each session dies with its parent)."""
    tag = new_tag("serve-stop")
    with running_server(tmp_path / "ws") as server:
        for name, value in server.sdk_env().items():
            monkeypatch.setenv(name, value)
        sbx = Sandbox.create()
        sbx.commands.run("sleep 600 & sleep 600", background=True, envs=tagged(tag))
        deadline = time.monotonic() + 10
        while len(_sleeping(tag)) < 2 and time.monotonic() < deadline:  # bash -l's profile forks others briefly
            time.sleep(0.02)
        assert len(_sleeping(tag)) == 2
        server.process.send_signal(how)
        server.process.wait(timeout=20)
    assert wait_no_process(tag) == []
    if how != signal.SIGKILL:  # a killed server removes nothing; its sandboxes are gone all the same
        # the machine's seeds stay: shared by the servers on this root, the next one's sandboxes start on them
        left = [p for p in (tmp_path / "ws").rglob("*") if p.is_file() and ".machine-seeds" not in p.parts]
        assert not left, f"every workspace was removed: {left}"
