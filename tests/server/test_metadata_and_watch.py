"""File metadata (envd 0.6.2) and watches (entries in events, 0.6.3; network mounts, 0.6.4) through the official
SDK: what a user of ``metadata=`` and ``watch_dir`` observes, and what a program in the sandbox sees of it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from e2b import AsyncSandbox, FileType, Sandbox
from e2b.exceptions import InvalidArgumentException
from e2b.sandbox.filesystem.filesystem import WriteEntry
from e2b.sandbox.filesystem.watch_handle import FilesystemEvent, FilesystemEventType

from .conftest import Server

CREATE, WRITE, CHMOD, REMOVE = (
    FilesystemEventType.CREATE,
    FilesystemEventType.WRITE,
    FilesystemEventType.CHMOD,
    FilesystemEventType.REMOVE,
)
#: An upload of a new file as envd's inotify reports it: created, chowned, written.
NEW_FILE = [CREATE, CHMOD, WRITE]


@pytest.fixture
def sbx() -> Iterator[Sandbox]:
    sandbox = Sandbox.create()
    yield sandbox
    sandbox.kill()


@pytest.fixture
async def asbx() -> AsyncIterator[AsyncSandbox]:
    sandbox = await AsyncSandbox.create()
    yield sandbox
    await sandbox.kill()


def _xattr(sbx: Sandbox, path: str, key: str) -> str:
    """What a program in the sandbox reads of the file's attribute ``user.e2b.<key>``."""
    script = f"import os; print(os.getxattr('{path}', 'user.e2b.{key}').decode())"
    return sbx.commands.run(f'python3 -c "{script}"').stdout.strip()


# -- metadata ----------------------------------------------------------------------------------------------------------


def test_metadata_is_written_read_listed_kept_by_a_rename_and_cleared_by_an_overwrite(sbx: Sandbox) -> None:
    metadata = {"author": "mish", "purpose": "upload"}
    assert sbx.files.write("m/a.txt", "a", metadata=metadata).metadata == metadata
    assert sbx.files.write("m/b.txt", b"b", metadata={"k": "v"}, use_octet_stream=True).metadata == {"k": "v"}
    assert sbx.files.write("m/none.txt", "n").metadata is None
    assert sbx.files.get_info("m/a.txt").metadata == metadata
    assert sbx.files.get_info("m/none.txt").metadata is None
    assert {e.name: e.metadata for e in sbx.files.list("m")} == {
        "a.txt": metadata,
        "b.txt": {"k": "v"},
        "none.txt": None,
    }
    assert _xattr(sbx, "/home/user/m/a.txt", "author") == "mish"  # the program's own view: the file's attributes
    renamed = sbx.files.rename("m/a.txt", "m/renamed.txt")
    assert renamed.metadata == metadata and sbx.files.get_info("m/renamed.txt").metadata == metadata
    assert sbx.files.write("m/renamed.txt", "again").metadata is None  # an upload replaces the whole set
    assert sbx.files.get_info("m/renamed.txt").metadata is None
    infos = sbx.files.write_files(
        [WriteEntry(path="m/1.txt", data="1"), WriteEntry(path="m/2.txt", data="2")], metadata={"batch": "x"}
    )
    assert [i.metadata for i in infos] == [{"batch": "x"}] * 2
    assert [sbx.files.get_info(f"m/{n}.txt").metadata for n in (1, 2)] == [{"batch": "x"}] * 2


def test_metadata_a_program_sets_is_read_and_a_link_shows_its_targets(sbx: Sandbox) -> None:
    sbx.files.write("p.txt", "p")
    done = sbx.commands.run(
        """python3 -c "import os; os.setxattr('p.txt', 'user.e2b.by', b'program')" && ln -s p.txt link"""
    )
    assert done.exit_code == 0
    assert sbx.files.get_info("p.txt").metadata == {"by": "program"}
    link = sbx.files.get_info("link")
    assert (link.type, link.metadata) == (FileType.SYMLINK, {"by": "program"})  # as envd reads it, through the link


def test_metadata_the_rules_refuse_writes_nothing(sbx: Sandbox, e2b_server: Server) -> None:
    with pytest.raises(InvalidArgumentException):  # the SDK's own check
        sbx.files.write("bad.txt", "x", metadata={"bad key": "v"})
    # past the SDK, the server's: a key longer than the kernel takes, a set larger than a file keeps
    headers = {"X-Access-Token": sbx._envd_access_token or "", "E2b-Sandbox-Id": sbx.sandbox_id}
    for extra, reason in (
        ({"X-Metadata-" + "k" * 247: "v"}, "longer than 246"),
        ({"X-Metadata-k": "v" * 4096}, "4096"),
    ):
        answer = httpx.post(
            f"{e2b_server.url}/files",
            params={"path": "bad.txt"},
            content=b"x",
            headers={**headers, **extra, "Content-Type": "application/octet-stream"},
        )
        assert answer.status_code == 400 and reason in answer.json()["message"], answer.text
    assert not sbx.files.exists("bad.txt")


async def test_async_metadata_is_written_read_and_listed(asbx: AsyncSandbox) -> None:
    info = await asbx.files.write("a.txt", "a", metadata={"tag": "listed"})
    assert info.metadata == {"tag": "listed"}
    assert (await asbx.files.get_info("a.txt")).metadata == {"tag": "listed"}
    assert [e.metadata for e in await asbx.files.list(".") if e.name == "a.txt"] == [{"tag": "listed"}]
    assert (await asbx.files.rename("a.txt", "b.txt")).metadata == {"tag": "listed"}


