"""The container backend against a real daemon (private dockerd when none runs): runs, limits, hardening.

Without a daemon every test here but the probe ones skips, with the reason.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import execspace
from execspace import PutFile, RunProgramSpec
from execspace.backends.container import ContainerBackend, ContainerOptions
from execspace.backends.container.reaper import LABEL
from execspace.capabilities import Isolation
from execspace.errors import CapabilityError, InvalidSpec, PolicyViolation, SetupFailed
from execspace.models import ResourceLimits
from execspace.protocols import ProgramHandle
from execspace.registry import probe_backend
from execspace.testing.processes import new_tag, tagged, wait_no_process, wait_processes
from tests.backends.container_support import container_engine, engine_fixture, labelled_containers, sh
from tests.backends.docker_fixture import TEST_BINDS, Daemon

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")

CONTAINER_UID = 65534 if os.getuid() == 0 else os.getuid()


engine = engine_fixture()


@pytest.fixture
async def ws(engine: execspace.BaseEngine) -> execspace.Workspace:
    return await engine.manager.create_workspace("container/test")


def _our_containers(daemon: Daemon) -> set[str]:
    return set(labelled_containers(daemon, f"{LABEL}.pid={os.getpid()}"))


# -- probe and capabilities (the probe ones need no daemon) ---------------------------------------


async def test_probe_without_daemon_says_why_and_how() -> None:
    probe = await ContainerBackend.probe(ContainerOptions(docker_host="unix:///nonexistent/execspace.sock"))
    assert not probe.ok
    assert "/nonexistent/execspace.sock" in probe.reason
    assert "DOCKER_HOST" in probe.fix


async def test_probe_finds_the_daemon(docker_daemon: Daemon, test_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_daemon.host)  # what `execspace doctor` sees
    monkeypatch.setenv("EXECSPACE_CONTAINER_IMAGE", test_image)  # without one it cannot open, so it is not ok
    probe = await probe_backend("container")
    assert probe.ok, probe.reason
    assert docker_daemon.host in probe.reason
    assert probe.reason.startswith("Docker "), probe.reason  # which engine answers, for `execspace doctor`


async def test_capabilities_state_what_is_applied(engine: execspace.BaseEngine) -> None:
    caps = engine.describe()
    assert caps.isolation is Isolation.CONTAINER
    assert caps.network_control and not caps.network_default
    assert caps.enforced_limits == {
        "timeout",
        "output_bytes",
        "memory_bytes",
        "pids",
        "cpu_seconds",
        "file_size_bytes",
    }
    assert caps.streaming
    assert caps.details["network"] == "none"
    assert caps.details["user"] == f"{CONTAINER_UID}:{CONTAINER_UID}"


# -- runs ------------------------------------------------------------------------------------------

_COUNT_SLEEP_300 = "for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done | grep -c '^sleep 300' || true"


async def test_exit_code_stdin_env_cwd(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    spec = sh('read line; echo "got $line $GREETING"; pwd; echo oops >&2; exit 3', stdin="hi\n", env={"GREETING": "x1"})
    r = await engine.runner.run_program(ws, spec)
    assert r.exit_code == 3
    assert r.stdout == "got hi x1\n/workspace/work\n"
    assert r.stderr == "oops\n"
    assert r.run_dir.startswith("runs/")


async def test_env_values_never_appear_on_a_command_line(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    value = "v-3f9a1c-private"
    r = await engine.runner.run_program(
        ws, sh("cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; echo $TOKENISH", env={"TOKENISH": value})
    )
    lines = r.stdout.splitlines()
    assert lines[-1] == value  # the program got it...
    assert value not in "\n".join(lines[:-1])  # ...but no process's argv carries it


async def test_host_environment_does_not_enter(
    engine: execspace.BaseEngine, ws: execspace.Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "xx_HOST.UTF-8")
    r = await engine.runner.run_program(ws, sh("env"))
    assert "xx_HOST" not in r.stdout
    assert "WORKSPACE_DIR=/workspace\n" in r.stdout
    assert "HOME=/workspace/home\n" in r.stdout


async def test_missing_command_is_127(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    r = await engine.runner.run_program(ws, RunProgramSpec("no-such-program-x"))
    assert r.exit_code == 127
    # in the program's terms first (the runtime's own OCI line follows it)
    assert r.stderr.startswith("execspace: cannot execute 'no-such-program-x' in the container: not found in image")
    await engine.fs.put_files(ws, [execspace.PutFile("work/data.txt", "not a program", mode=0o644)])
    r = await engine.runner.run_program(ws, RunProgramSpec("./data.txt"))
    assert r.exit_code == 126 and r.stderr.startswith("execspace: cannot execute './data.txt' in the container"), (
        r.stderr
    )


async def test_elapsed_time_is_real(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    r = await engine.runner.run_program(ws, sh("sleep 0.5", timeout=30))
    assert r.exit_code == 0 and not r.timed_out
    assert 0.45 <= r.duration < 3.0  # the reference reported the timeout (30 s) here


async def test_timeout_kills_what_the_program_started(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    # a background child with its own stdout closed would survive a kill of the exec's main process alone
    start = time.monotonic()
    r = await engine.runner.run_program(
        ws, sh("sleep 300 >/dev/null 2>&1 & echo $! > /workspace/out/child.pid; sleep 300", timeout=1)
    )
    assert r.timed_out and r.limit_hit == "timeout"
    assert r.exit_code == -signal.SIGTERM  # TERM first: the shell had no handler for it
    assert 0.9 <= r.duration < 4 and time.monotonic() - start < 8
    assert ws.host_path is not None
    child = (ws.host_path / "out/child.pid").read_text().strip()
    check = await engine.runner.run_program(ws, sh(f"test -d /proc/{child} && echo alive || echo gone"))
    assert check.stdout == "gone\n"
    procs = await engine.runner.run_program(ws, sh(_COUNT_SLEEP_300))
    assert procs.stdout.strip() == "0"  # neither the program's sleep nor its background child is left


async def test_output_is_capped_head_and_tail(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    spec = sh(
        "echo START; head -c 2000000 /dev/zero | tr '\\0' x; echo; echo END", limits=ResourceLimits(output_bytes=1000)
    )
    r = await engine.runner.run_program(ws, spec)
    assert r.exit_code == 0
    assert r.stdout_truncated and r.stdout_total_bytes == 2000000 + len("START\n") + len("\nEND\n")
    assert r.stdout.startswith("START\n") and r.stdout.endswith("END\n")
    assert len(r.raw_stdout) < 1100


# -- streaming (start_program) ---------------------------------------------------------------------


async def test_handle_streams_both_streams_in_order(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    spec = sh("echo one; sleep 0.3; echo two >&2; sleep 0.3; echo three; exit 5")
    async with await engine.runner.start_program(ws, spec) as handle:
        assert isinstance(handle, ProgramHandle)
        seen = []
        async for chunk in handle.stream():
            seen.append((chunk.stream, chunk.data, round(time.monotonic(), 1)))
        r = await handle.wait()
    assert [(s, d) for s, d, _ in seen] == [("stdout", b"one\n"), ("stderr", b"two\n"), ("stdout", b"three\n")]
    assert seen[2][2] - seen[0][2] >= 0.5  # delivered as printed, not all at the end
    assert (r.exit_code, r.stdout, r.stderr) == (5, "one\nthree\n", "two\n")
    assert 0.55 <= r.duration < 3.0


async def test_handle_interactive_stdin(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    async with await engine.runner.start_program(ws, sh("while read l; do echo got-$l; done; echo eof")) as handle:
        stream = handle.stream()
        await handle.write_stdin("a\n")
        assert (await asyncio.wait_for(anext(stream), 5)).data == b"got-a\n"
        await handle.write_stdin(b"b\n")
        assert (await asyncio.wait_for(anext(stream), 5)).data == b"got-b\n"
        await handle.close_stdin()
        r = await asyncio.wait_for(handle.wait(), 5)
    assert r.exit_code == 0 and r.stdout == "got-a\ngot-b\neof\n"


async def test_handle_kill_takes_the_whole_tree(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    spec = sh("sleep 300 >/dev/null 2>&1 & echo ready; sleep 300")
    async with await engine.runner.start_program(ws, spec) as handle:
        assert (await asyncio.wait_for(anext(handle.stream()), 5)).data == b"ready\n"
        start = time.monotonic()
        await handle.kill()
        r = await asyncio.wait_for(handle.wait(), 10)
    assert time.monotonic() - start < 6
    assert r.exit_code == -signal.SIGTERM and not r.timed_out and r.stdout == "ready\n"
    procs = await engine.runner.run_program(ws, sh(_COUNT_SLEEP_300))
    assert procs.stdout.strip() == "0"


async def test_handle_kill_reaches_the_shell_through_its_children(
    engine: execspace.BaseEngine, ws: execspace.Workspace
) -> None:
    # the exec's own `sh -c` was once missed by the marker scan while its children were found:
    # killing only those left the shell to carry on with the next command
    tag = new_tag("late")
    spec = sh("(sleep 1; touch late-child) & sleep 1; touch late-main", env=tagged(tag))
    async with await engine.runner.start_program(ws, spec) as h:
        await wait_processes(tag, 4)  # the shell, the subshell and both sleeps
        await h.kill()
        r = await asyncio.wait_for(h.wait(), 10)
    assert r.exit_code == -signal.SIGTERM
    assert not wait_no_process(tag), "a process of the killed program is left"
    assert ws.host_path is not None
    assert not (ws.host_path / "work/late-child").exists() and not (ws.host_path / "work/late-main").exists()


async def test_handle_timeout_and_leaving_the_block_kill(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    async with await engine.runner.start_program(ws, sh("echo started; sleep 300", timeout=0.5)) as handle:
        r = await asyncio.wait_for(handle.wait(), 10)
    assert r.timed_out and r.limit_hit == "timeout" and r.exit_code == -signal.SIGTERM
    assert r.stdout == "started\n" and 0.45 <= r.duration < 6
    async with await engine.runner.start_program(ws, sh("sleep 300")):
        pass  # leaving without wait() must not leave the program running
    procs = await engine.runner.run_program(ws, sh(_COUNT_SLEEP_300))
    assert procs.stdout.strip() == "0"


@pytest.mark.slow
async def test_handle_output_capped_while_streamed_whole(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    size = 3_000_000
    spec = sh(f"head -c {size} /dev/zero | tr '\\0' x", limits=ResourceLimits(output_bytes=1000))
    async with await engine.runner.start_program(ws, spec) as handle:
        streamed = sum([len(c.data) async for c in handle.stream()])
        r = await handle.wait()
    assert streamed == size  # the consumer sees everything, as it comes
    assert r.stdout_truncated and r.stdout_total_bytes == size and len(r.raw_stdout) < 1100
    # nobody streams: the run must not stall on undelivered chunks (each one held back 50 ms made this take 43 s,
    # and the daemon cuts what an exited exec has not sent within 2 s), and memory stays capped
    big = 10 * size
    spec = sh(f"head -c {big} /dev/zero | tr '\\0' x", limits=ResourceLimits(output_bytes=1000))
    async with await engine.runner.start_program(ws, spec) as handle:
        r = await asyncio.wait_for(handle.wait(), 20)
    assert r.exit_code == 0 and r.stdout_total_bytes == big and len(r.raw_stdout) < 1100


# -- hardening, checked from inside ----------------------------------------------------------------


async def test_hardening_seen_from_inside(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    script = r"""
id -u
grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs):' /proc/self/status
ls /sys/class/net
touch /rootfile 2>/dev/null && echo root-writable || echo root-readonly
touch /tmp/ok && echo tmp-writable
python3 -c 'import socket; s=socket.socket(); s.settimeout(2); s.connect(("1.1.1.1", 53))' 2>/dev/null \
  && echo net-reachable || echo net-unreachable
