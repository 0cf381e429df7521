"""Attacks on sandbox session mode: on other runs of the session, on its supervisor, on other sessions, and a
supervisor that lies, floods or stops answering (the host must end that session only). Checked from the host."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.sandbox import SandboxBackend, SandboxOptions, SessionConfig
from execspace.backends.sandbox.session import Session
from execspace.errors import BackendError
from execspace.registry import probe_backend
from execspace.testing.processes import new_tag, tagged, wait_no_process, wait_processes
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(90)

Engine = execspace.BaseEngine
Ws = execspace.Workspace


async def open_session_engine(tmp_path: Path, request_timeout: float = 10.0) -> execspace.BaseEngine:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    config = SessionConfig(pool_size=0, request_timeout=request_timeout)
    return await SandboxBackend.open(SandboxOptions(workspace_root=tmp_path / "ws", mode="session", session=config))


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    eng = await open_session_engine(tmp_path, request_timeout=2.0)
    try:
        yield eng
    finally:
        await eng.aclose()


def session_of(engine: Engine, ws: Ws) -> Session:
    fut = engine.runner.spawning._sessions[ws.host_path]  # type: ignore[attr-defined]
    session: Session = fut.result()
    return session


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


async def wait_gone(pid: int, within: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while alive(pid):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def sh(engine: Engine, ws: Ws, script: str, **kw: object) -> execspace.RunResult:
    return await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", script], **kw))  # type: ignore[arg-type]


# -- other runs of the same session ----------------------------------------------------------------

_THIEF = textwrap.dedent(
    """
    import os, time
    me = str(os.getpid())
    stolen = []
    open("thief-up", "w").close()
    end = time.monotonic() + 4
    while time.monotonic() < end and not os.path.exists("victim-done"):
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            for fd in range(3):
                for mode in (os.O_RDONLY, os.O_WRONLY):
                    try:
                        f = os.open(f"/proc/{pid}/fd/{fd}", mode | os.O_NONBLOCK)
                    except OSError:
                        continue
                    try:
                        if mode == os.O_RDONLY:
                            stolen.append(os.read(f, 65536))
                        else:
                            os.write(f, b"INJECTED")
                    except OSError:
                        pass
                    finally:
                        os.close(f)
        time.sleep(0.01)
    with open("stolen", "wb") as out:
        out.write(b"".join(stolen))
    """
)


async def test_a_background_program_cannot_read_another_runs_stdin_or_output(engine: Engine) -> None:
    ws = await engine.manager.create_workspace("sessions/thief")
    assert ws.host_path is not None
    work = ws.host_path / "work"
    thief = await engine.runner.start_program(ws, RunProgramSpec("python3", ["-c", _THIEF], timeout=30))
    while not (work / "thief-up").exists():
        await asyncio.sleep(0.02)
    victim = "sleep 0.5; cat; echo OUT-SECRET; sleep 0.5; touch victim-done"
    r = await sh(engine, ws, victim, stdin="IN-SECRET\n")
    assert r.exit_code == 0, r
    assert r.stdout == "IN-SECRET\nOUT-SECRET\n", r
    done = await thief.wait()
    assert done.exit_code == 0, done
    stolen = (work / "stolen").read_bytes()
    assert b"SECRET" not in stolen


async def test_programs_cannot_kill_stop_or_ptrace_the_supervisor(engine: Engine) -> None:
    ws = await engine.manager.create_workspace("sessions/init")
    assert (await sh(engine, ws, "true")).exit_code == 0
    session = session_of(engine, ws)
    pid = session.supervisor_pid
    assert pid is not None and alive(pid)
    attack = textwrap.dedent(
        """
        import ctypes, os, signal
        for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGSEGV):
            try:
                os.kill(1, sig)
            except OSError as e:
                print("kill", sig, e.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
        for name in ("mem", "environ", "fd", "exe"):
            try:
                os.listdir("/proc/1/" + name) if name == "fd" else open("/proc/1/" + name, "rb").read(1)
                print("OPENED", name)
            except OSError as e:
                print(name, e.errno)
        """
    )
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", attack]))
    assert r.exit_code == 0, r
    assert "OPENED" not in r.stdout
    assert "ptrace -1" in r.stdout, r.stdout
    # the same supervisor, running, not stopped, still answering
    with open(f"/proc/{pid}/stat") as f:
        assert f.read().rsplit(")", 1)[1].split()[0] in ("S", "R"), "the supervisor was stopped"
    assert (await sh(engine, ws, "echo still")).stdout == "still\n"
    assert session_of(engine, ws) is session and session.usable


async def test_a_sessions_programs_cannot_see_or_signal_another_sessions(engine: Engine) -> None:
    a = await engine.manager.create_workspace("sessions/a")
    b = await engine.manager.create_workspace("sessions/b")
    tag = new_tag("sess-a")
    sleeper = await engine.runner.start_program(a, RunProgramSpec("sleep", ["60"], env=tagged(tag), timeout=60))
    try:
        await wait_processes(tag, 1)
        look = f"grep -l {tag} /proc/[0-9]*/environ /proc/[0-9]*/cmdline 2>/dev/null; kill -9 -1; echo listed"
        r = await sh(engine, b, look)
        assert r.stdout.endswith("listed\n") and tag not in r.stdout, r
        assert len(await wait_processes(tag, 1)) == 1  # still there: B's kill -1 reached nothing of A
    finally:
        await sleeper.kill()


# -- a supervisor that breaks the protocol ----------------------------------------------------------

#: The start a hostile supervisor reports before it lies about the program's output (pid 5, exec'd).
_STARTED = "chan.send(struct.pack('=IIii', 2, ident, 5, 0))"
_HOSTILE = {
    "garbage": "chan.send(b'\\xde\\xad\\xbe\\xef' * 4)",
    "oversized": "chan.send(b'\\0' * 100_000)",
    "short": "chan.send(b'\\2\\0\\0')",
    "unasked": "chan.send(struct.pack('=IIii', 2, 99999, 5, 0))",
    "unknown-exit": "chan.send(struct.pack('=IIii', 3, 0, 4242, 0))",
    "fds": "chan.sendmsg([struct.pack('=IIii', 2, ident, 5, 0)], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, "
    "array.array('i', [0]))])",
    "silent": "time.sleep(60)",
    # the output the supervisor forwards for a run that captures (most runs)
    "output-unasked": "chan.send(struct.pack('=IIii', 5, 99999, 1, 0) + b'x')",
    "output-oversized": f"{_STARTED}; chan.send(struct.pack('=IIii', 5, ident, 1, 0) + b'x' * 65537)",
    "output-empty": f"{_STARTED}; chan.send(struct.pack('=IIii', 5, ident, 1, 0))",
    "output-bad-fd": f"{_STARTED}; chan.send(struct.pack('=IIii', 5, ident, 3, 0) + b'x')",
    "output-after-end": f"{_STARTED}; chan.send(struct.pack('=IIii', 3, 2, 5, 0)); "
    "chan.send(struct.pack('=IIii', 5, ident, 1, 0) + b'x')",
    "exit-flags": f"{_STARTED}; chan.send(struct.pack('=IIii', 3, 8, 5, 0))",
    # "could not make the run directory" (pid -1), then again to the start asked without one
    "no-run-dir-twice": "chan.send(struct.pack('=IIii', 2, ident, -1, 2)); "
    "ident = struct.unpack_from('=II', chan.recv(1 << 20))[1]; chan.send(struct.pack('=IIii', 2, ident, -1, 2))",
}


def _hostile_supervisor(path: Path, behaviour: str) -> Path:
    script = textwrap.dedent(
        f"""\
        #!/usr/bin/python3
        import array, socket, struct, sys, time
        chan = socket.socket(fileno=int(sys.argv[1]))
        chan.send(struct.pack('=IIii', 1, 0, 0, 0))
        request = chan.recv(1 << 20)
        ident = struct.unpack_from('=II', request)[1]
        {_HOSTILE[behaviour]}
        time.sleep(60)
        """
    )
    path.write_text(script)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("behaviour", list(_HOSTILE))
async def test_a_lying_supervisor_ends_only_its_session(engine: Engine, tmp_path: Path, behaviour: str) -> None:
    good = await engine.manager.create_workspace("sessions/good")
    assert (await sh(engine, good, "echo before")).stdout == "before\n"
    bad = await engine.manager.create_workspace("sessions/bad")
    real = engine.runner.spawning.supervisor  # type: ignore[attr-defined]
    engine.runner.spawning.supervisor = _hostile_supervisor(tmp_path / "hostile", behaviour)  # type: ignore[attr-defined]
    try:
        with pytest.raises(BackendError, match="supervisor") as caught:
            await sh(engine, bad, "echo never")
    finally:
        engine.runner.spawning.supervisor = real  # type: ignore[attr-defined]
    assert "session was ended" in str(caught.value)
    bad_session = session_of(engine, bad) if bad.host_path in engine.runner.spawning._sessions else None  # type: ignore[attr-defined]
    assert bad_session is None or not bad_session.usable
    # the other session goes on; the broken workspace gets a new, working one
    assert (await sh(engine, good, "echo after")).stdout == "after\n"
    assert (await sh(engine, bad, "echo again")).stdout == "again\n"


_NEVER_REPORTS_EXITS = """\
#!/usr/bin/python3
import socket, struct, sys
chan = socket.socket(fileno=int(sys.argv[1]))
chan.send(struct.pack('=IIii', 1, 0, 0, 0))
while request := chan.recv(1 << 20):
    op, ident = struct.unpack_from('=II', request)
    # spawned (a pid that never runs) and signalled as asked, but no exit is ever reported
    chan.send(struct.pack('=IIii', 2 if op == 1 else 4, ident, 4242 if op == 1 else 0, 0))
"""


async def test_a_supervisor_that_never_reports_an_exit_cannot_hold_a_kill(engine: Engine, tmp_path: Path) -> None:
    """A kill waits for the supervisor's word that the program ended; one that never comes ends the session (the
    request timeout, 2 s here) instead of holding the caller forever (a tools suite once hung on it)."""
    ws = await engine.manager.create_workspace("sessions/mute")
    real = engine.runner.spawning.supervisor  # type: ignore[attr-defined]
    liar = tmp_path / "mute"
    liar.write_text(_NEVER_REPORTS_EXITS)
    liar.chmod(0o755)
    engine.runner.spawning.supervisor = liar  # type: ignore[attr-defined]
    try:
        handle = await engine.runner.start_program(ws, RunProgramSpec("sleep", ["300"]))
        await asyncio.wait_for(handle.kill(), 15)  # TERM, the 2 s grace, KILL, then 2 s for the word
        with pytest.raises(BackendError, match="after SIGKILL"):
            await asyncio.wait_for(handle.wait(), 5)
    finally:
        engine.runner.spawning.supervisor = real  # type: ignore[attr-defined]
    assert (await sh(engine, ws, "echo again")).stdout == "again\n"  # a new session, a real supervisor


_REFUSES_RUN_DIRS = """\
#!/usr/bin/python3
import socket, struct, sys
chan = socket.socket(fileno=int(sys.argv[1]))
chan.send(struct.pack('=IIii', 1, 0, 0, 0))
while request := chan.recv(1 << 20):
    op, ident, flags = struct.unpack_from('=III', request)
    if flags & 4:  # asked to make the run directory first: it cannot (ENOENT)
        chan.send(struct.pack('=IIii', 2, ident, -1, 2))
    else:  # started (pid 5), exited 0, its stdout and stderr ended with it
        chan.send(struct.pack('=IIii', 2, ident, 5, 0))
        chan.send(struct.pack('=IIii', 3, 6, 5, 0))
