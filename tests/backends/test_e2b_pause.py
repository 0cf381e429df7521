"""Pause and resume on the e2b backend, against a real ``execspace serve`` (which pauses sandboxes): a paused
workspace's program stops (its counter, seen from the host, stands still) and continues on resume, on the next
call, or when another engine finds the session again; cleanup while paused leaves no process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import execspace
from execspace import CapabilityError, PutFile, RunProgramSpec
from execspace.testing.processes import new_tag, tagged, wait_no_process

pytest.importorskip("e2b", reason="the e2b backend needs the official SDK (pip install 'execspace[e2b]')")
pytest.importorskip("uvicorn", reason="the tests run against execspace serve (pip install 'execspace[serve]')")

from e2b import AsyncSandbox, SandboxQuery, SandboxState

from tests.backends import test_e2b as e2b_suite
from tests.backends.test_e2b import _connection, _engine, _running
from tests.server.conftest import Server
from tests.support import files_named

mark = e2b_suite.mark  # the fixture: metadata unique to a test, whose sandboxes are killed after it

COUNTER = 'i=0; while :; do i=$((i+1)); echo "$i" > "$EXECSPACE_TEST_RUN_TAG.count"; sleep 0.02; done'


async def _until(what: str, check: object, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {within}s")
        await asyncio.sleep(0.05)


def _count(path: Path) -> int:
    try:
        return int(path.read_text() or 0)
    except (FileNotFoundError, ValueError):  # between the shell's truncation and its write
        return 0


async def _counter(server: Server, tag: str) -> Path:
    found: list[Path] = []
    await _until("the counter written", lambda: found.extend(files_named(server.root, f"{tag}.count")) or found)
    return found[0]


async def _stands_still(path: Path) -> int:
    """The counter's value once two reads half a second apart agree (bounded), checked once more a second later."""
    values = [_count(path)]
    deadline = time.monotonic() + 10
    while True:
        await asyncio.sleep(0.5)
        values.append(_count(path))
        if values[-1] == values[-2]:
            break
        assert time.monotonic() < deadline, "the counter did not stop"
    await asyncio.sleep(1.0)
    assert _count(path) == values[-1], "the counter went on while the sandbox was paused"
    return values[-1]


async def _grows_past(path: Path, value: int) -> None:
    await _until(f"the counter grew past {value}", lambda: _count(path) > value + 5)


async def _state(server: Server, mark: str) -> SandboxState:
    """The state of the test's one sandbox, as the service lists it."""
    query = SandboxQuery(metadata={"execspace.test": mark})
    (listed,) = await AsyncSandbox.list(query=query, **_connection(server)).next_items()
    return listed.state


async def test_pause_stops_a_program_and_resume_or_the_next_call_continues_it(e2b_server: Server, mark: str) -> None:
    tag = new_tag("e2b-pause")
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as engine:
        assert "pause" in engine.describe().details
        ws = await engine.manager.create_workspace("pause-ws")
        await engine.fs.put_files(ws, [PutFile("work/kept.txt", b"kept")])
        # started beside the engine, not followed: it outlives this engine (whose program handles end with it)
        (sandbox_id,) = await _running(e2b_server, **{"execspace.test": mark})
        sdk = await AsyncSandbox.connect(sandbox_id, **_connection(e2b_server))
        await (await sdk.commands.run(COUNTER, background=True, envs=tagged(tag))).disconnect()
        counter = await _counter(e2b_server, tag)
        await _grows_past(counter, 0)

        await engine.manager.pause(ws)
        assert await _state(e2b_server, mark) is SandboxState.PAUSED
        stopped = await _stands_still(counter)
        await engine.manager.resume(ws)
        assert await _state(e2b_server, mark) is SandboxState.RUNNING
        await _grows_past(counter, stopped)

        await engine.manager.pause(ws)
        await engine.manager.pause(ws)  # paused already: nothing to do
        stopped = await _stands_still(counter)
        assert (await engine.fs.read_file(ws, "work/kept.txt")).content == b"kept"  # the call resumed it
        assert await _state(e2b_server, mark) is SandboxState.RUNNING
        await _grows_past(counter, stopped)
        await engine.manager.pause(ws)
    # per session the sandbox stays, paused; the next engine finds it and connecting resumes it
    async with _engine(e2b_server, metadata={"execspace.test": mark}) as second:
        again = await second.manager.get_workspace("pause-ws")
        assert await _state(e2b_server, mark) is SandboxState.RUNNING
        await _grows_past(counter, _count(counter))
        result = await second.runner.run_program(again, RunProgramSpec("cat", ["kept.txt"], cwd="work"))
        assert result.stdout == "kept"
        await second.manager.pause(again)
        await second.manager.cleanup(again)  # kills the paused sandbox
        assert wait_no_process(tag, within=15) == []
    assert await _running(e2b_server, **{"execspace.test": mark}) == {}


async def test_a_sandbox_given_by_id_is_not_ours_to_pause(e2b_server: Server) -> None:
    given = await AsyncSandbox.create(template="base", **_connection(e2b_server))
    try:
        async with execspace.open_engine(
            "e2b", **_connection(e2b_server), template="base", sandbox_id=given.sandbox_id
        ) as engine:
            ws = await engine.manager.create_workspace("shared-ws")
            with pytest.raises(CapabilityError, match="sandbox_id"):
                await engine.manager.pause(ws)
        assert await given.is_running()
    finally:
        await given.kill()
