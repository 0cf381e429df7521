"""envd's filesystem service and /files through the official SDK: binary-safe, confined to the home, per sandbox."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import AsyncSandbox, FileType, Sandbox
from e2b.exceptions import (
    AuthenticationException,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from .conftest import Server

EVERY_BYTE = bytes(range(256)) * 4


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


def test_text_and_bytes_round_trip(sbx: Sandbox) -> None:
    sbx.files.write("notes/a.txt", "héllo\n")
    assert sbx.files.read("/home/user/notes/a.txt") == "héllo\n"
    info = sbx.files.write("/home/user/bin.dat", EVERY_BYTE)
    assert info.path == "/home/user/bin.dat" and info.name == "bin.dat"
    assert sbx.files.read("bin.dat", format="bytes") == EVERY_BYTE
    assert b"".join(sbx.files.read("bin.dat", format="stream")) == EVERY_BYTE
    sbx.files.write("bin.dat", b"\xff\xfe\x00")  # overwrite with invalid UTF-8
    assert bytes(sbx.files.read("bin.dat", format="bytes")) == b"\xff\xfe\x00"


def test_octet_stream_gzip_and_many_files(sbx: Sandbox) -> None:
    sbx.files.write("stream.bin", io.BytesIO(EVERY_BYTE))  # a file object goes as octet-stream
    sbx.files.write("gz.bin", EVERY_BYTE, gzip=True)
    written = sbx.files.write_files([{"path": f"many/{i}.txt", "data": f"n{i}"} for i in range(3)])
    assert sorted(w.path for w in written) == [f"/home/user/many/{i}.txt" for i in range(3)]
    assert sbx.files.read("stream.bin", format="bytes") == EVERY_BYTE
    assert sbx.files.read("gz.bin", format="bytes") == EVERY_BYTE
    assert [sbx.files.read(f"many/{i}.txt") for i in range(3)] == ["n0", "n1", "n2"]


def test_list_with_depth_and_entry_info(sbx: Sandbox) -> None:
    sbx.files.write("top/mid/deep/f.txt", "1234")
    one = {e.path for e in sbx.files.list("top")}
    assert one == {"/home/user/top/mid"}
    two = {(e.path, e.type) for e in sbx.files.list("/home/user/top", depth=3)}
    assert two == {
        ("/home/user/top/mid", FileType.DIR),
        ("/home/user/top/mid/deep", FileType.DIR),
        ("/home/user/top/mid/deep/f.txt", FileType.FILE),
    }
    info = sbx.files.get_info("top/mid/deep/f.txt")
    assert (info.name, info.size, info.type, info.owner) == ("f.txt", 4, FileType.FILE, "user")
    with pytest.raises(NotFoundException):
        sbx.files.list("absent")
    with pytest.raises(InvalidArgumentException):
        sbx.files.list("top/mid/deep/f.txt")


def test_entry_info_gives_mode_permissions_and_a_links_target(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo x > f && chmod 750 f && mkdir -m 1777 shared && ln -s f link", cwd="/home/user")
    assert r.exit_code == 0, r.stderr
    f = sbx.files.get_info("f")
    assert (f.mode, f.permissions, f.symlink_target) == (0o750, "-rwxr-x---", None)
    shared = sbx.files.get_info("shared")
    assert (shared.mode, shared.permissions) == (0o1777, "dtrwxrwxrwx")
    link = sbx.files.get_info("link")  # as envd: the link's resolved target, and its target's mode
    assert (link.type, link.symlink_target, link.permissions) == (FileType.SYMLINK, "/home/user/f", "Lrwxrwxrwx")
    assert link.mode == 0o750
    assert {e.name: e.mode for e in sbx.files.list("/home/user")}["f"] == 0o750


def test_make_dir_rename_remove_exists(sbx: Sandbox) -> None:
    assert sbx.files.make_dir("d/e") is True
    assert sbx.files.make_dir("d/e") is False
    sbx.files.write("d/e/x.txt", "x")
    moved = sbx.files.rename("d/e/x.txt", "d/y.txt")
    assert moved.path == "/home/user/d/y.txt"
    assert not sbx.files.exists("d/e/x.txt") and sbx.files.exists("d/y.txt")
    sbx.files.remove("d")
    assert not sbx.files.exists("d")
    with pytest.raises(NotFoundException):
        sbx.files.read("d/y.txt")


def test_paths_outside_the_home_are_the_sandboxes_own(sbx: Sandbox) -> None:
    """In session mode the file API reaches the program's whole view (tests/server/test_machine.py has more)."""
    for path in ("/etc/passwd", "../../etc/passwd"):
        assert "root:" in sbx.files.read(path)
    assert not sbx.files.exists("/home/user/../other")
    path = f"/tmp/{sbx.sandbox_id}.txt"
    sbx.files.write(path, "x")
    assert sbx.commands.run(f"cat {path}").stdout == "x"
    assert not os.path.exists(path)  # the sandbox's /tmp, not the host's


