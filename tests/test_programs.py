"""The shared pieces of the process API (execspace.process.programs), without a backend: the conformance kit
checks them through every runner."""

from __future__ import annotations

import pytest

from execspace import BackendError, OutputChunk, ProgramNotFound, RunProgramSpec, Workspace
from execspace.process.programs import OutputLog, ProgramTable, program_info

pytestmark = pytest.mark.asyncio


def chunk(data: bytes) -> OutputChunk:
    return OutputChunk("stdout", data)


async def test_history_is_a_prefix_and_late_readers_see_it_then_the_end() -> None:
    log = OutputLog(history=8)
    for part in (b"abc", b"defg", b"hij"):  # "hij" would pass 8 bytes: the history stops before it
        log.append(chunk(part))
    log.append(chunk(b"k"))  # nor does anything after a gap join it
    log.close()
    assert [c.data async for c in log.attach()] == [b"abc", b"defg"]
    assert [c.data async for c in log.attach(from_start=False)] == []


async def test_a_reader_that_falls_behind_is_cut_off_and_the_others_go_on() -> None:
    log = OutputLog(history=0, reader_buffer=10)
    slow, fast = log.attach(), log.attach()
    got_fast = []
    for part in (b"12345", b"67890", b"x"):  # the slow reader reads nothing: 11 bytes behind after "x"
        log.append(chunk(part))
        got_fast.append((await anext(fast)).data)
    log.close()
    assert got_fast == [b"12345", b"67890", b"x"] and [c.data async for c in fast] == []
    kept = [(await anext(slow)).data, (await anext(slow)).data]
    assert kept == [b"12345", b"67890"]
    with pytest.raises(BackendError, match="fell more than 10 bytes behind"):
        await anext(slow)


class _Handle:
    def __init__(self, pid: int, tag: str | None) -> None:
        self.info = program_info(RunProgramSpec("sleep", ["1"], tag=tag), pid)


async def test_table_finds_by_pid_and_newest_tag_per_workspace() -> None:
    table = ProgramTable()
    a, b = Workspace("a", "/w", "x"), Workspace("b", "/w", "x")
    first, second = _Handle(10, "srv"), _Handle(11, "srv")
    forget_first = table.add(a, first)  # type: ignore[arg-type]  # only .info is used
    table.add(a, second)  # type: ignore[arg-type]
    assert [i.pid for i in table.list(a)] == [10, 11] and table.list(b) == []
    assert table.get(a, "srv") is second and table.get(a, 10) is first
    forget_first()
    forget_first()  # idempotent
    assert [i.pid for i in table.list(a)] == [11]
    for ws, key in ((a, 10), (b, "srv"), (a, "other")):
        with pytest.raises(ProgramNotFound, match="list_programs"):
            table.get(ws, key)