"""
    r = await engine.runner.run_program(ws, sh(script))
    lines = r.stdout.split()
    assert int(lines[0]) == CONTAINER_UID != 0
    status = dict(line.split(":\t") for line in r.stdout.splitlines() if ":\t" in line)
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0 and int(status["CapBnd"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    net = r.stdout.split("NoNewPrivs:\t1\n", 1)[1].splitlines()[0]
    assert net == "lo"  # no interface but loopback
    assert "root-readonly" in r.stdout and "tmp-writable" in r.stdout
    assert "net-unreachable" in r.stdout


async def test_pids_limit_stops_a_small_fork_flood(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> None:
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pids=40) as eng:
        ws = await eng.manager.create_workspace("pids")
        # at most 100 sleepers that end by themselves: the limit stops the forks well before that
        flood = (
            "import os, time\n"
            "n = 0\n"
            "for _ in range(100):\n"
            "    try:\n"
            "        pid = os.fork()\n"
            "    except OSError:\n"
            "        break\n"
            "    if pid == 0:\n"
            "        time.sleep(2)\n"
            "        os._exit(0)\n"
            "    n += 1\n"
            "print(n)\n"
        )
        r = await eng.runner.run_program(ws, RunProgramSpec("python3", ["-c", flood], timeout=30))
    assert r.exit_code == 0, r.stderr
    assert 5 < int(r.stdout) < 40


async def test_network_on_is_refused(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    with pytest.raises(CapabilityError):
        await engine.runner.run_program(ws, sh("true", network="on"))


async def test_pids_below_the_container_limit_is_refused(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    # RLIMIT_NPROC counts every process of the uid on the host, so a per-run pids limit cannot be honest
    with pytest.raises(CapabilityError):
        await engine.runner.run_program(ws, sh("true", limits=ResourceLimits(pids=8)))


async def test_daemon_socket_mount_is_refused(docker_daemon: Daemon, test_image: str, tmp_path: Path) -> None:
    sock_dir = os.path.dirname(docker_daemon.socket)
    binds = {**TEST_BINDS, sock_dir: "/mnt/daemon"}
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", read_only_binds=binds) as eng:
        ws = await eng.manager.create_workspace("sock")
        with pytest.raises(PolicyViolation, match="socket"):
            await eng.runner.run_program(ws, sh("true"))


# -- files -----------------------------------------------------------------------------------------


async def test_files_round_trip_and_belong_to_the_container_user(
    engine: execspace.BaseEngine, ws: execspace.Workspace
) -> None:
    await engine.fs.put_files(ws, [PutFile("work/in.txt", b"abc")])
    r = await engine.runner.run_program(
        ws, sh("cat in.txt > ../out/copy.txt; echo more >> in.txt; echo made > ../out/new.txt")
    )
    assert r.exit_code == 0, r.stderr
    files = {f.name: f.content for f in await engine.fs.collect(ws, ["out/**"])}
    assert files == {"out/copy.txt": b"abc", "out/new.txt": b"made\n"}
    assert ws.host_path is not None
    assert (ws.host_path / "out/new.txt").stat().st_uid == CONTAINER_UID


async def test_collect_never_follows_planted_symlinks(
    engine: execspace.BaseEngine, ws: execspace.Workspace, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST SECRET")
    script = f"""