def test_a_sandbox_cannot_see_another_ones_files(sbx: Sandbox) -> None:
    other = Sandbox.create()
    try:
        sbx.files.write("secret.txt", "mine")
        assert not other.files.exists("secret.txt")
        assert "secret.txt" not in [e.name for e in other.files.list("/home/user")]
        assert "secret.txt" in [e.name for e in sbx.files.list("/home/user")]
    finally:
        other.kill()


def test_wrong_access_token_is_refused(sbx: Sandbox, e2b_server: Server) -> None:
    headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
    with httpx.Client(base_url=e2b_server.url) as http:
        for token in ({}, {"X-Access-Token": "wrong"}):
            answer = http.get("/files", params={"path": "x"}, headers={**headers, **token})
            assert answer.status_code == 401
            rpc = http.post("/filesystem.Filesystem/Stat", json={"path": "/home/user"}, headers={**headers, **token})
            assert rpc.status_code == 401 and rpc.json()["code"] == "unauthenticated"
        gone = http.get("/health", headers={"E2b-Sandbox-Id": "nosuch", "E2b-Sandbox-Port": "49983"})
        assert gone.status_code == 502 and "was not found" in gone.json()["message"]


def test_signed_urls(sbx: Sandbox) -> None:
    sbx.files.write("signed.bin", EVERY_BYTE)
    with httpx.Client() as http:
        assert http.get(sbx.download_url("signed.bin")).content == EVERY_BYTE
        upload = http.post(sbx.upload_url("up.txt"), files={"file": ("up.txt", b"uploaded")})
        assert upload.status_code == 200, upload.text
        assert sbx.files.read("up.txt") == "uploaded"
        expired = http.get(sbx.download_url("signed.bin", use_signature_expiration=-10))
        assert expired.status_code == 401 and "expired" in expired.json()["message"]
        forged = sbx.download_url("signed.bin").replace("signature=v1_", "signature=v1_A")
        assert http.get(forged).status_code == 401
        other_path = sbx.download_url("signed.bin").replace("signed.bin", "up.txt")
        assert http.get(other_path).status_code == 401


def test_fifty_megabytes_up_and_down(sbx: Sandbox) -> None:
    data = os.urandom(50 * 1024 * 1024)
    sbx.files.write("big.bin", io.BytesIO(data))
    back = sbx.files.read("big.bin", format="bytes")
    assert hashlib.sha256(back).digest() == hashlib.sha256(data).digest()
    sbx.files.write("big2.bin", data)  # multipart
    assert sbx.files.get_info("big2.bin").size == len(data)


def test_fifty_megabytes_streamed_gzip_and_multipart_from_a_file_object(sbx: Sandbox, tmp_path: Path) -> None:
    data = os.urandom(50 * 1024 * 1024)
    digest = hashlib.sha256(data).digest()
    source = tmp_path / "big.bin"
    source.write_bytes(data)
    with open(source, "rb") as f:
        sbx.files.write("gz.bin", f, gzip=True)  # octet-stream, gzip encoded as it is sent
    with open(source, "rb") as f:
        sbx.files.write("multi.bin", f, use_octet_stream=False)  # one multipart part, streamed by httpx
    for name in ("gz.bin", "multi.bin"):
        streamed = hashlib.sha256()
        for chunk in sbx.files.read(name, format="stream"):
            streamed.update(chunk)
        assert streamed.digest() == digest, name
    assert hashlib.sha256(sbx.files.read("gz.bin", format="bytes", gzip=True)).digest() == digest


def test_multi_file_uploads_write_each_file_whole(sbx: Sandbox) -> None:
    sizes = {"empty.bin": 0, "one.bin": 1, "deep/er/three.bin": 3 * 1024 * 1024, "every.bin": len(EVERY_BYTE)}
    contents = {name: os.urandom(size) for name, size in sizes.items()}
    contents["every.bin"] = EVERY_BYTE
    written = sbx.files.write_files([{"path": name, "data": data} for name, data in contents.items()])
    assert sorted(w.path for w in written) == sorted(f"/home/user/{name}" for name in contents)
    for name, data in contents.items():
        assert sbx.files.read(name, format="bytes") == data, name
        assert sbx.files.get_info(name).size == len(data)
    sbx.files.write("empty2.bin", io.BytesIO(b""))  # octet-stream, no byte at all
    assert sbx.files.read("empty2.bin", format="bytes") == b""


