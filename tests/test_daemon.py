"""The warm daemon (`execspace daemon`): a command run through it behaves exactly as one run in-process.

Every test here runs the real console script against a real daemon process on a private
socket, and compares with the same command under EXECSPACE_DAEMON=off.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from execspace.cli.daemonwire import (
    KEY_BYTES,
    PROTOCOL,
    daemon_key_path,
    daemon_socket_path,
    encode_request,
    private_dir_ok,
    read_key,
)
from execspace.cli.forkserver import _HANDSHAKE_TIMEOUT, SourceStamp, decode_request
from execspace.cli.launcher import forward
from tests.support import CLI, daemon_served, running_daemon

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the daemon's tests use /proc and SO_PEERCRED")


@pytest.fixture
def daemon() -> Iterator[dict[str, str]]:
    """The environment of a caller that reaches a fresh daemon of its own."""
    with running_daemon() as env:
        yield env


def _both(
    env: dict[str, str], args: list[str], cwd: Path, stdin: bytes = b""
) -> tuple[subprocess.CompletedProcess[bytes], subprocess.CompletedProcess[bytes]]:
    before = daemon_served(env)
    warm = subprocess.run([*CLI, *args], env=env, cwd=cwd, input=stdin, capture_output=True, timeout=60)
    assert daemon_served(env) == before + 1, "the command did not go through the daemon"
    here = {**env, "EXECSPACE_DAEMON": "off"}
    cold = subprocess.run([*CLI, *args], env=here, cwd=cwd, input=stdin, capture_output=True, timeout=60)
    return warm, cold


def test_run_through_daemon_is_the_same_as_in_process(daemon: dict[str, str], tmp_path: Path) -> None:
    script = 'echo "out x=$X"; echo err >&2; cat; ls inputs; exit 7'
    (tmp_path / "data.txt").write_text("staged")
    args = ["run", "--backend", "local", "--env", "X=1", "--input", "data.txt", "--", "sh", "-c", script]
    warm, cold = _both(daemon, args, cwd=tmp_path, stdin=b"from stdin\n")
    assert warm.returncode == cold.returncode == 7
    assert warm.stdout == cold.stdout == b"out x=1\nfrom stdin\ndata.txt\n"  # our cwd resolved data.txt
    assert warm.stderr == cold.stderr
    assert b"err\n" in warm.stderr


def test_sandbox_denials_hold_through_the_daemon(daemon: dict[str, str], tmp_path: Path) -> None:
    warm, cold = _both(daemon, ["run", "--backend", "sandbox", "--", "cat", "/etc/shadow"], cwd=tmp_path)
    assert warm.returncode == cold.returncode != 0
    assert b"root:" not in warm.stdout
    assert warm.stderr == cold.stderr


def test_usage_errors_and_help_keep_their_status(daemon: dict[str, str], tmp_path: Path) -> None:
    warm, cold = _both(daemon, ["run", "--bogus"], cwd=tmp_path)
    assert warm.returncode == cold.returncode == 125
    assert warm.stderr == cold.stderr
    warm, cold = _both(daemon, ["run", "--help"], cwd=tmp_path)
    assert warm.returncode == cold.returncode == 0
    assert warm.stdout == cold.stdout


def _start_sleeper(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[bytes], int]:
    pid_file = tmp_path / "pid"
    script = f"echo $$ > {pid_file}; exec sleep 60"
    proc = subprocess.Popen([*CLI, "run", "--backend", "local", "--", "sh", "-c", script], env=env, cwd=tmp_path)
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "the program never started"
        time.sleep(0.05)
    return proc, int(pid_file.read_text())


def _gone(pid: int, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_ctrl_c_is_forwarded_and_kills_the_program(daemon: dict[str, str], tmp_path: Path) -> None:
    proc, pid = _start_sleeper(daemon, tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert _gone(pid), "the program outlived the interrupted command"


def test_a_killed_caller_takes_its_program_down(daemon: dict[str, str], tmp_path: Path) -> None:
    proc, pid = _start_sleeper(daemon, tmp_path)
    proc.kill()  # no chance to forward anything: the worker sees the connection close
    proc.wait(timeout=10)
    assert _gone(pid), "the program outlived its caller"


def test_stop_removes_the_socket_and_commands_run_in_process(daemon: dict[str, str], tmp_path: Path) -> None:
    assert subprocess.run([*CLI, "daemon", "stop"], env=daemon, check=False).returncode == 0
    assert not Path(daemon_socket_path(daemon)).exists()
    assert subprocess.run([*CLI, "daemon", "status"], env=daemon, capture_output=True).returncode == 1
    done = subprocess.run([*CLI, "run", "--backend", "local", "--", "echo", "hi"], env=daemon, capture_output=True)
    assert (done.returncode, done.stdout) == (0, b"hi\n")


def test_a_directory_others_can_enter_is_never_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="xdg", dir="/tmp"))
    try:
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
        monkeypatch.delenv("EXECSPACE_DAEMON", raising=False)
        path = Path(daemon_socket_path())
        path.parent.mkdir(mode=0o755)
        path.parent.chmod(0o755)
        assert not private_dir_ok(str(path.parent))
        assert forward(["run", "--", "true"]) is None  # not even tried
        link = runtime / "link"
        link.symlink_to(path.parent)
        path.parent.chmod(0o700)
        assert private_dir_ok(str(path.parent))
        assert not private_dir_ok(str(link))
        started = subprocess.run([*CLI, "daemon", "start"], env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
        assert started.returncode == 0
        path.parent.chmod(0o755)  # loosened after the start: callers stop trusting it
        assert forward(["run", "--", "true"]) is None
        path.parent.chmod(0o700)
    finally:
        subprocess.run([*CLI, "daemon", "stop"], env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)}, check=False)
        subprocess.run(["rm", "-rf", str(runtime)], check=False)


def test_requests_round_trip_and_malformed_ones_are_refused() -> None:
    env = {b"A": b"1", b"B": b"x=y"}
    raw = encode_request(b"run", ["run", "--", "echo", "é"], env, b"/some/dir", 0o022)
    request = decode_request(raw[4:])
    assert (request.kind, request.cwd, request.umask) == (b"run", b"/some/dir", 0o022)
    assert request.argv == ["run", "--", "echo", "é"] and request.env == env
    short_argv = PROTOCOL + b"\0run\0/\0" + b"22\0" + b"5\0only-one"
    for bad in (b"", b"other\0run", raw[4:].replace(b"B=x=y", b"novalue"), short_argv):
        with pytest.raises(ValueError):
            decode_request(bad)


def test_source_stamp_notices_edits_and_new_files(tmp_path: Path) -> None:
    module = tmp_path / "a.py"
    module.write_text("x = 1")
    stamp = SourceStamp(tmp_path)
    assert not stamp.changed()
    os.utime(module, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert stamp.changed()
    stamp = SourceStamp(tmp_path)
    (tmp_path / "b.py").write_text("")
    os.utime(tmp_path / "b.py", ns=(0, 0))  # older than a.py: only the count tells
    assert stamp.changed()


def test_doctor_reports_the_daemon(daemon: dict[str, str], tmp_path: Path) -> None:
    def report() -> dict[str, object]:
        out = subprocess.run([*CLI, "doctor", "--json"], env=daemon, capture_output=True, timeout=120, check=True)
        entry: dict[str, object] = json.loads(out.stdout)["daemon"]
        return entry

    running = report()
    assert running["running"] is True and running["socket"] == daemon_socket_path(daemon)
    subprocess.run([*CLI, "daemon", "stop"], env=daemon, check=True, capture_output=True)
    assert report()["running"] is False


def test_a_stale_daemon_hands_the_command_back_and_it_runs_once(tmp_path: Path) -> None:
    watched = tmp_path / "src"
    watched.mkdir()
    (watched / "mod.py").write_text("")
    with tempfile.TemporaryDirectory(prefix="xdg", dir="/tmp") as runtime:
        env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
        env.pop("EXECSPACE_DAEMON", None)
        sock = Path(daemon_socket_path(env))
        sock.parent.mkdir(mode=0o700)
        server = subprocess.Popen(
            [sys.executable, "-m", "execspace.cli.forkserver", "--socket", str(sock), "--watch", str(watched)], env=env
        )
        try:
            deadline = time.monotonic() + 30
            while not sock.exists():
                assert time.monotonic() < deadline and server.poll() is None, "the daemon did not start"
                time.sleep(0.05)
            log = tmp_path / "runs.log"
            cmd = [*CLI, "run", "--backend", "local", "--", "sh", "-c", f"echo ran >> {log}"]
            assert subprocess.run(cmd, env=env, check=False).returncode == 0
            assert daemon_served(env) == 1
            os.utime(watched / "mod.py", ns=(time.time_ns(), time.time_ns() + 10**9))  # "a new install"
            assert subprocess.run(cmd, env=env, check=False).returncode == 0  # answered "stale": ran here
            assert log.read_text() == "ran\nran\n"  # once each, never twice
            assert server.wait(timeout=10) == 0 and not sock.exists()
        finally:
            server.kill()
            server.wait()


_OTHER_USER = """
import os, socket, sys
os.setgid(65534); os.setuid(65534)
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except PermissionError:
    print("refused at connect"); raise SystemExit
