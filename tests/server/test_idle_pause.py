"""Pause on real idleness (``execspace serve --idle-pause``), through the official SDK against a real server: an
``autoPause`` sandbox whose programs use no CPU and that holds no request is paused (its processes held, as the host
sees them) and its next request resumes it, ``autoResume`` or not; one whose program computes, or whose client
holds a stream open, is never paused, nor one without ``autoPause`` or of a template with ``idle_pause = 0``; its
lifetime clock counts running time only; a request that meets a pause under way waits for it and is answered."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from e2b import Sandbox, SandboxState
from e2b.exceptions import SandboxNotRunningException

from execspace.testing.processes import new_tag, pids_with, tagged, wait_no_process
from tests.support import held_still, until

from .conftest import Server, configured_server, in_homes, running_server

#: Seconds of idleness after which the module's server pauses an autoPause sandbox.
IDLE = 2
CONFIG = """
[templates.awake]
idle_pause = 0
"""
AUTO_PAUSE = {"on_timeout": "pause"}


@pytest.fixture(scope="module")
def e2b_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """This module's server (the conftest's SDK environment points at it): idle sandboxes pause after ``IDLE``."""
    with configured_server(tmp_path_factory.mktemp("idle"), CONFIG, "--idle-pause", str(IDLE)) as server:
        yield server


def _state(sandbox: Sandbox) -> SandboxState:
    return Sandbox.get_info(sandbox.sandbox_id).state


def _idle_sandbox(**kwargs: object) -> Sandbox:
    """An autoPause sandbox whose only program sleeps, its command's stream let go."""
    sandbox = Sandbox.create(lifecycle=AUTO_PAUSE, **kwargs)  # type: ignore[arg-type]
    sandbox.commands.run("sleep 600", background=True).disconnect()
    return sandbox


def _until_paused(sandbox: Sandbox, within: float = 4 * IDLE + 10) -> None:
    until(f"sandbox {sandbox.sandbox_id} paused", lambda: _state(sandbox) is SandboxState.PAUSED, within=within)


def _while_another_pauses_twice(check: Callable[[], None]) -> None:
    """Run ``check`` until an idle sandbox created now has been paused for its idleness twice (resumed by a command
    in between): whatever was set up before it had as long to be found idle."""
    reference = _idle_sandbox()
    try:
        for _ in range(2):
            deadline = time.monotonic() + 4 * IDLE + 10
            while _state(reference) is not SandboxState.PAUSED:
                check()
                assert time.monotonic() < deadline, "the reference sandbox was never paused"
                time.sleep(0.2)
            check()
            assert reference.commands.run("true").exit_code == 0
    finally:
        reference.kill()


def test_an_idle_sandbox_is_paused_and_its_next_command_resumes_it(e2b_server: Server) -> None:
    tag = new_tag("idle-pause")
    sandbox = Sandbox.create(lifecycle=AUTO_PAUSE, timeout=120)  # no autoResume: the idle pause is the server's
    try:
        # a reader blocked on a FIFO: once resumed it must really run again to pass on what the next command writes
        handle = sandbox.commands.run("mkfifo pipe && cat pipe > got", background=True, envs=tagged(tag))
        handle.disconnect()
        until("the reader blocked on its FIFO", lambda: any(_is_reader(pid) for pid in pids_with(tag)))
        _until_paused(sandbox)
        until("its processes held still", lambda: all(held_still(pid) for pid in pids_with(tag)))
        pids = pids_with(tag)

        assert sandbox.commands.run("echo woken > pipe").exit_code == 0
        assert _state(sandbox) is SandboxState.RUNNING
        assert wait_no_process(tag, within=15) == []  # the reader read, wrote and ended
        assert not any(held_still(pid) for pid in pids)
        assert [p.read_text() for p in in_homes(e2b_server.root, "got")] == ["woken\n"]
    finally:
        sandbox.kill()


def test_an_idle_sandbox_pauses_again_and_every_request_kind_wakes_it() -> None:
    sandbox = _idle_sandbox(timeout=120)
    try:
        sandbox.files.write("kept.txt", "kept")
        _until_paused(sandbox)
        assert sandbox.files.read("kept.txt") == "kept"  # the file API wakes it too
        assert _state(sandbox) is SandboxState.RUNNING
        _until_paused(sandbox)
        assert sandbox.is_running()  # so does envd's health check of its owner
        _until_paused(sandbox)
        assert sandbox.commands.run("cat kept.txt").stdout == "kept"
    finally:
        sandbox.kill()


def test_a_pause_its_owner_asks_for_while_idle_paused_is_theirs() -> None:
    """Asked to pause an idle-paused sandbox, the server makes the pause the owner's: its traffic no longer
    resumes it (it has no autoResume), connect does."""
    sandbox = _idle_sandbox(timeout=120)
    try:
        _until_paused(sandbox)
        assert Sandbox.pause(sandbox.sandbox_id) is True
        with pytest.raises(SandboxNotRunningException):
            sandbox.commands.run("true")
        Sandbox.connect(sandbox.sandbox_id)
        assert sandbox.commands.run("echo back").stdout == "back\n"
    finally:
        sandbox.kill()


def test_the_lifetime_clock_counts_running_time_only() -> None:
    """Created with 8 s to live, idle-paused after about ``IDLE``: past those 8 s it is still there, paused (not
    paused by its timeout, which only connect would resume here), and resumed it has what was left."""
    lifetime = 8
    sandbox = _idle_sandbox(timeout=lifetime)
    created = time.monotonic()
    try:
        _until_paused(sandbox)
        running = time.monotonic() - created
        while time.monotonic() - created < lifetime + 2:  # past its timeout, watched all along
            assert _state(sandbox) is SandboxState.PAUSED
            time.sleep(0.2)
        assert sandbox.commands.run("echo still").stdout == "still\n"  # an idle pause: its traffic resumes it
        left = (Sandbox.get_info(sandbox.sandbox_id).end_at - datetime.now(UTC)).total_seconds()
        assert 0 < left <= lifetime - running + 1
    finally:
        sandbox.kill()


