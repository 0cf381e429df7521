"""Pause and resume through the official SDK against a real ``execspace serve``: a paused sandbox's programs and
kernels stop where they are (a counter stops growing, seen from the host) and continue on connect; its files and
contexts are intact; kill while paused, auto-pause on timeout, auto-resume, and a server ending with one paused."""

from __future__ import annotations

import os
import shutil
import signal
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxException, SandboxNotRunningException

from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process
from tests.redteam.test_round3_pause import ATTACK, CHILDREN, all_ticking, nothing_runs
from tests.support import until

from .conftest import Server, in_homes, running_server

ci = pytest.importorskip("e2b_code_interpreter", reason="pip install 'execspace[dev]' (e2b-code-interpreter)")

#: A shell loop writing how often it went round into a file named by its tag.
COUNTER = 'i=0; while :; do i=$((i+1)); echo "$i" > "$HOME/$EXECSPACE_TEST_RUN_TAG.count"; sleep 0.02; done'
#: A thread of the Python kernel doing the same (path relative: the kernel works in the home, seen elsewhere).
KERNEL_COUNTER = """
import threading, time
def _tick(path):
    n = 0
    while True:
        n += 1
        with open(path + ".tmp", "w") as f:
            f.write(str(n))
        __import__("os").replace(path + ".tmp", path)
        time.sleep(0.02)
threading.Thread(target=_tick, args=({path!r},), daemon=True).start()
"""


def _host_file(root: Path, name: str) -> Path:
    found: list[Path] = []
    until(f"{name} written", lambda: found.extend(in_homes(root, name)) or found)
    return found[0]


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):  # between the shell's truncation and its write
        return 0


def _stands_still(path: Path) -> int:
    """The counter's value once two reads half a second apart agree (bounded), checked once more a second later."""
    values = [_count(path)]

    def settled() -> bool:
        time.sleep(0.5)
        values.append(_count(path))
        return values[-1] == values[-2]  # 0 too: the shell may be stopped between truncating and writing

    until("the counter stopped", settled, within=10)
    time.sleep(1.0)
    assert _count(path) == values[-1], "the counter went on while the sandbox was paused"
    return values[-1]


def _grows_past(path: Path, value: int) -> None:
    until(f"the counter grew past {value}", lambda: _count(path) > value + 5)


def _loops(tag: str) -> set[int]:
    """The counter's shell (not the ``sleep`` it forks each turn: between its fork and its exec that child still
    shows the shell's command line, so a process whose parent is a loop is not one)."""
    found: dict[int, int] = {}
    for pid in pids_with(tag):
        try:
            if b"while" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found[pid] = int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    return {pid for pid, parent in found.items() if parent not in found}


def _state(sandbox_id: str) -> SandboxState:
    return Sandbox.get_info(sandbox_id).state


def test_pause_stops_programs_and_kernels_and_connect_continues_them(sbx: ci.Sandbox, e2b_server: Server) -> None:
    tag = new_tag("serve-pause")
    sbx.files.write("/home/user/kept.bin", bytes(range(256)))
    sbx.commands.run(COUNTER, background=True, envs=tagged(tag))
    assert sbx.run_code("x = 41").error is None
    kernel_tag = new_tag("kernel")
    assert sbx.run_code(KERNEL_COUNTER.format(path=f"{kernel_tag}.count")).error is None
    counter = _host_file(e2b_server.root, f"{tag}.count")
    kernel_counter = _host_file(e2b_server.root, f"{kernel_tag}.count")
    _grows_past(counter, 0)
    _grows_past(kernel_counter, 0)
    loops = _loops(tag)
    assert loops

    sbx.pause()
    assert _state(sbx.sandbox_id) is SandboxState.PAUSED
    paused = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED])).next_items()}
    running = {s.sandbox_id for s in Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING])).next_items()}
    assert sbx.sandbox_id in paused and sbx.sandbox_id not in running
    stopped, kernel_stopped = _stands_still(counter), _stands_still(kernel_counter)
    with pytest.raises(SandboxNotRunningException):  # envd refuses it as E2B's proxy does
        sbx.commands.run("true")
    assert not sbx.is_running()
    assert Sandbox.pause(sbx.sandbox_id) is False  # paused already (409)

    again = ci.Sandbox.connect(sbx.sandbox_id)
    assert _state(sbx.sandbox_id) is SandboxState.RUNNING
    _grows_past(counter, stopped)
    _grows_past(kernel_counter, kernel_stopped)
    assert _loops(tag) == loops  # the same shell, continued
    assert again.files.read("/home/user/kept.bin", format="bytes") == bytes(range(256))
    assert again.run_code("x + 1").text == "42"
    assert again.commands.run("echo after").stdout == "after\n"