# -- watches -----------------------------------------------------------------------------------------------------------


def _kinds(events: list[FilesystemEvent], name: str) -> list[FilesystemEventType]:
    return [e.type for e in events if e.name == name]


def test_an_iterated_watch_gets_every_event_of_an_upload_as_envd_reports_it(sbx: Sandbox) -> None:
    sbx.files.make_dir("w")
    handle = sbx.files.watch_dir("w")
    try:
        sbx.files.write("w/f.txt", "first")
        events = handle.get_new_events()
        assert [(e.name, e.type) for e in events] == [("f.txt", kind) for kind in NEW_FILE]
        sbx.files.write("w/f.txt", "second")
        assert _kinds(handle.get_new_events(), "f.txt") == [CHMOD, WRITE]  # the chown, then the truncation
        sbx.files.write("w/f.txt", "third", metadata={"k": "v"})
        assert _kinds(handle.get_new_events(), "f.txt") == [CHMOD, WRITE, CHMOD]  # and its attributes
        sbx.files.write("w/empty.txt", "")
        assert _kinds(handle.get_new_events(), "empty.txt") == [CREATE, CHMOD]  # nothing written: no WRITE
        assert sbx.commands.run("echo program > w/p.txt && rm w/f.txt", cwd="/home/user").exit_code == 0
        found = handle.get_new_events()
        assert (_kinds(found, "p.txt"), _kinds(found, "f.txt")) == ([CREATE, WRITE], [REMOVE])
        assert handle.get_new_events() == []
    finally:
        handle.stop()


def test_a_watch_gives_entries_and_watches_folders_added_later(sbx: Sandbox) -> None:
    sbx.files.make_dir("r/old")
    handle = sbx.files.watch_dir("r", recursive=True, include_entry=True, allow_network_mounts=True)
    try:
        sbx.files.write("r/old/f.txt", "x", metadata={"k": "v"})
        sbx.files.make_dir("r/new/deeper")
        sbx.files.write("r/new/deeper/g.txt", "y")
        events = handle.get_new_events()
        assert _kinds(events, "old/f.txt") == [*NEW_FILE, CHMOD]
        assert _kinds(events, "new") == [CREATE] and _kinds(events, "new/deeper") == [CREATE]
        assert _kinds(events, "new/deeper/g.txt") == NEW_FILE
        entry = next(e.entry for e in events if e.name == "old/f.txt" and e.type is WRITE)
        assert entry is not None
        assert (entry.name, entry.path, entry.type, entry.size) == ("f.txt", "/home/user/r/old/f.txt", FileType.FILE, 1)
        assert entry.metadata == {"k": "v"}
        sbx.files.remove("r/new/deeper/g.txt")
        removed = handle.get_new_events()
        assert [(e.name, e.type, e.entry) for e in removed] == [("new/deeper/g.txt", REMOVE, None)]
    finally:
        handle.stop()


async def test_async_watch_streams_an_uploads_events_in_order_with_entries(asbx: AsyncSandbox) -> None:
    await asbx.files.make_dir("s")
    got: list[FilesystemEvent] = []
    handle = await asbx.files.watch_dir("s", got.append, include_entry=True, allow_network_mounts=True)
    try:
        await asbx.files.write("s/f.txt", "data", metadata={"a": "b"})
        await asbx.files.write("s/end.txt", "")
        await _until(lambda: any(e.name == "end.txt" for e in got))
        assert _kinds(got, "f.txt") == [*NEW_FILE, CHMOD]
        assert [e.entry.metadata for e in got if e.name == "f.txt" and e.entry is not None] == [{"a": "b"}] * 4
    finally:
        await handle.stop()


def test_uploads_that_end_while_a_poll_walks_report_their_events_once(sbx: Sandbox) -> None:
    """Uploads that end while a poll walks the directory are reported by the upload alone: no file is created
    twice or removed, no upload's file beside its target is seen. One thread polls without pause while others
    upload."""
    sbx.files.make_dir("race")
    handle = sbx.files.watch_dir("race")
    got: list[FilesystemEvent] = []
    polling = threading.Event()
    polling.set()

    def poll() -> None:
        while polling.is_set():
            got.extend(handle.get_new_events())

    names = [f"f{i}.txt" for i in range(60)]
    poller = threading.Thread(target=poll)
    poller.start()
    try:
        with ThreadPoolExecutor(6) as uploads:
            list(uploads.map(lambda n: sbx.files.write(f"race/{n}", n * 50), names))
        # a last upload after the rest: once its events came, a poll since every other upload did too
        sbx.files.write("race/end.txt", "end")
        deadline = time.monotonic() + 10
        while WRITE not in _kinds(got, "end.txt"):
            assert time.monotonic() < deadline, "the last upload's events never came"
            time.sleep(0.01)
    finally:
        polling.clear()
        poller.join()
        handle.stop()
    assert {n: _kinds(got, n) for n in names} == {n: NEW_FILE for n in names}
    assert {e.name for e in got} == {*names, "end.txt"}


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "timed out"
        await asyncio.sleep(0.02)