"""


async def test_a_run_directory_the_supervisor_cannot_make_is_made_by_the_host(engine: Engine, tmp_path: Path) -> None:
    """The supervisor makes a run's directory; where it cannot (runs/ gone from its view, say), the host makes it
    by its own confined walk and asks for the start again, without one: the run gets its directory either way."""
    ws = await engine.manager.create_workspace("sessions/rundir")
    assert ws.host_path is not None
    real = engine.runner.spawning.supervisor  # type: ignore[attr-defined]
    refuses = tmp_path / "refuses"
    refuses.write_text(_REFUSES_RUN_DIRS)
    refuses.chmod(0o755)
    engine.runner.spawning.supervisor = refuses  # type: ignore[attr-defined]
    try:
        r = await sh(engine, ws, "true")
    finally:
        engine.runner.spawning.supervisor = real  # type: ignore[attr-defined]
    assert r.exit_code == 0, r
    assert (ws.host_path / r.run_dir).is_dir()
    assert session_of(engine, ws).usable


async def test_a_stopped_supervisor_ends_only_its_session_and_its_runs_report_it(engine: Engine) -> None:
    good = await engine.manager.create_workspace("sessions/good")
    bad = await engine.manager.create_workspace("sessions/stopped")
    tag = new_tag("stopped")
    running = await engine.runner.start_program(bad, RunProgramSpec("sleep", ["60"], env=tagged(tag), timeout=60))
    await wait_processes(tag, 1)
    session = session_of(engine, bad)
    assert session.supervisor_pid is not None
    os.kill(session.supervisor_pid, signal.SIGSTOP)
    with pytest.raises(BackendError, match="did not answer"):
        await sh(engine, bad, "echo never")
    with pytest.raises(BackendError, match="did not answer"):
        await running.wait()
    assert not wait_no_process(tag), "a program of the ended session survived"
    assert await wait_gone(session.supervisor_pid)
    assert (await sh(engine, good, "echo fine")).stdout == "fine\n"
    assert (await sh(engine, bad, "echo new")).stdout == "new\n"


async def test_a_run_timeout_kills_its_tree_but_not_the_session(engine: Engine) -> None:
    ws = await engine.manager.create_workspace("sessions/timeout")
    tag = new_tag("tree")
    script = "setsid sleep 60 & sleep 60 & sleep 60"
    r = await sh(engine, ws, script, timeout=0.5, env=tagged(tag))
    assert r.timed_out
    assert not wait_no_process(tag), "a process of the timed-out run survived (its group or a setsid escapee)"
    assert (await sh(engine, ws, "echo alive")).stdout == "alive\n"


# -- nothing is left --------------------------------------------------------------------------------


async def test_cleanup_and_engine_close_leave_no_process(tmp_path: Path) -> None:
    engine = await open_session_engine(tmp_path)
    try:
        tags = {}
        supervisors = []
        for name in ("sessions/clean", "sessions/close"):
            ws = await engine.manager.create_workspace(name)
            tags[name] = new_tag("left")
            cmd = "setsid sleep 60 & sleep 60"
            await engine.runner.start_program(ws, RunProgramSpec("sh", ["-c", cmd], env=tagged(tags[name])))
            await wait_processes(tags[name], 3)
            supervisors.append(session_of(engine, ws).supervisor_pid)
            if name == "sessions/clean":
                await engine.manager.cleanup(ws)
                assert not wait_no_process(tags[name]), "cleanup left a process"
    finally:
        await engine.aclose()
    assert not wait_no_process(tags["sessions/close"]), "engine close left a process"
    for pid in supervisors:
        assert pid is not None and await wait_gone(pid)


async def test_killing_the_host_process_leaves_no_process(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    tag = new_tag("orphan")
    host = textwrap.dedent(
        f"""
        import asyncio, execspace
        from execspace import RunProgramSpec
        async def main():
            async with execspace.open_engine("sandbox", mode="session", workspace_root={str(tmp_path / "ws")!r}) as e:
                ws = await e.manager.create_workspace("orphans")
                spec = RunProgramSpec("sh", ["-c", "setsid sleep 60 & sleep 60"], env={tagged(tag)!r})
                await e.runner.start_program(ws, spec)
                print("started", flush=True)
                await asyncio.sleep(60)
        asyncio.run(main())
        """
    )
    with subprocess.Popen([sys.executable, "-c", host], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "started\n"
            await wait_processes(tag, 3)
        finally:
            proc.kill()
    assert not wait_no_process(tag), "killing the host left processes of its session"


async def test_an_idle_session_ends_and_the_next_run_starts_a_new_one(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    config = SessionConfig(pool_size=0, idle_timeout=0.2)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", mode="session", session=config) as e:
        ws = await e.manager.create_workspace("sessions/idle")
        assert (await sh(e, ws, "echo one")).stdout == "one\n"
        first = session_of(e, ws).supervisor_pid
        assert first is not None
        assert await wait_gone(first), "an idle session was kept past its idle timeout"
        assert (await sh(e, ws, "echo two")).stdout == "two\n"
        assert session_of(e, ws).supervisor_pid not in (None, first)


async def test_a_pooled_session_becomes_the_new_workspaces_and_only_its(tmp_path: Path) -> None:
    probe = await probe_backend("sandbox", mode="session")
    if not probe.ok:
        pytest.skip(f"sandbox session mode unavailable: {probe.reason}")
    make_traversable(tmp_path)
    config = SessionConfig(pool_size=1)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", mode="session", session=config) as e:
        pool = e.runner.spawning.pool  # type: ignore[attr-defined]
        pool.refill()
        assert await pool.ready(10)
        pooled = pool.idle()[0].session
        ws = await e.manager.create_workspace("sessions/pooled")
        assert ws.host_path is not None
        (ws.host_path / "work" / "mine.txt").write_text("mine")
        r = await sh(e, ws, "cat mine.txt")
        assert r.stdout == "mine", r
        assert session_of(e, ws) is pooled
        # a second workspace gets another session (a fresh pooled one, or a cold one): never this one
        other = await e.manager.create_workspace("sessions/other")
        assert "mine.txt" not in (await sh(e, other, "ls /workspace/work")).stdout
        assert session_of(e, other) is not pooled
        # removed before its first run, a pooled workspace takes its session along
        await pool.ready(10)
        unused = pool.idle()[0].session
        gone = await e.manager.create_workspace("sessions/unused")
        await e.manager.cleanup(gone)
        assert unused.supervisor_pid is not None and await wait_gone(unused.supervisor_pid)


async def test_large_arguments_pass_and_too_large_ones_are_refused_clearly(engine: Engine) -> None:
    ws = await engine.manager.create_workspace("sessions/args")
    chunk = "a" * 100_000  # one argument may not exceed 128 KiB on Linux
    r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", 'echo "$#"', "sh", *[chunk] * 10]))
    assert r.exit_code == 0 and r.stdout == "10\n", r
    with pytest.raises(execspace.InvalidSpec, match="stdin or a file"):
        await engine.runner.run_program(ws, RunProgramSpec("true", [chunk] * 30))
    assert (await sh(engine, ws, "echo fine")).stdout == "fine\n"
