"""The host workspace manager: layout, ids, concurrency, metadata, cleanup, the private root."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

import execspace
from execspace import (
    BaseEngine,
    InvalidSpec,
    Persistence,
    PutFile,
    SetupFailed,
    Workspace,
    WorkspaceNotFound,
    WorkspacePolicy,
)
from execspace.workspace.layout import LAYOUT_DIRS, METADATA_FILE, new_run_name, sanitize_id
from execspace.workspace.metadata import InputRecord, WorkspaceMetadata, load_metadata, save_metadata


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


# -- layout and metadata ------------------------------------------------------------------------


async def test_layout_and_metadata_exist(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    root = host(ws)
    assert root.parent == tmp_path / "ws"
    assert ws.path == str(root) and ws.backend == "local" and ws.id == "test/session"
    for d in ("work", "work/inputs", "out", "runs", "skills", "src", "home", "tmp"):
        assert (root / d).is_dir(), d
    assert set(LAYOUT_DIRS) >= {"work", "work/inputs", "out", "runs", "skills", "src", "home", "tmp"}
    meta = json.loads((root / METADATA_FILE).read_text())
    assert meta["id"] == "test/session"
    assert meta["inputs"] == [] and meta["outputs"] == []


def test_run_names_drawn_in_one_second_do_not_meet() -> None:
    # a session's supervisor makes the run directory after the environment named it: a name drawn twice is an
    # error then, not a second draw. 200,000 draws (a busy second of a server, many times over) met about 1,200
    # times with the 24 random bits names once had
    names = [new_run_name() for _ in range(200_000)]
    assert len({name.rsplit("-", 1)[1] for name in names}) == len(names)


def test_metadata_round_trip(tmp_path: Path) -> None:
    meta = WorkspaceMetadata(id="x")
    meta.inputs.append(InputRecord(src="bytes", dest="work/inputs/a", resolved="bytes", mode="copy", version=3))
    save_metadata(tmp_path, meta)
    loaded = load_metadata(tmp_path, "x")
    assert loaded.id == "x"
    assert loaded.inputs[0].dest == "work/inputs/a"
    assert loaded.last_input_version("work/inputs/a", "bytes") == 3
    assert loaded.recovered_from is None


def test_metadata_writes_are_atomic(tmp_path: Path) -> None:
    """A reader running next to a writer only ever sees complete records."""
    stop = threading.Event()
    errors: list[str] = []
    reads = [0]

    def reader() -> None:
        while not stop.is_set():
            try:
                raw = (tmp_path / METADATA_FILE).read_bytes()
            except FileNotFoundError:
                continue
            try:
                WorkspaceMetadata.from_json(raw)
                reads[0] += 1
            except ValueError as exc:
                errors.append(str(exc))

    save_metadata(tmp_path, WorkspaceMetadata(id="atomic"))
    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # 150 writes, and more until the reader has read during them (a loaded machine may not schedule it before)
        i, deadline = 0, time.monotonic() + 30
        while i < 150 or (reads[0] == 0 and time.monotonic() < deadline):
            meta = WorkspaceMetadata(id="atomic", skills={f"s{j}": {"pad": "x" * 2000} for j in range(i % 40)})
            save_metadata(tmp_path, meta)
            i += 1
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert reads[0] > 0
    assert sorted(os.listdir(tmp_path)) == [METADATA_FILE]  # no temp file left behind


@pytest.mark.parametrize(
    "garbage",
    [
        b"{not json",
        b"",
        b"\xff\xfe\x00",
        b"[1, 2, 3]",
        b'{"inputs": [{"bogus": 1}]}',
        b'{"inputs": [{"src": "a"',
    ],
)
def test_corrupt_metadata_is_tolerated_and_kept(tmp_path: Path, garbage: bytes) -> None:
    (tmp_path / METADATA_FILE).write_bytes(garbage)
    meta = load_metadata(tmp_path, "the-id")
    assert meta.id == "the-id"
    assert meta.inputs == [] and meta.outputs == []
    assert meta.recovered_from is not None
    assert meta.recovered_from.startswith(f"{METADATA_FILE}.corrupt-")
    assert (tmp_path / meta.recovered_from).read_bytes() == garbage
    assert not (tmp_path / METADATA_FILE).exists()
    save_metadata(tmp_path, meta)  # work goes on with a fresh record
    assert load_metadata(tmp_path).recovered_from == meta.recovered_from


def test_metadata_symlink_to_host_file_is_not_read(tmp_path: Path) -> None:
    host_file = tmp_path / "host.json"
    secret = WorkspaceMetadata(id="HOST-SECRET").to_json()
    host_file.write_bytes(secret)
    ws_dir = tmp_path / "w"
    ws_dir.mkdir()
    (ws_dir / METADATA_FILE).symlink_to(host_file)
    meta = load_metadata(ws_dir, "mine")
    assert meta.id == "mine"
    save_metadata(ws_dir, meta)
    assert host_file.read_bytes() == secret
    assert not (ws_dir / METADATA_FILE).is_symlink()


def test_metadata_fifo_does_not_hang(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / METADATA_FILE)
    meta = load_metadata(tmp_path, "fifo")  # would block forever without O_NONBLOCK
    assert meta.id == "fifo" and meta.recovered_from is not None


async def test_corrupt_metadata_does_not_block_workspace_reuse(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        ws = await eng.manager.create_workspace("reuse")
    (host(ws) / METADATA_FILE).write_bytes(b"\x00garbage")
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        again = await eng.manager.create_workspace("reuse")
        assert again.host_path == ws.host_path
        await eng.fs.put_files(again, [PutFile("work/a.txt", "still works")])
    assert (host(ws) / "work" / "a.txt").read_text() == "still works"


# -- ids ------------------------------------------------------------------------------------


HOSTILE_IDS = [
    "../../etc",
    "..",
    ".",
    "/",
    "/etc/passwd",
    "a/b",
    "a_b",
    "a__b",
    "a/../b",
    "ünïcødé/セッション/🚀",
    "x" * 5000,
    "x" * 5000 + "y",
    "with space\nand newline",
    "nul\0byte",
    "-rf",
]


def test_sanitize_id_is_one_safe_name() -> None:
    names = [sanitize_id(i) for i in HOSTILE_IDS]
    for raw, name in zip(HOSTILE_IDS, names, strict=True):
        assert "/" not in name and "\0" not in name, raw
        assert name not in ("", ".", "..") and not name.startswith("."), raw
        assert len(name.encode()) <= 255, raw
        assert all(c.isascii() and (c.isalnum() or c in "_.-") for c in name), raw
    assert len(set(names)) == len(names), "distinct ids must map to distinct directories"
    assert sanitize_id("app/user/session") == sanitize_id("app/user/session")
    assert sanitize_id("app/user/session").startswith("app_user_session-")


def test_empty_id_is_invalid() -> None:
    with pytest.raises(InvalidSpec):
        sanitize_id("")


async def test_hostile_ids_stay_under_the_root(engine: BaseEngine, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    workspaces = [await engine.manager.create_workspace(i) for i in HOSTILE_IDS]
    dirs = {host(w) for w in workspaces}
    assert len(dirs) == len(HOSTILE_IDS)
    for w in workspaces:
        assert host(w).parent == root
        assert host(w).is_dir() and not host(w).is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"]
    with pytest.raises(InvalidSpec):
        await engine.manager.create_workspace("")


# -- identity and concurrency -------------------------------------------------------------------


async def test_concurrent_session_creation_yields_one_workspace(engine: BaseEngine, tmp_path: Path) -> None:
    results = await asyncio.gather(*(engine.manager.create_workspace("same/id") for _ in range(100)))
    assert len(set(results)) == 1
    assert len(os.listdir(tmp_path / "ws")) == 1
    again = await engine.manager.create_workspace("same/id")
    assert again == results[0]


async def test_cancelling_one_creator_does_not_cancel_the_others(engine: BaseEngine, tmp_path: Path) -> None:
    tasks = [asyncio.create_task(engine.manager.create_workspace("shared/id")) for _ in range(5)]
    await asyncio.sleep(0)  # all five are now waiting on one creation
    tasks[0].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], asyncio.CancelledError)
    assert all(isinstance(r, Workspace) for r in results[1:]), results
    assert len({r for r in results[1:]}) == 1
    assert len(os.listdir(tmp_path / "ws")) == 1
    assert await engine.manager.create_workspace("shared/id") == results[1]


async def test_session_survives_a_new_engine(tmp_path: Path) -> None:
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        first = await eng.manager.create_workspace("persist")
        await eng.fs.put_files(first, [PutFile("work/state.txt", "kept")])
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        found = await eng.manager.get_workspace("persist")
        assert found.host_path == first.host_path
        assert (await eng.fs.read_file(found, "work/state.txt")).content == b"kept"
        created = await eng.manager.create_workspace("persist")
        assert created.host_path == first.host_path


async def test_turn_persistence_gives_distinct_workspaces(engine: BaseEngine, tmp_path: Path) -> None:
    policy = WorkspacePolicy(persistence=Persistence.TURN)
    turns = await asyncio.gather(*(engine.manager.create_workspace("turn/id", policy) for _ in range(5)))
    dirs = {host(t) for t in turns}
    assert len(dirs) == 5
    assert all((d / "work").is_dir() for d in dirs)
    session = await engine.manager.create_workspace("turn/id")
    assert host(session) not in dirs


async def test_get_workspace_missing(engine: BaseEngine, tmp_path: Path) -> None:
    with pytest.raises(WorkspaceNotFound) as info:
        await engine.manager.get_workspace("never/created")
    assert isinstance(info.value, LookupError)
    assert "never/created" in str(info.value)
    assert not (tmp_path / "ws" / sanitize_id("never/created")).exists()


@pytest.mark.parametrize("planted", ["work", "out", "tmp"])
async def test_layout_dir_swapped_for_a_symlink(tmp_path: Path, planted: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        ws = await eng.manager.create_workspace("planted")
    target = host(ws) / planted
    for child in sorted(target.rglob("*"), reverse=True):
        child.rmdir()
    target.rmdir()
    target.symlink_to(outside, target_is_directory=True)
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws") as eng:
        with pytest.raises(execspace.PathDenied):
            await eng.manager.create_workspace("planted")
    assert list(outside.iterdir()) == [], "a layout directory was created through the planted link"


async def test_adopting_a_symlink_path_is_refused(engine: BaseEngine, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(execspace.PathDenied):
        await engine.manager.create_workspace("adopt", path=tmp_path / "link")
    assert list(target.iterdir()) == []
    adopted = await engine.manager.create_workspace("adopt", path=tmp_path / "real")
    assert host(adopted) == tmp_path / "real" and (tmp_path / "real" / "out").is_dir()


# -- cleanup -------------------------------------------------------------------------------------


def run_without_privileges(code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child Python that has dropped every capability.

    As root, permission bits never stop us; without CAP_DAC_OVERRIDE/CAP_FOWNER a
    read-only directory really blocks removal, as it does for ordinary users.
    """
    prelude = textwrap.dedent(
        """
        import ctypes, os
        if os.geteuid() == 0:
            class Hdr(ctypes.Structure):
                _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
            class Data(ctypes.Structure):
                _fields_ = [("eff", ctypes.c_uint32), ("prm", ctypes.c_uint32), ("inh", ctypes.c_uint32)]
            if ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(Hdr(0x20080522, 0)), (Data * 2)()) != 0:
                raise SystemExit("capset failed")
        """
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


async def test_cleanup_removes_read_only_trees(engine: BaseEngine, tmp_path: Path) -> None:
    ws = await engine.manager.create_workspace("cleanup/me")
    root = host(ws)
    deep = root / "skills" / "tool" / "lib"
    deep.mkdir(parents=True)
    (deep / "mod.py").write_text("x = 1")
    for p in (deep / "mod.py", deep, deep.parent, root / "skills"):
        p.chmod(0o444 if p.is_file() else 0o555)
    (root / "work" / "ro.txt").write_text("ro")
    (root / "work" / "ro.txt").chmod(0o400)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    (root / "out" / "link").symlink_to(outside, target_is_directory=True)
    proc = run_without_privileges(
        f"""
        import asyncio, execspace
        from pathlib import Path
        async def main():
            async with execspace.open_engine("local", workspace_root=Path({str(tmp_path / "ws")!r})) as eng:
                ws = await eng.manager.get_workspace("cleanup/me")
                await eng.manager.cleanup(ws)
                await eng.manager.cleanup(ws)
        asyncio.run(main())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert not root.exists()
    assert (outside / "keep.txt").read_text() == "keep"
    with pytest.raises(WorkspaceNotFound):
        await engine.manager.get_workspace("cleanup/me")
    fresh = await engine.manager.create_workspace("cleanup/me")
    assert (host(fresh) / "work").is_dir()


# -- the default root ------------------------------------------------------------------------------


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point $TMPDIR (as ``tempfile`` sees it) at the test's own directory."""
    base = tmp_path / "tmpdir"
    base.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    return base


async def test_default_root_is_private(private_tmp: Path) -> None:
    async with execspace.open_engine("local") as eng:
        ws = await eng.manager.create_workspace("private")
    user_dir = private_tmp / f"execspace-{os.getuid()}"
    assert host(ws).parent == user_dir / "workspaces"
    root = user_dir / "workspaces"
    assert stat.S_IMODE(root.lstat().st_mode) == 0o700
    # the per-user parent may be traversable (sandbox uids) but never listable or writable by others
    assert stat.S_IMODE(user_dir.lstat().st_mode) & 0o077 in (0, 0o011)
    for d in (user_dir, root):
        st = d.lstat()
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid(), d


async def test_loose_permissions_on_default_root_are_tightened(private_tmp: Path) -> None:
    user_dir = private_tmp / f"execspace-{os.getuid()}"
    (user_dir / "workspaces").mkdir(parents=True)
    user_dir.chmod(0o777)
    (user_dir / "workspaces").chmod(0o777)
    async with execspace.open_engine("local") as eng:
        await eng.manager.create_workspace("tighten")
    assert stat.S_IMODE(user_dir.stat().st_mode) & 0o066 == 0
    assert stat.S_IMODE((user_dir / "workspaces").stat().st_mode) == 0o700


@pytest.mark.parametrize("planted", ["execspace-{uid}", "execspace-{uid}/workspaces"])
async def test_planted_symlink_root_is_refused(private_tmp: Path, tmp_path: Path, planted: str) -> None:
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    link = private_tmp / planted.format(uid=os.getuid())
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(attacker, target_is_directory=True)
    async with execspace.open_engine("local") as eng:
        with pytest.raises(SetupFailed):
            await eng.manager.create_workspace("victim")
    assert list(attacker.iterdir()) == [], "nothing may be created through the planted link"


async def test_root_owned_by_someone_else_is_refused(private_tmp: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("creating a directory owned by another user needs root")
    user_dir = private_tmp / f"execspace-{os.getuid()}"
    user_dir.mkdir(mode=0o777)
    os.chown(user_dir, 65534, 65534)
    async with execspace.open_engine("local") as eng:
        with pytest.raises(SetupFailed):
            await eng.manager.create_workspace("victim")
    assert list(user_dir.iterdir()) == []


async def test_reading_a_missing_file_names_the_path_and_the_workspace(engine: BaseEngine, ws: Workspace) -> None:
    """A newcomer's ``fs.read_file`` of a file that is not there got a bare ``FileNotFoundError``: now the project's
    error, still a ``FileNotFoundError`` (errno ENOENT) for whoever catches that, naming what to look at."""
    for path, named in (("out/missing.csv", "out/missing.csv"), (f"{ws.path}/no/dir/x", "no/dir/x")):
        with pytest.raises(execspace.WorkspaceFileNotFound) as raised:
            await engine.fs.read_file(ws, path)
        assert isinstance(raised.value, FileNotFoundError) and raised.value.errno == errno.ENOENT
        message = str(raised.value)
        assert f"no file {named!r} in workspace 'test/session' ({host(ws)})" in message and "fs.list" in message
        with pytest.raises(execspace.WorkspaceFileNotFound, match="no file"):
            await engine.fs.open_reader(ws, path)