@pytest.mark.skipif(shutil.which("node") is None, reason="JavaScript contexts run on Node.js")
def test_a_javascript_context_outlives_a_pause(sbx: ci.Sandbox) -> None:
    assert sbx.run_code("globalThis.kept = 7", language="js").error is None  # type: ignore[arg-type]
    sbx.pause()
    ci.Sandbox.connect(sbx.sandbox_id)
    assert sbx.run_code("kept * 6", language="js").text == "42"  # type: ignore[arg-type]


def test_the_lifetime_clock_stops_while_paused() -> None:
    sbx = Sandbox.create(timeout=60)
    try:
        created = time.monotonic()
        sbx.pause()
        before_pause = time.monotonic() - created
        time.sleep(3)  # long enough that a running clock would show
        Sandbox.connect(sbx.sandbox_id)
        left = (Sandbox.get_info(sbx.sandbox_id).end_at - datetime.now(UTC)).total_seconds()
        assert 60 - before_pause - 1.5 < left <= 60
    finally:
        sbx.kill()


def test_kill_while_paused_leaves_no_process_and_no_file(e2b_server: Server) -> None:
    tag = new_tag("serve-pause-kill")
    sbx = Sandbox.create()
    sbx.commands.run(f"sleep 600 & {COUNTER}", background=True, envs=tagged(tag))
    counter = _host_file(e2b_server.root, f"{tag}.count")
    sbx.pause()
    _stands_still(counter)
    assert sbx.kill() is True
    assert wait_no_process(tag, within=15) == []
    until("its workspace removed", lambda: not counter.exists())
    with pytest.raises(NotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_auto_pause_on_timeout_and_auto_resume_by_traffic(e2b_server: Server) -> None:
    tag = new_tag("serve-autopause")
    sbx = Sandbox.create(timeout=2, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        info = sbx.get_info()
        assert info.lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sbx.commands.run(COUNTER, background=True, envs=tagged(tag))
        counter = _host_file(e2b_server.root, f"{tag}.count")
        until("the sandbox paused at its timeout", lambda: _state(sbx.sandbox_id) is SandboxState.PAUSED)
        stopped = _stands_still(counter)
        assert sbx.commands.run("echo awake").stdout == "awake\n"  # its traffic resumed it
        assert _state(sbx.sandbox_id) is SandboxState.RUNNING
        _grows_past(counter, stopped)
    finally:
        sbx.kill()
    assert wait_no_process(tag, within=15) == []


def test_auto_pause_without_auto_resume_waits_for_connect(e2b_server: Server) -> None:
    sbx = Sandbox.create(timeout=1, lifecycle={"on_timeout": "pause"})
    try:
        sbx.files.write("/home/user/f.txt", "kept")
        until("the sandbox paused at its timeout", lambda: _state(sbx.sandbox_id) is SandboxState.PAUSED)
        with pytest.raises(SandboxNotRunningException):
            sbx.files.read("/home/user/f.txt")
        again = Sandbox.connect(sbx.sandbox_id, timeout=30)
        assert again.files.read("/home/user/f.txt") == "kept"
        left = (Sandbox.get_info(sbx.sandbox_id).end_at - datetime.now(UTC)).total_seconds()
        assert 25 < left <= 30
    finally:
        sbx.kill()


def test_what_is_not_implemented_says_so(e2b_server: Server) -> None:
    sbx = Sandbox.create()
    try:
        with pytest.raises(SandboxException, match=r"501.*without memory"):
            sbx.pause(mode="filesystem")
        sbx.pause()
        with pytest.raises(SandboxException, match=r"501.*without memory"):
            Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
        headers = {"X-API-KEY": e2b_server.key}
        resumed = httpx.post(f"{e2b_server.url}/sandboxes/{sbx.sandbox_id}/resume", json={}, headers=headers)
        assert resumed.status_code == 201 and resumed.json()["sandboxID"] == sbx.sandbox_id
        again = httpx.post(f"{e2b_server.url}/sandboxes/{sbx.sandbox_id}/resume", json={}, headers=headers)
        assert again.status_code == 409
    finally:
        sbx.kill()


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_that_ends_takes_its_paused_sandboxes_with_it(tmp_path: Path, how: int) -> None:
    """A paused sandbox lives in the server's memory: stopped, the server kills it like any other; killed, its
    programs die with it and the next server on the root removes its files; connect then answers not found."""
    tag = new_tag("serve-pause-end")
    root = tmp_path / "ws"
    with running_server(root) as first:
        api = {"api_key": first.key, "api_url": first.url, "sandbox_url": first.url}
        sbx = Sandbox.create(**api)
        sbx.commands.run(f"sleep 600 & {COUNTER}", background=True, envs=tagged(tag))
        counter = _host_file(root, f"{tag}.count")
        sbx.pause()
        _stands_still(counter)
        first.process.send_signal(how)
        first.process.wait(timeout=30)
    assert wait_no_process(tag, within=15) == []
    with running_server(root) as second:
        until("its workspace removed", lambda: not counter.exists())
        with pytest.raises(SandboxException, match="not found"):
            Sandbox.connect(sbx.sandbox_id, api_key=second.key, api_url=second.url, sandbox_url=second.url)


@pytest.mark.parametrize("mode", ["wake", "fork"])
def test_a_program_that_fights_the_pause_is_never_reported_paused_while_running(e2b_server: Server, mode: str) -> None:
    """Children that wake each other (SIGCONT) or fork without end: paused, none of them runs (the cgroup freezer as
    root); else the pause fails with the server's message and the sandbox runs on, its clock too."""
    tag = new_tag(f"serve-fight-{mode}")
    sbx = Sandbox.create(timeout=120)
    try:
        sbx.files.write("/home/user/attack.py", ATTACK)
        sbx.commands.run(f"python3 attack.py {mode} {CHILDREN} 90 {tag}.", background=True, envs=tagged(tag))
        work = _host_file(e2b_server.root, f"{tag}.tick.0").parent
        all_ticking(work, f"{tag}.")
        end_at = Sandbox.get_info(sbx.sandbox_id).end_at
        try:
            sbx.pause()
        except SandboxException as exc:
            assert os.geteuid() != 0, f"as root the cgroup freezer holds any tree: {exc}"
            assert "was not paused and runs on" in str(exc)
            assert _state(sbx.sandbox_id) is SandboxState.RUNNING
            assert Sandbox.get_info(sbx.sandbox_id).end_at == end_at
        else:
            assert _state(sbx.sandbox_id) is SandboxState.PAUSED
            nothing_runs(tag, work, f"{tag}.")
            Sandbox.connect(sbx.sandbox_id)
        all_ticking(work, f"{tag}.")
    finally:
        sbx.kill()
    assert wait_no_process(tag, within=15) == []


#: A counter that three processes outside its tree (escaped with ``setsid``) wake with SIGCONT until it is gone:
#: signals, the local backend's only way, cannot hold it.
WOKEN_COUNTER = (
    'me=$$; for w in 1 2 3; do setsid -f sh -c "while kill -CONT $me 2>/dev/null; do :; done"; done; ' + COUNTER
)


def test_a_pause_that_cannot_hold_fails_and_leaves_the_sandbox_running(tmp_path: Path) -> None:
    tag = new_tag("serve-pause-fails")
    # the local backend has no network off, nor an egress proxy: its sandboxes get the host's network
    flags = ("--backend", "local", "--kernel-environment", "none", "--allow-internet-access", "--allow-host-network")
    with running_server(tmp_path / "ws", *flags) as server:
        api = {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}
        sbx = Sandbox.create(timeout=120, allow_internet_access=True, **api)
        try:
            sbx.commands.run(WOKEN_COUNTER, background=True, envs=tagged(tag))
            counter = _host_file(server.root, f"{tag}.count")
            _grows_past(counter, 0)
            end_at = Sandbox.get_info(sbx.sandbox_id, **api).end_at
            with pytest.raises(SandboxException, match=r"500.*was not paused and runs on.*could not all be stopped"):
                sbx.pause()
            info = Sandbox.get_info(sbx.sandbox_id, **api)
            assert info.state is SandboxState.RUNNING and info.end_at == end_at  # its clock never stopped
            _grows_past(counter, _count(counter))
            assert sbx.commands.run("echo still here").stdout == "still here\n"
        finally:
            sbx.kill()
        assert wait_no_process(tag, within=15) == []