def test_a_failing_part_writes_nothing_of_its_own(sbx: Sandbox, e2b_server: Server) -> None:
    """Each part of a multipart upload is written when it ends: one refused (where the user may not write, over a
    directory) is answered 403 or 400 and leaves no file, the parts before it stay written."""
    sbx.files.make_dir("a-dir")
    for bad, status in (("/etc/x.txt", 403), ("a-dir", 400)):
        parts = [("file", ("first.txt", b"first")), ("file", (bad, b"bad")), ("file", ("third.txt", b"third"))]
        answer = httpx.post(f"{e2b_server.url}/files", files=parts, headers=_headers(sbx), timeout=30)
        assert answer.status_code == status, answer.text
        assert sbx.files.read("first.txt") == "first"
        assert not sbx.files.exists("third.txt")
        assert sbx.files.get_info("a-dir").type == FileType.DIR
        names = {e.name for e in sbx.files.list("/home/user")}
        assert not any(n.endswith(".tmp") for n in names), names
    with pytest.raises(InvalidArgumentException, match="directory"):
        sbx.files.write("a-dir", b"x")
    sbx.files.write("plain.txt", "p")
    with pytest.raises(InvalidArgumentException):
        sbx.files.write("plain.txt/below.txt", b"x")


def test_downloads_refuse_what_is_not_a_regular_file(sbx: Sandbox) -> None:
    r = sbx.commands.run("mkfifo fifo && ln -s marker.txt link && mkdir d", cwd="/home/user")
    assert r.exit_code == 0, r.stderr
    with pytest.raises(InvalidArgumentException, match="FIFO"):
        sbx.files.read("fifo")
    with pytest.raises(InvalidArgumentException, match="symlink"):
        sbx.files.read("link")
    with pytest.raises(InvalidArgumentException, match="directory"):
        sbx.files.read("d")
    with pytest.raises(NotFoundException):
        sbx.files.read("absent")


def _headers(sbx: Sandbox) -> dict[str, str]:
    return {"E2b-Sandbox-Id": sbx.sandbox_id, "X-Access-Token": sbx._envd_access_token or ""}


def test_gzip_bomb_is_refused(sbx: Sandbox, e2b_server: Server) -> None:
    bomb = gzip.compress(b"\0" * (100 * 1024 * 1024))  # over the server's 64 MB limit, 100 kB compressed
    headers = {
        "E2b-Sandbox-Id": sbx.sandbox_id,
        "X-Access-Token": sbx._envd_access_token or "",
        "Content-Type": "application/octet-stream",
        "Content-Encoding": "gzip",
    }
    answer = httpx.post(f"{e2b_server.url}/files", params={"path": "bomb"}, content=bomb, headers=headers, timeout=60)
    assert answer.status_code == 413
    assert not sbx.files.exists("bomb")


def test_sync_watch(sbx: Sandbox) -> None:
    sbx.files.make_dir("w")
    handle = sbx.files.watch_dir("w", recursive=True)
    try:
        sbx.files.write("w/new.txt", "data")
        sbx.files.write("w/sub/deep.txt", "x")
        events = handle.get_new_events()
        seen = {(e.name, e.type) for e in events}
        assert ("new.txt", FilesystemEventType.CREATE) in seen
        assert ("new.txt", FilesystemEventType.WRITE) in seen
        assert ("sub/deep.txt", FilesystemEventType.CREATE) in seen
        sbx.files.remove("w/new.txt")
        assert ("new.txt", FilesystemEventType.REMOVE) in {(e.name, e.type) for e in handle.get_new_events()}
    finally:
        handle.stop()


async def test_async_files_and_watch(asbx: AsyncSandbox) -> None:
    await asbx.files.write("a/b.bin", EVERY_BYTE)
    assert await asbx.files.read("a/b.bin", format="bytes") == EVERY_BYTE
    assert [e.name for e in await asbx.files.list("a")] == ["b.bin"]
    got = []
    arrived = asyncio.Event()

    def on_event(event: object) -> None:
        got.append(event)
        arrived.set()

    handle = await asbx.files.watch_dir("a", on_event)
    try:
        await asbx.files.write("a/c.txt", "c")
        await asyncio.wait_for(arrived.wait(), 10)
        assert any(e.name == "c.txt" and e.type is FilesystemEventType.CREATE for e in got)
    finally:
        await handle.stop()
    with pytest.raises(SandboxException):
        await asbx.files.write("/etc/x", "x")


def test_wrong_user_is_refused(sbx: Sandbox) -> None:
    with pytest.raises(SandboxException, match="only user is 'user'"):
        sbx.files.read("x", user="root")
    assert sbx.files.write("u.txt", "u", user="user").path == "/home/user/u.txt"
    with pytest.raises(AuthenticationException):
        Sandbox.connect(sbx.sandbox_id, api_key="e2b_bad")
