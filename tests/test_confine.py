"""File confinement: every way a planted path could reach outside the workspace.

Each test plants the attack with real files, then checks what the host observes:
the canary files outside keep their content and mtime, and nothing new appears
next to them.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from execspace import BackendError, BaseEngine, File, LimitExceeded, PathDenied, PutFile, Workspace
from execspace.protocols import SupportsFileStreams
from execspace.workspace.hostfs import STREAM_CHUNK, HostWorkspaceFS

CANARY = b"CANARY: host content that must never leave or change\n"


def snapshot(directory: Path) -> dict[str, tuple[bytes, int]]:
    """Content and mtime of every file under ``directory`` (without following links)."""
    state: dict[str, tuple[bytes, int]] = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else b""
            state[str(p.relative_to(directory))] = (data, st.st_mtime_ns)
    return state


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory next to the workspace root, holding a canary file."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "canary.txt").write_bytes(CANARY)
    return d


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


def no_canary(files: list[File]) -> bool:
    return all(CANARY not in f.content for f in files)


# -- '..' and absolute paths ------------------------------------------------------------


@pytest.mark.parametrize("path", ["../escape.txt", "work/../../escape.txt", "out/./../../../escape.txt", ".."])
async def test_put_refuses_dotdot(engine: BaseEngine, ws: Workspace, tmp_path: Path, path: str) -> None:
    before = snapshot(tmp_path / "ws")
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(path, "x")])
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "ws" / "escape.txt").exists()
    assert snapshot(tmp_path / "ws") == before


async def test_put_refuses_absolute(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    target = outside / "canary.txt"
    before = snapshot(outside)
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(str(target), "overwritten")])
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(str(outside / "new.txt"), "x")])
    assert snapshot(outside) == before


async def test_put_checks_every_path_before_writing_any(engine: BaseEngine, ws: Workspace) -> None:
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile("out/first.txt", "1"), PutFile("../second.txt", "2")])
    assert not (host(ws) / "out" / "first.txt").exists()


async def test_read_and_collect_refuse_dotdot_and_absolute(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    rel_canary = os.path.relpath(outside / "canary.txt", host(ws))
    assert rel_canary.startswith("..")
    for path in (rel_canary, str(outside / "canary.txt"), "work/../../outside/canary.txt"):
        with pytest.raises(PathDenied):
            await engine.fs.read_file(ws, path)
    for pattern in (f"{outside}/*", "../**", "out/../../outside/*", "../outside/canary.txt"):
        with pytest.raises(PathDenied):
            await engine.fs.collect(ws, [pattern])


# -- symlinks -------------------------------------------------------------------------------


async def test_symlinked_file_is_replaced_on_write_not_written_through(
    engine: BaseEngine, ws: Workspace, outside: Path
) -> None:
    link = host(ws) / "out" / "report.txt"
    link.symlink_to(outside / "canary.txt")
    before = snapshot(outside)
    await engine.fs.put_files(ws, [PutFile("out/report.txt", "mine")])
    assert snapshot(outside) == before
    assert not link.is_symlink()
    assert link.read_bytes() == b"mine"


async def test_symlinked_file_is_never_read(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    (host(ws) / "out" / "report.txt").symlink_to(outside / "canary.txt")
    (host(ws) / "out" / "real.txt").write_text("real")
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, "out/report.txt")
    files = await engine.fs.collect(ws, ["out/**"])
    assert [f.name for f in files] == ["out/real.txt"]
    assert no_canary(files)
    assert await engine.fs.collect(ws, ["out/report.txt"]) == []


@pytest.mark.parametrize("component", ["out/sub", "out"])
async def test_symlinked_directory_component(engine: BaseEngine, ws: Workspace, outside: Path, component: str) -> None:
    linkpath = host(ws) / component
    if linkpath.exists():
        linkpath.rmdir()
    linkpath.symlink_to(outside, target_is_directory=True)
    before = snapshot(outside)
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(f"{component}/planted.txt", "x")])
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(f"{component}/canary.txt", "overwritten")])
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, f"{component}/canary.txt")
    for pattern in ("out/**", f"{component}/*", f"{component}/canary.txt", "**"):
        files = await engine.fs.collect(ws, [pattern])
        assert no_canary(files), pattern
        assert all(not f.name.startswith(component + "/") for f in files)
    assert snapshot(outside) == before


async def test_dangling_symlink_write_does_not_create_target(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    target = outside / "created-through-link.txt"
    (host(ws) / "out" / "dangling.txt").symlink_to(target)
    assert await engine.fs.collect(ws, ["out/**"]) == []
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, "out/dangling.txt")
    await engine.fs.put_files(ws, [PutFile("out/dangling.txt", "inside")])
    assert not target.exists()
    assert (host(ws) / "out" / "dangling.txt").read_bytes() == b"inside"


def _renameat2_exchange() -> Callable[[str, str], None]:
    """Atomic swap of two names (RENAME_EXCHANGE): the closest model of a racing program."""
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.renameat2
    at_fdcwd, rename_exchange = -100, 2

    def swap(a: str, b: str) -> None:
        if fn(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return swap


async def test_symlink_swapped_in_during_operations(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    """A thread keeps exchanging a real dir and a symlink to the outside while we read and write."""
    try:
        swap = _renameat2_exchange()
    except AttributeError:
        pytest.skip("renameat2 is not available in this libc")
    out = host(ws) / "out"
    (out / "a").mkdir()
    (out / "a" / "canary.txt").write_text("inside a")
    (out / "b").symlink_to(outside, target_is_directory=True)
    try:
        swap(str(out / "a"), str(out / "b"))
        swap(str(out / "a"), str(out / "b"))
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS):
            pytest.skip("RENAME_EXCHANGE is not supported on this filesystem")
        raise
    before = snapshot(outside)
    fs = engine.fs
    assert isinstance(fs, SupportsFileStreams)
    stop = threading.Event()
    swaps = [0]

    def swapper() -> None:
        while not stop.is_set():
            swap(str(out / "a"), str(out / "b"))
            swaps[0] += 1
            time.sleep(0)  # give the GIL back so the operations under attack make progress too

    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    seen: list[bytes] = []
    rounds = 0
    try:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            rounds += 1
            for name in ("a", "b"):
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    await engine.fs.put_files(ws, [PutFile(f"out/{name}/canary.txt", "written by put")])
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    await engine.fs.put_files(ws, [PutFile(f"out/{name}/new-{rounds}.txt", "new")])
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    seen.append((await engine.fs.read_file(ws, f"out/{name}/canary.txt")).content)
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    await fs.write_stream(ws, f"out/{name}/canary.txt", _chunks(b"streamed"), max_bytes=100)
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    reader = await fs.open_reader(ws, f"out/{name}/canary.txt")
                    seen.extend([chunk async for chunk in reader.chunks()])
            seen.extend(f.content for f in await engine.fs.collect(ws, ["out/**"]))
    finally:
        stop.set()
        thread.join()
    assert swaps[0] > 100 and rounds > 10, "the race did not really run"
    assert CANARY not in seen
    assert snapshot(outside) == before


# -- streams (what execspace serve's file API runs on) ----------------------------------------------


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def _streams(engine: BaseEngine) -> SupportsFileStreams:
    fs = engine.fs
    assert isinstance(fs, SupportsFileStreams)
    return fs


def _temps(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if n.endswith(".tmp")]


async def test_streams_are_confined_like_put_and_read(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    fs = _streams(engine)
    (host(ws) / "out" / "link.txt").symlink_to(outside / "canary.txt")
    (host(ws) / "out" / "dir").symlink_to(outside, target_is_directory=True)
    os.link(outside / "canary.txt", host(ws) / "out" / "hard.txt")
    before = snapshot(outside)
    for path in ("../outside/x.txt", str(outside / "x.txt"), "out/dir/x.txt", "out/dir/canary.txt"):
        with pytest.raises(PathDenied):
            await fs.write_stream(ws, path, _chunks(b"x"), max_bytes=10)
        with pytest.raises((PathDenied, FileNotFoundError)):
            await fs.open_reader(ws, path)
    for path in ("out/link.txt", "out/hard.txt"):
        with pytest.raises(PathDenied):
            await fs.open_reader(ws, path)
        assert await fs.write_stream(ws, path, _chunks(b"mine", b"!"), max_bytes=10) == 5
        assert (host(ws) / path).read_bytes() == b"mine!" and not (host(ws) / path).is_symlink()
    assert snapshot(outside) == before
    assert (outside / "canary.txt").stat().st_nlink == 1


async def test_a_stream_over_its_cap_is_refused_without_taking_more(engine: BaseEngine, ws: Workspace) -> None:
    fs = _streams(engine)
    target = host(ws) / "out" / "capped.bin"
    target.write_bytes(b"before")
    pulled = 0

    async def endless() -> AsyncIterator[bytes]:
        nonlocal pulled
        while True:
            pulled += 1
            yield b"1234"

    with pytest.raises(LimitExceeded, match="larger than 10 bytes"):
        await fs.write_stream(ws, "out/capped.bin", endless(), max_bytes=10)
    assert pulled == 3  # 12 bytes > 10: no fourth chunk asked for
    assert target.read_bytes() == b"before" and _temps(target.parent) == []


async def test_a_failing_or_cancelled_stream_leaves_nothing(engine: BaseEngine, ws: Workspace) -> None:
    fs = _streams(engine)
    out = host(ws) / "out"
    (out / "kept.bin").write_bytes(b"before")
    started = asyncio.Event()

    async def failing() -> AsyncIterator[bytes]:
        yield b"x" * STREAM_CHUNK * 3  # written to the new file already
        raise RuntimeError("the client went away")

    async def stalled() -> AsyncIterator[bytes]:
        yield b"x" * STREAM_CHUNK * 3
        started.set()
        await asyncio.Event().wait()
        yield b""

    with pytest.raises(RuntimeError, match="went away"):
        await fs.write_stream(ws, "out/kept.bin", failing(), max_bytes=1 << 30)
    assert (out / "kept.bin").read_bytes() == b"before" and _temps(out) == []
    task = asyncio.create_task(fs.write_stream(ws, "out/new.bin", stalled(), max_bytes=1 << 30))
    await started.wait()
    assert [(out / n).stat().st_size for n in _temps(out)] == [STREAM_CHUNK * 3]  # on disk as it came
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not (out / "new.bin").exists() and _temps(out) == []


async def test_a_stream_writes_an_empty_file_and_keeps_the_mode(engine: BaseEngine, ws: Workspace) -> None:
    fs = _streams(engine)
    assert await fs.write_stream(ws, "out/empty.bin", _chunks(), max_bytes=0) == 0
    assert await fs.write_stream(ws, "out/run.sh", _chunks(b"#!/bin/sh\n"), max_bytes=100, mode=0o4755) == 10
    assert (host(ws) / "out" / "empty.bin").read_bytes() == b""
    assert (host(ws) / "out" / "run.sh").stat().st_mode & 0o7777 == 0o755  # setuid never set


async def test_a_reader_reads_bounded_chunks_and_stops_at_a_shrunk_file(engine: BaseEngine, ws: Workspace) -> None:
    fs = _streams(engine)
    data = os.urandom(STREAM_CHUNK * 2 + 5)
    (host(ws) / "out" / "data.bin").write_bytes(data)
    fds = len(os.listdir("/proc/self/fd"))
    reader = await fs.open_reader(ws, "out/data.bin")
    assert reader.size == len(data)
    chunks = [chunk async for chunk in reader.chunks()]
    assert b"".join(chunks) == data and max(map(len, chunks)) <= STREAM_CHUNK
    reader = await fs.open_reader(ws, "out/data.bin")
    got = reader.chunks()
    assert await anext(got) == data[:STREAM_CHUNK]
    os.truncate(host(ws) / "out" / "data.bin", STREAM_CHUNK)
    with pytest.raises(BackendError, match="shrank"):
        await anext(got)
    unread = await fs.open_reader(ws, "out/data.bin")
    await unread.aclose()
    assert len(os.listdir("/proc/self/fd")) == fds  # every reader's file closed


async def test_a_reader_refuses_special_files_at_once_naming_them(engine: BaseEngine, ws: Workspace) -> None:
    fs = _streams(engine)
    out = host(ws) / "out"
    os.mkfifo(out / "pipe")
    listener = socket.socket(socket.AF_UNIX)
    directory = os.open(out, os.O_PATH | os.O_DIRECTORY)
    try:
        listener.bind(f"/proc/self/fd/{directory}/sock")
    finally:
        os.close(directory)
        listener.close()
    async with asyncio.timeout(10):
        for name, kind in (("pipe", "FIFO"), ("sock", "socket")):
            with pytest.raises(PathDenied, match=f"not a regular file: it is an? {kind}"):
                await fs.open_reader(ws, f"out/{name}")


# -- hard links, FIFOs, directories in the way --------------------------------------------------


async def test_hard_link_to_outside_file(engine: BaseEngine, ws: Workspace, outside: Path) -> None:
    link = host(ws) / "out" / "data.txt"
    os.link(outside / "canary.txt", link)
    before = snapshot(outside)
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, "out/data.txt")
    files = await engine.fs.collect(ws, ["out/**", "out/data.txt"])
    assert files == []
    await engine.fs.put_files(ws, [PutFile("out/data.txt", "replaced")])
    assert snapshot(outside) == before
    assert (outside / "canary.txt").stat().st_nlink == 1
    assert link.read_bytes() == b"replaced"


async def test_fifo_does_not_hang_collect_read_or_put(engine: BaseEngine, ws: Workspace) -> None:
    fifo = host(ws) / "out" / "pipe.txt"
    os.mkfifo(fifo)
    (host(ws) / "out" / "ok.txt").write_text("ok")
    async with asyncio.timeout(10):
        files = await engine.fs.collect(ws, ["out/**", "out/pipe.txt"])
        assert [f.name for f in files] == ["out/ok.txt"]
        with pytest.raises(PathDenied):
            await engine.fs.read_file(ws, "out/pipe.txt")
        await engine.fs.put_files(ws, [PutFile("out/pipe.txt", "regular now")])
    assert fifo.read_bytes() == b"regular now"


async def test_directory_where_a_file_is_expected(engine: BaseEngine, ws: Workspace) -> None:
    (host(ws) / "out" / "report.txt").mkdir()
    (host(ws) / "out" / "report.txt" / "inner").write_text("inner")
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile("out/report.txt", "x")])
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, "out/report.txt")
    assert await engine.fs.collect(ws, ["out/report.txt"]) == []
    assert (host(ws) / "out" / "report.txt" / "inner").read_text() == "inner"


async def test_file_where_a_directory_is_expected(engine: BaseEngine, ws: Workspace) -> None:
    (host(ws) / "out" / "plain").write_text("plain")
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile("out/plain/child.txt", "x")])
    assert (host(ws) / "out" / "plain").read_text() == "plain"


async def test_put_mode_strips_setuid_and_write_is_exact(engine: BaseEngine, ws: Workspace) -> None:
    await engine.fs.put_files(ws, [PutFile("work/deep/tool.sh", b"#!/bin/sh\n", 0o4755)])
    p = host(ws) / "work" / "deep" / "tool.sh"
    assert p.read_bytes() == b"#!/bin/sh\n"
    assert p.stat().st_mode & 0o7777 == 0o755
    leftovers = [n for n in os.listdir(p.parent) if n.endswith(".tmp")]
    assert leftovers == []


# -- collection caps -------------------------------------------------------------------------

MIB = 1024 * 1024


def write_files(directory: Path, count: int, size: int, prefix: str = "f") -> None:
    directory.mkdir(parents=True, exist_ok=True)
    block = os.urandom(size)
    for i in range(count):
        (directory / f"{prefix}{i:03d}.bin").write_bytes(block)


async def test_default_file_count_cap(engine: BaseEngine, ws: Workspace) -> None:
    write_files(host(ws) / "out", 130, 10)
    files = await engine.fs.collect(ws, ["out/**"])
    assert len(files) == 100
    assert [f.name for f in files] == sorted(f.name for f in files)


async def test_explicit_file_count_caps(engine: BaseEngine, ws: Workspace) -> None:
    write_files(host(ws) / "out", 130, 10)
    assert len(await engine.fs.collect(ws, ["out/**"], max_files=7)) == 7
    assert len(await engine.fs.collect(ws, ["out/**"], max_files=500)) == 130


async def test_default_per_file_cap_truncates_and_reports_real_size(engine: BaseEngine, ws: Workspace) -> None:
    data = os.urandom(5 * MIB)
    (host(ws) / "out" / "big.bin").write_bytes(data)
    (host(ws) / "out" / "small.bin").write_bytes(b"small")
    files = {f.name: f for f in await engine.fs.collect(ws, ["out/**"])}
    big = files["out/big.bin"]
    assert big.truncated
    assert big.size_bytes == 5 * MIB
    assert big.content == data[: 4 * MIB]
    assert not files["out/small.bin"].truncated
    assert files["out/small.bin"].size_bytes == 5


async def test_per_file_cap_is_configurable_above_default(engine: BaseEngine, ws: Workspace) -> None:
    data = os.urandom(10 * MIB)
    (host(ws) / "out" / "ten.bin").write_bytes(data)
    (f,) = await engine.fs.collect(ws, ["out/ten.bin"], max_file_bytes=16 * MIB)
    assert not f.truncated
    assert f.size_bytes == 10 * MIB
    assert f.content == data
    (g,) = await engine.fs.collect(ws, ["out/ten.bin"], max_file_bytes=1000)
    assert g.truncated and g.content == data[:1000] and g.size_bytes == 10 * MIB


async def test_total_bytes_cap(engine: BaseEngine, ws: Workspace) -> None:
    write_files(host(ws) / "out", 3, MIB)
    files = await engine.fs.collect(ws, ["out/**"], max_total_bytes=MIB * 5 // 2)
    assert sum(len(f.content) for f in files) <= MIB * 5 // 2
    assert [f.truncated for f in files] == [False, False, True]
    assert all(f.size_bytes == MIB for f in files)


async def test_caps_met_exactly_are_not_reported_as_hit(engine: BaseEngine, ws: Workspace) -> None:
    fs = engine.fs
    assert isinstance(fs, HostWorkspaceFS)
    write_files(host(ws) / "out", 2, MIB)
    files, hit = await fs.collect_with_limits(ws, ["out/**"], max_total_bytes=2 * MIB, max_files=2)
    assert len(files) == 2 and not any(f.truncated for f in files) and not hit
    write_files(host(ws) / "out", 3, MIB)
    files, hit = await fs.collect_with_limits(ws, ["out/**"], max_total_bytes=2 * MIB)
    assert len(files) == 2 and hit
    files, hit = await fs.collect_with_limits(ws, ["out/**"], max_files=2)
    assert len(files) == 2 and hit


async def test_default_total_cap_and_raising_it(engine: BaseEngine, ws: Workspace) -> None:
    write_files(host(ws) / "out", 17, 4 * MIB)  # 68 MiB: over the 64 MiB default
    files = await engine.fs.collect(ws, ["out/**"])
    assert sum(len(f.content) for f in files) == 64 * MIB
    assert files[-1].truncated or len(files) < 17
    everything = await engine.fs.collect(ws, ["out/**"], max_total_bytes=100 * MIB)
    assert len(everything) == 17
    assert sum(len(f.content) for f in everything) == 68 * MIB
    assert not any(f.truncated for f in everything)


# -- glob forms and MIME types --------------------------------------------------------------


@pytest.fixture
async def tree(ws: Workspace) -> Workspace:
    for rel in (
        "out/a.txt",
        "out/b.log",
        "out/sub/c.txt",
        "out/.hidden",
        "work/x",
        "work/y.txt",
        "tmp/t.txt",
    ):
        p = host(ws) / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(rel)
    return ws


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        (["out/**"], ["out/.hidden", "out/a.txt", "out/b.log", "out/sub/c.txt"]),
        (["$OUTPUT_DIR/*.txt"], ["out/a.txt"]),
        (["${OUTPUT_DIR}/**/*.txt"], ["out/a.txt", "out/sub/c.txt"]),
        (["${WORK_DIR}/x"], ["work/x"]),
        (["$WORKSPACE_DIR/work/*.txt"], ["work/y.txt"]),
        (["out/**", "!out/*.log", "!out/sub/**"], ["out/.hidden", "out/a.txt"]),
        (["./work/y.txt", "  out/a.txt  ", ""], ["out/a.txt", "work/y.txt"]),
        (["$OUTPUT_DIRX/*"], []),
    ],
)
async def test_glob_forms(engine: BaseEngine, tree: Workspace, patterns: list[str], expected: list[str]) -> None:
    files = await engine.fs.collect(tree, patterns)
    assert sorted(f.name for f in files) == expected
    for f in files:
        assert f.content == f.name.encode()


PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489")


@pytest.mark.parametrize(
    ("name", "content", "mime"),
    [
        ("out/picture.dat", PNG, "image/png"),
        ("out/table.csv", b"a,b\n1,2\n", "text/csv"),
        ("out/data.json", b'{"a": 1}', "application/json"),
        ("out/drawing.svg", b'<svg xmlns="http://www.w3.org/2000/svg"></svg>', "image/svg+xml"),
        ("out/notes.md", b"# title\n", "text/markdown"),
        ("out/noext", b"plain words\n", "text/plain"),
        ("out/blob", b"\x00\x01\x02\xff", "application/octet-stream"),
    ],
)
async def test_mime_types(engine: BaseEngine, ws: Workspace, name: str, content: bytes, mime: str) -> None:
    await engine.fs.put_files(ws, [PutFile(name, content)])
    (f,) = await engine.fs.collect(ws, [name])
    assert f.mime_type == mime
    assert (await engine.fs.read_file(ws, name)).mime_type == mime


async def test_collect_survives_files_vanishing_during_the_walk(engine: BaseEngine, ws: Workspace) -> None:
    """A leftover process deleting and recreating files must not make collection fail."""
    churn = host(ws) / "out" / "churn"
    churn.mkdir()
    (host(ws) / "out" / "stable.txt").write_text("stable")
    stop = threading.Event()

    def churner() -> None:
        while not stop.is_set():
            for i in range(50):
                with contextlib.suppress(OSError):
                    (churn / f"{i}.txt").write_text("x")
            for i in range(50):
                with contextlib.suppress(OSError):
                    (churn / f"{i}.txt").unlink()
            with contextlib.suppress(OSError):
                churn.rmdir()
                churn.mkdir()

    thread = threading.Thread(target=churner, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 0.7
        while time.monotonic() < deadline:
            files = await engine.fs.collect(ws, ["out/**"])
            assert "out/stable.txt" in [f.name for f in files]
    finally:
        stop.set()
        thread.join()


async def test_remove_and_rename_of_a_tree_check_every_entry_against_the_file_rule(tmp_path: Path) -> None:
    """A tree holding a path the backend's rule keeps (a sandbox rule, say) is refused whole: nothing moves."""

    def rule(ws: Workspace, path: str, mode: str) -> None:
        if mode == "write" and (path == "work/keep" or path.startswith("work/keep/")):
            raise PathDenied(path, "kept by the rule")

    root = tmp_path / "ws"
    (root / "work/keep").mkdir(parents=True)
    (root / "work/keep/f.txt").write_text("kept")
    (root / "work/other.txt").write_text("o")
    ws = Workspace(id="rule", path=str(root), backend="local", host_path=root)
    fs = HostWorkspaceFS(access=rule)
    with pytest.raises(PathDenied, match="kept by the rule"):
        await fs.remove(ws, "work")
    with pytest.raises(PathDenied, match="kept by the rule"):
        await fs.rename(ws, "work", "moved")
    with pytest.raises(PathDenied, match="kept by the rule"):
        await fs.rename(ws, "work/other.txt", "work/keep/other.txt")
    assert (root / "work/keep/f.txt").read_text() == "kept" and (root / "work/other.txt").exists()
    await fs.remove(ws, "work/other.txt")  # what the rule allows still goes
    assert not (root / "work/other.txt").exists()