cd /workspace/out
echo fine > ok.txt
ln -s {secret} host-link
ln -s /etc/passwd container-link
ln -s / root-link
ln -s ../metadata.json meta-link
"""
    r = await engine.runner.run_program(ws, sh(script))
    assert r.exit_code == 0, r.stderr
    files = await engine.fs.collect(ws, ["out/**", "out/*-link", "out/root-link/etc/*"])
    assert [(f.name, f.content) for f in files] == [("out/ok.txt", b"fine\n")]
    assert all(b"HOST SECRET" not in f.content and b"root:" not in f.content for f in files)


# -- lifecycle -------------------------------------------------------------------------------------


async def test_containers_are_removed_with_workspace_and_engine(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    before = _our_containers(docker_daemon)
    # no pool: its own containers are counted in test_container_pool.py
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0) as eng:
        a = await eng.manager.create_workspace("a")
        b = await eng.manager.create_workspace("b")
        await eng.runner.run_program(a, sh("true"))
        await eng.runner.run_program(b, sh("true"))
        assert len(_our_containers(docker_daemon) - before) == 2
        await eng.manager.cleanup(a)
        assert len(_our_containers(docker_daemon) - before) == 1
    assert _our_containers(docker_daemon) - before == set()


async def test_runs_in_one_workspace_share_its_container(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    await engine.runner.run_program(ws, sh("echo kept > /tmp/state"))
    r = await engine.runner.run_program(ws, sh("cat /tmp/state"))
    assert r.stdout == "kept\n"


async def test_kill_right_after_start_leaves_nothing(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    """A kill that lands before the daemon has started the exec's process must still stop the program."""
    assert ws.host_path is not None
    tag = new_tag("early")
    for i in range(8):
        handle = await engine.runner.start_program(ws, sh(f"sleep 0.7; touch $WORK_DIR/survived-{i}", env=tagged(tag)))
        await asyncio.sleep(0.01 * (i % 4))  # different moments of the exec's start
        await handle.kill()
        await handle.wait()
    assert not wait_no_process(tag), "a killed program is left"
    assert not list((ws.host_path / "work").glob("survived-*"))