try:  # a complete request with the daemon's key, stdio included: only the peer check is left
    socket.send_fds(s, [bytes.fromhex(sys.argv[2])], [0, 1, 2])
    reply = s.recv(64)
except (BrokenPipeError, ConnectionResetError):  # closed before or after our request arrived, unread
    reply = b""
print("reply", repr(reply))
"""
# a system interpreter: the other user cannot read a Python under /root (pyenv) or our venv
_SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(_SYSTEM_PYTHON), reason="needs root and /usr/bin/python3")
def test_another_user_gets_nothing_from_the_daemon(daemon: dict[str, str]) -> None:
    sock = Path(daemon_socket_path(daemon))
    key = read_key(str(sock))
    assert key is not None
    request = (key + encode_request(b"run", ["run", "--backend", "local", "--", "true"], {}, b"/", 0o022)).hex()
    attack = [_SYSTEM_PYTHON, "-I", "-c", _OTHER_USER, str(sock), request]
    out = subprocess.run(attack, capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "refused at connect", out.stderr  # the private directory stops it first
    # with the directory and socket opened up (a mistake, or a shared /tmp), the peer check still refuses
    before = daemon_served(daemon)
    for directory in (sock.parent.parent, sock.parent):
        directory.chmod(0o711)
    sock.chmod(0o777)
    try:
        out = subprocess.run(attack, capture_output=True, text=True, timeout=30)
    finally:
        sock.parent.chmod(0o700)  # (our own clients refuse a directory others can enter)
    assert out.stdout.strip() == "reply b''", out.stderr  # closed without a worker
    assert daemon_served(daemon) == before


def _still_open(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_DONTWAIT) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_a_silent_client_delays_no_one(daemon: dict[str, str], tmp_path: Path) -> None:
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(daemon_socket_path(daemon))  # and says nothing
        before = daemon_served(daemon)
        done = subprocess.run(
            [*CLI, "run", "--backend", "local", "--", "echo", "hi"], env=daemon, capture_output=True, timeout=60
        )
        assert (done.returncode, done.stdout) == (0, b"hi\n"), done.stderr
        assert daemon_served(daemon) == before + 1  # it went through the daemon...
        assert _still_open(silent), "the command waited until the silent client was dropped"  # ...without waiting
        deadline = time.monotonic() + 60
        while _still_open(silent):  # and the silent client does not hold its place forever
            assert time.monotonic() < deadline, "the silent client was never dropped"
            time.sleep(0.1)


@pytest.mark.slow
def test_a_command_outlives_the_handshake_timeout(daemon: dict[str, str], tmp_path: Path) -> None:
    script = f"sleep {_HANDSHAKE_TIMEOUT + 1:g}; echo done"
    done = subprocess.run(
        [*CLI, "run", "--backend", "local", "--", "sh", "-c", script], env=daemon, capture_output=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, b"done\n"), done.stderr


@pytest.mark.parametrize("key", [None, b"\0" * KEY_BYTES, b"x"], ids=["no-key", "wrong-key", "short-key"])
def test_a_client_without_the_key_runs_nothing(daemon: dict[str, str], tmp_path: Path, key: bytes | None) -> None:
    marker = tmp_path / "ran"
    request = encode_request(b"run", ["run", "--backend", "local", "--", "touch", str(marker)], {}, b"/", 0o022)
    before = daemon_served(daemon)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(daemon_socket_path(daemon))
        sock.settimeout(30)
        try:
            socket.send_fds(sock, [(key or b"") + request], [0, 1, 2])
            reply = b"".join(iter(lambda: sock.recv(64), b""))
        except (BrokenPipeError, ConnectionResetError):
            reply = b""
    assert reply == b""  # closed without a worker
    assert daemon_served(daemon) == before and not marker.exists()


def test_the_key_is_private_and_a_loosened_one_is_not_used(daemon: dict[str, str]) -> None:
    key_file = Path(daemon_key_path(daemon_socket_path(daemon)))
    st = key_file.lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == KEY_BYTES
    assert read_key(daemon_socket_path(daemon)) is not None
    key_file.chmod(0o644)
    try:
        assert read_key(daemon_socket_path(daemon)) is None
        status = subprocess.run([*CLI, "daemon", "status"], env=daemon, capture_output=True)
        assert status.returncode == 1  # not reached: no key we trust
    finally:
        key_file.chmod(0o600)
