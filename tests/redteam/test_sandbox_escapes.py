"""Attacks on the sandbox backend, judged by what the host can observe.

Each test tries one escape and checks the host side. Attacks are bounded (a few
hundred forks at most, floods stop by themselves). Runs as root in CI, which is
the hard case for bubblewrap.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import ResourceLimits, RunProgramSpec
from execspace.registry import probe_backend
from execspace.testing.processes import new_tag, tagged, wait_no_process
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def sandbox(
    tmp_path: Path, sandbox_mode: Mapping[str, Any]
) -> AsyncIterator[tuple[execspace.BaseEngine, execspace.Workspace]]:
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as engine:
        yield engine, await engine.manager.create_workspace("red/team/s")


async def sh(box: tuple[execspace.BaseEngine, execspace.Workspace], script: str, **kw: object) -> execspace.RunResult:
    engine, ws = box
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **kw))  # type: ignore[arg-type]


async def test_cannot_read_root_only_files(sandbox) -> None:  # type: ignore[no-untyped-def]
    secret = Path("/etc/execspace-redteam-secret")
    if os.geteuid() == 0:  # as a normal user /etc/shadow is the root-only file to attack
        secret.write_text("root-only")
        secret.chmod(0o600)
    try:
        r = await sh(sandbox, f"cat {secret}; cat /etc/shadow; ls /root")
    finally:
        secret.unlink(missing_ok=True)
    assert "root-only" not in r.stdout
    if Path("/etc/shadow").exists():
        assert "root:" not in r.stdout
    assert "Permission denied" in r.stderr or "No such file" in r.stderr


async def test_a_top_level_directory_of_the_hosts_own_is_not_there(sandbox) -> None:  # type: ignore[no-untyped-def]
    """Only the system's top-level directories are bound: a /work or /data of the host's own holds people's files,
    world-readable or not (a checkout, other users' venvs)."""
    own = [Path(f"/{e}") for e in os.listdir("/") if e in ("work", "data", "farm", "srv", "home")]
    made = None
    if os.geteuid() == 0:
        made = Path(f"/execspace-redteam-{os.getpid()}")
        made.mkdir(mode=0o755)
        (made / "world-readable.txt").write_text("host data")
        own.append(made)
    if not own:
        pytest.skip("no top-level directory of the host's own here (and not root to make one)")
    try:
        r = await sh(sandbox, " ; ".join(f"ls -d {d} 2>/dev/null && echo SEEN {d}" for d in own) + "; ls /")
    finally:
        if made is not None:
            (made / "world-readable.txt").unlink()
            made.rmdir()
    assert "SEEN" not in r.stdout, r.stdout
    assert "usr" in r.stdout.split()  # the control: the system's are there


async def test_cannot_write_outside_grants(sandbox, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    canary = tmp_path / "canary"
    canary.write_text("intact")
    canary.chmod(0o666)  # world-writable on the host: only the mount table can protect it
    r = await sh(sandbox, f"echo x > /usr/pwned; echo x > {canary}; echo x > /etc/pwned; touch /pwned; echo done")
    assert "done" in r.stdout
    assert canary.read_text() == "intact"
    assert not Path("/usr/pwned").exists() and not Path("/etc/pwned").exists() and not Path("/pwned").exists()


async def test_no_capabilities_and_not_root(sandbox) -> None:  # type: ignore[no-untyped-def]
    r = await sh(sandbox, "id -u; grep CapEff /proc/self/status")
    uid, capline = r.stdout.splitlines()
    assert uid != "0"
    assert capline.split()[1] == "0000000000000000"


async def test_remount_and_mount_tricks_fail(sandbox) -> None:  # type: ignore[no-untyped-def]
    r = await sh(
        sandbox,
        "mount -o remount,rw / 2>&1; mount -t tmpfs x /usr 2>&1; unshare -U true 2>&1; echo rc=$?",
    )
    assert not Path("/usr").joinpath("x").exists()
    assert "rc=0" not in r.stdout  # nested user namespaces are disabled


@pytest.mark.slow
async def test_network_is_off(sandbox) -> None:  # type: ignore[no-untyped-def]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    got: list[bytes] = []

    def accept() -> None:
        server.settimeout(5)
        try:
            conn, _ = server.accept()
            got.append(conn.recv(100))
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    try:
        r = await sh(
            sandbox,
            f"python3 -c \"import socket; s=socket.create_connection(('127.0.0.1',{port}),2); s.send(b'leak')\" 2>&1; "
            "python3 -c \"import socket; socket.getaddrinfo('pypi.org', 443)\" 2>&1 | tail -1",
        )
    finally:
        t.join()
        server.close()
    assert got == []
    assert "Error" in r.stdout


async def test_abstract_unix_socket_of_host_unreachable(sandbox) -> None:  # type: ignore[no-untyped-def]
    name = f"\0execspace-redteam-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(name)
    server.listen(1)
    try:
        r = await sh(
            sandbox,
            'python3 -c "import socket; s=socket.socket(socket.AF_UNIX); '
            f"s.connect('\\0execspace-redteam-{os.getpid()}'); print('CONNECTED')\" 2>&1",
        )
    finally:
        server.close()
    assert "CONNECTED" not in r.stdout


async def test_host_home_and_run_hidden(sandbox) -> None:  # type: ignore[no-untyped-def]
    r = await sh(sandbox, "ls /home /root /run /mnt 2>&1; ls /tmp | wc -l")
    assert "No such file" in r.stdout
    assert r.stdout.strip().endswith("0")  # the host's /tmp is not visible


async def test_other_processes_invisible(sandbox) -> None:  # type: ignore[no-untyped-def]
    r = await sh(sandbox, "ls /proc | grep -c '^[0-9]'")
    assert int(r.stdout.strip()) < 10  # only the sandbox's own processes
    assert str(os.getpid()) not in (await sh(sandbox, "ls /proc")).stdout.split()


async def test_fork_bomb_contained(sandbox) -> None:  # type: ignore[no-untyped-def]
    engine, _ = sandbox
    if "pids" not in engine.describe().enforced_limits:
        pytest.skip("pids limit is enforced only when running as root")
    r = await sh(
        sandbox,
        "i=0; while [ $i -lt 300 ]; do sleep 3 & i=$((i+1)); done 2>/dev/null; echo spawned",
        limits=ResourceLimits(pids=50),
        timeout=20,
    )
    assert "Cannot fork" in r.stderr or "fork" in r.stderr.lower() or r.exit_code != 0


async def test_daemon_does_not_outlive_timeout(sandbox) -> None:  # type: ignore[no-untyped-def]
    engine, ws = sandbox
    assert ws.host_path is not None
    log = ws.host_path / "out" / "daemon.log"
    tag = new_tag("daemon")
    r = await sh(
        sandbox,
        "(setsid sh -c 'while true; do echo x >> $OUTPUT_DIR/daemon.log; sleep 0.05; done' &); sleep 30",
        timeout=1,
        env=tagged(tag),
    )
    assert r.timed_out and log.stat().st_size > 0
    assert not wait_no_process(tag), "the daemon outlived the run"


async def test_env_values_not_on_command_line(sandbox) -> None:  # type: ignore[no-untyped-def]
    """Judged on the host, where every user can read every process's command line: while the program runs (it
    has the value), no process of this host carries the value in its argv (bwrap's included)."""
    engine, ws = sandbox
    value = "v4lue-" + os.urandom(6).hex()
    spec = RunProgramSpec("sh", ["-c", 'echo "$TOKENISH"; read _'], env={"TOKENISH": value}, stdin=b"")
    async with await engine.runner.start_program(ws, spec) as handle:
        seen = b""
        async for chunk in handle.stream():
            seen += chunk.data
            if b"\n" in seen:
                break
        assert seen == f"{value}\n".encode()
        carrying = [pid for pid in os.listdir("/proc") if pid.isdigit() and value.encode() in _cmdline(pid)]
        await handle.close_stdin()
        await handle.wait()
    assert carrying == []


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_metadata_and_skills_read_only(sandbox) -> None:  # type: ignore[no-untyped-def]
    engine, ws = sandbox
    assert ws.host_path is not None
    before = (ws.host_path / "metadata.json").read_bytes()
    await sh(sandbox, "echo x > $WORKSPACE_DIR/metadata.json; rm -f $WORKSPACE_DIR/metadata.json; touch $SKILLS_DIR/x")
    assert (ws.host_path / "metadata.json").read_bytes() == before
    assert not (ws.host_path / "skills" / "x").exists()


async def test_daemon_does_not_outlive_a_normal_exit(sandbox) -> None:  # type: ignore[no-untyped-def]
    engine, ws = sandbox
    assert ws.host_path is not None
    log = ws.host_path / "out" / "after-exit.log"
    tag = new_tag("daemon")
    r = await sh(
        sandbox,
        "(setsid sh -c 'exec >/dev/null 2>&1; while true; do echo x >> $OUTPUT_DIR/after-exit.log; sleep 0.05; done' &)"
        "; sleep 0.3; echo main-done",
        env=tagged(tag),
    )
    assert r.exit_code == 0 and r.stdout == "main-done\n" and log.stat().st_size > 0
    assert not wait_no_process(tag), "the daemon outlived the run"


async def test_kill_during_sandbox_setup_leaves_nothing(sandbox) -> None:  # type: ignore[no-untyped-def]
    """A kill that lands while bwrap is still building the sandbox must not orphan the program."""
    import asyncio

    engine, ws = sandbox
    assert ws.host_path is not None
    tag = new_tag("setup")
    for i in range(20):
        spec = RunProgramSpec("sh", ["-c", f"sleep 0.5; touch $WORK_DIR/survived-{i}"], env=tagged(tag))
        handle = await engine.runner.start_program(ws, spec)
        await asyncio.sleep(0.002 * (i % 5))  # different moments of the set-up
        await handle.kill()
        await handle.wait()
    assert not wait_no_process(tag), "a killed program survived"
    assert not list((ws.host_path / "work").glob("survived-*"))


async def test_workspaces_are_private_on_the_host(sandbox) -> None:  # type: ignore[no-untyped-def]
    """The sandbox root must be traversable by the sandbox uid; each workspace stays closed to others."""
    import stat

    _, ws = sandbox
    assert ws.host_path is not None
    assert stat.S_IMODE(ws.host_path.stat().st_mode) & 0o077 == 0