async def test_languages_come_from_the_image_label_and_code_runs_with_them(
    engine: execspace.BaseEngine, docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    assert {"python", "bash"} <= set(engine.describe().languages)  # the test image declares what host /usr has
    run = execspace.CodeExecutor(engine, timeout=30)
    result = await run.execute_code(execspace.CodeExecutionInput([execspace.CodeBlock("python", "print(6 * 7)")]))
    assert result.ok and result.output.strip() == "42", result
    async with container_engine(docker_daemon, test_image, tmp_path / "b", pool_size=0, languages=["bash"]) as eng:
        assert eng.describe().languages == ("bash",)
    with pytest.raises(InvalidSpec, match="unknown languages"):
        async with container_engine(docker_daemon, test_image, tmp_path / "c", pool_size=0, languages=["cobol"]):
            pass
    with pytest.raises(SetupFailed, match="no image") as info:
        async with container_engine(docker_daemon, "execspace-test/no-such-image:1", tmp_path / "d", pool_size=0):
            pass
    assert "execspace image build" in info.value.fix


async def test_kill_after_the_grace_takes_a_child_that_ignored_term(
    engine: execspace.BaseEngine, ws: execspace.Workspace
) -> None:
    """The TERM phase ends when the stream does; a child that ignored TERM and closed its output goes too."""
    tag = new_tag("stubborn")
    script = "(trap '' TERM; exec sleep 300 >/dev/null 2>&1) & echo ready; sleep 300"
    async with await engine.runner.start_program(ws, sh(script, env=tagged(tag))) as handle:
        assert (await asyncio.wait_for(anext(handle.stream()), 5)).data == b"ready\n"
        await wait_processes(tag, 3)  # the shell and both sleeps
        await handle.kill()
        r = await asyncio.wait_for(handle.wait(), 10)
    assert r.exit_code == -signal.SIGTERM
    assert not wait_no_process(tag), "the child that ignored SIGTERM is left"