def test_a_sandbox_whose_program_computes_is_never_paused() -> None:
    tag = new_tag("idle-busy")
    busy = Sandbox.create(lifecycle=AUTO_PAUSE, timeout=120)
    try:
        busy.commands.run("while :; do :; done", background=True, envs=tagged(tag)).disconnect()

        def still_running() -> None:
            assert _state(busy) is SandboxState.RUNNING
            assert not any(held_still(pid) for pid in pids_with(tag))

        _while_another_pauses_twice(still_running)
    finally:
        busy.kill()
    assert wait_no_process(tag, within=15) == []


@pytest.mark.parametrize("how", ["waited", "on_stdout"])
def test_a_sandbox_whose_client_holds_a_stream_is_never_paused(how: str) -> None:
    """A quiet ``sleep`` uses no CPU, but its command's output stream is open: the client waits on it (``wait``, or
    a background command with ``on_stdout``)."""
    sandbox = Sandbox.create(lifecycle=AUTO_PAUSE, timeout=120)
    try:
        seen: list[str] = []
        if how == "waited":
            handle = sandbox.commands.run("sleep 600", background=True)
        else:
            handle = sandbox.commands.run("sleep 600", background=True, on_stdout=seen.append)
        waiter = threading.Thread(target=lambda: _wait_quietly(handle.wait), daemon=True)
        waiter.start()
        _while_another_pauses_twice(lambda: _assert_running(sandbox))
        handle.kill()
        waiter.join(timeout=30)
        assert not waiter.is_alive()
    finally:
        sandbox.kill()


def test_a_cell_being_executed_keeps_its_sandbox_running() -> None:
    """The cell blocks on a FIFO (no CPU) for as long as the test wants, its ``/execute`` stream open."""
    ci = pytest.importorskip("e2b_code_interpreter")
    sandbox = ci.Sandbox.create(lifecycle=AUTO_PAUSE, timeout=120)
    try:
        assert sandbox.commands.run("mkfifo gate").exit_code == 0
        result: list[str | None] = []
        cell = threading.Thread(target=lambda: result.append(sandbox.run_code("open('gate').read().strip()").text))
        cell.start()
        _while_another_pauses_twice(lambda: _assert_running(sandbox))
        assert sandbox.commands.run("echo opened > gate").exit_code == 0
        cell.join(timeout=60)
        assert result == ["opened"]
    finally:
        sandbox.kill()


@pytest.mark.parametrize("how", ["no autoPause", "template idle_pause = 0"])
def test_sandboxes_the_idle_pause_is_not_for_are_never_paused(how: str) -> None:
    if how == "no autoPause":
        sandbox = Sandbox.create(timeout=120)
    else:
        sandbox = Sandbox.create(template="awake", lifecycle=AUTO_PAUSE, timeout=120)
    try:
        _while_another_pauses_twice(lambda: _assert_running(sandbox))
    finally:
        sandbox.kill()


def test_requests_that_meet_a_pause_under_way_wait_for_it_and_are_answered() -> None:
    """Commands sent around the moment the sandbox turns idle (some before, some during, some after its pause):
    every one is answered, none sees an error."""
    sandbox = _idle_sandbox(timeout=300)
    rng = random.Random(34)
    try:
        for i in range(12):
            time.sleep(IDLE + rng.uniform(-0.3, 1.5))  # the stimulus: a request near the pause, not a wait for it
            assert sandbox.commands.run(f"echo {i}").stdout == f"{i}\n"
    finally:
        sandbox.kill()


def _is_reader(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes() == b"cat\0pipe\0"
    except OSError:
        return False


def test_without_a_cgroup_the_cpu_is_read_from_proc_and_the_pause_is_sigstop(tmp_path: Path) -> None:
    """The local backend: no cgroup counts or holds its programs; their CPU times are summed from /proc, and the
    idle pause stops them with SIGSTOP (state T, as the host sees them); the next command continues them."""
    tag = new_tag("idle-local")
    flags = ("--backend", "local", "--kernel-environment", "none", "--allow-internet-access", "--allow-host-network")
    with running_server(tmp_path / "ws", *flags, "--idle-pause", str(IDLE)) as server:
        api = {"api_key": server.key, "api_url": server.url, "sandbox_url": server.url}
        sandbox = Sandbox.create(lifecycle=AUTO_PAUSE, timeout=120, allow_internet_access=True, **api)
        try:
            sandbox.commands.run("sleep 600", background=True, envs=tagged(tag)).disconnect()
            until("the sleep started", lambda: bool(pids_with(tag)))
            state = lambda: Sandbox.get_info(sandbox.sandbox_id, **api).state  # noqa: E731
            until("the sandbox paused", lambda: state() is SandboxState.PAUSED, within=4 * IDLE + 10)
            assert pids_with(tag) and all(held_still(pid) for pid in pids_with(tag))
            assert sandbox.commands.run("echo on").stdout == "on\n"
            assert state() is SandboxState.RUNNING
            assert not any(held_still(pid) for pid in pids_with(tag))
        finally:
            sandbox.kill()
    assert wait_no_process(tag, within=15) == []


def _assert_running(sandbox: Sandbox) -> None:
    assert _state(sandbox) is SandboxState.RUNNING


def _wait_quietly(wait: Callable[[], object]) -> None:
    with contextlib.suppress(Exception):  # killed at the end of the test: its exit is no failure
        wait()
