"""Artifact services: versioning, scopes, names, references, concurrency."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import execspace
from execspace.artifacts import (
    Artifact,
    ArtifactScope,
    ArtifactService,
    FileArtifactService,
    InMemoryArtifactService,
    format_artifact_ref,
    parse_artifact_ref,
)
from execspace.errors import ArtifactNotFound, InvalidSpec

S1 = ArtifactScope("app", "alice", "s1")
S2 = ArtifactScope("app", "alice", "s2")


@pytest.fixture(params=["memory", "file"])
def service(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactService:
    if request.param == "memory":
        return InMemoryArtifactService()
    return FileArtifactService(tmp_path / "artifacts")


# -- versioning -------------------------------------------------------------------------


async def test_versions_start_at_one_and_count_up(service: ArtifactService) -> None:
    versions = [await service.save(S1, "doc.txt", f"v{i}".encode(), "text/plain") for i in (1, 2, 3)]
    assert versions == [1, 2, 3]
    assert await service.list_versions(S1, "doc.txt") == [1, 2, 3]


async def test_load_latest_and_pinned(service: ArtifactService) -> None:
    await service.save(S1, "doc.txt", b"one", "text/plain")
    await service.save(S1, "doc.txt", b"two", "text/csv")
    latest = await service.load(S1, "doc.txt")
    assert (latest.version, latest.data, latest.mime_type) == (2, b"two", "text/csv")
    first = await service.load(S1, "doc.txt", 1)
    assert (first.version, first.data, first.mime_type) == (1, b"one", "text/plain")
    assert isinstance(first, Artifact)
    assert first.name == "doc.txt"
    assert abs(first.created_at - time.time()) < 60


async def test_default_mime_type(service: ArtifactService) -> None:
    await service.save(S1, "blob", b"\x00\x01")
    assert (await service.load(S1, "blob")).mime_type == "application/octet-stream"


async def test_missing_name_and_version_raise_with_context(service: ArtifactService) -> None:
    with pytest.raises(ArtifactNotFound, match=r"'nope'.*app/alice/s1"):
        await service.load(S1, "nope")
    await service.save(S1, "doc", b"x")
    with pytest.raises(ArtifactNotFound, match=r"'doc' version 7.*app/alice/s1") as info:
        await service.load(S1, "doc", 7)
    assert isinstance(info.value, LookupError)


async def test_version_must_be_positive_int(service: ArtifactService) -> None:
    await service.save(S1, "doc", b"x")
    for bad in (0, -1):
        with pytest.raises(InvalidSpec, match="starting at 1"):
            await service.load(S1, "doc", bad)


async def test_names_with_slashes_round_trip(service: ArtifactService) -> None:
    await service.save(S1, "out/report.csv", b"a,b\n", "text/csv")
    await service.save(S1, "out%2Freport.csv", b"other")
    assert (await service.load(S1, "out/report.csv")).data == b"a,b\n"
    assert (await service.load(S1, "out%2Freport.csv")).data == b"other"
    assert await service.list_names(S1) == ["out%2Freport.csv", "out/report.csv"]


async def test_data_must_be_bytes(service: ArtifactService) -> None:
    assert await service.save(S1, "buf", bytearray(b"xy")) == 1  # type: ignore[arg-type]
    assert (await service.load(S1, "buf")).data == b"xy"
    with pytest.raises(InvalidSpec, match="bytes"):
        await service.save(S1, "text", "not bytes")  # type: ignore[arg-type]


# -- scopes ------------------------------------------------------------------------------


async def test_user_names_are_shared_across_sessions(service: ArtifactService) -> None:
    assert await service.save(S1, "user:prefs.json", b"{}") == 1
    assert await service.save(S2, "user:prefs.json", b"{1}") == 2
    assert (await service.load(S1, "user:prefs.json")).data == b"{1}"
    assert await service.list_versions(S2, "user:prefs.json") == [1, 2]
    with pytest.raises(ArtifactNotFound, match=r"app/bob \(user-wide\)"):
        await service.load(ArtifactScope("app", "bob", "s1"), "user:prefs.json")


async def test_session_names_are_not_shared(service: ArtifactService) -> None:
    await service.save(S1, "notes", b"s1 notes")
    with pytest.raises(ArtifactNotFound):
        await service.load(S2, "notes")
    assert await service.save(S2, "notes", b"s2 notes") == 1
    assert (await service.load(S1, "notes")).data == b"s1 notes"
    assert (await service.load(S2, "notes")).data == b"s2 notes"
    # other apps and users see nothing
    for other in (ArtifactScope("app2", "alice", "s1"), ArtifactScope("app", "bob", "s1")):
        assert await service.list_names(other) == []


async def test_list_names_shows_session_and_user_names(service: ArtifactService) -> None:
    await service.save(S1, "b", b"")
    await service.save(S1, "a", b"")
    await service.save(S2, "c", b"")
    await service.save(S2, "user:shared", b"")
    assert await service.list_names(S1) == ["a", "b", "user:shared"]
    assert await service.list_names(S2) == ["c", "user:shared"]


# -- delete -------------------------------------------------------------------------------


async def test_delete_version_keeps_others_and_never_reuses_numbers(service: ArtifactService) -> None:
    for data in (b"1", b"2", b"3"):
        await service.save(S1, "doc", data)
    await service.delete(S1, "doc", 3)
    assert await service.list_versions(S1, "doc") == [1, 2]
    assert (await service.load(S1, "doc")).data == b"2"
    with pytest.raises(ArtifactNotFound):
        await service.load(S1, "doc", 3)
    assert await service.save(S1, "doc", b"4") == 4  # 3 is gone for good
    with pytest.raises(ArtifactNotFound):
        await service.delete(S1, "doc", 3)


async def test_delete_all_versions(service: ArtifactService) -> None:
    await service.save(S1, "doc", b"1")
    await service.save(S1, "doc", b"2")
    await service.save(S1, "keep", b"k")
    await service.delete(S1, "doc")
    assert await service.list_versions(S1, "doc") == []
    assert await service.list_names(S1) == ["keep"]
    with pytest.raises(ArtifactNotFound):
        await service.load(S1, "doc")
    with pytest.raises(ArtifactNotFound):
        await service.delete(S1, "doc")


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a\0b", "../x", "a/../b", "a/..", "/abs", "user:", "user:/abs", "user:../x"])
async def test_invalid_names_are_refused(service: ArtifactService, name: str) -> None:
    with pytest.raises(InvalidSpec):
        await service.save(S1, name, b"x")
    with pytest.raises(InvalidSpec):
        await service.load(S1, name)


@pytest.mark.parametrize("name", ["a..b", "..x", ".", "dir/.hidden", "user:x/y.txt", "ü n i c o d e", "a@b@3"])
async def test_unusual_but_valid_names(service: ArtifactService, name: str) -> None:
    assert await service.save(S1, name, name.encode()) == 1
    assert (await service.load(S1, name)).data == name.encode()
    assert name in await service.list_names(S1)


# -- concurrency ------------------------------------------------------------------------------


async def test_concurrent_saves_get_distinct_consecutive_versions(service: ArtifactService) -> None:
    payloads = [f"payload-{i}".encode() for i in range(50)]
    versions = await asyncio.gather(*(service.save(S1, "hot", p) for p in payloads))
    assert sorted(versions) == list(range(1, 51))
    loaded = {v: (await service.load(S1, "hot", v)).data for v in versions}
    # each save's bytes sit under the version it was given: nothing lost or overwritten
    assert {v: loaded[v] for v in versions} == dict(zip(versions, payloads, strict=True))


_WORKER = """
import asyncio, sys, time
from pathlib import Path
from execspace.artifacts import ArtifactScope, FileArtifactService

root, tag, count = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(root.parent / f"ready-{tag}").touch()
while not (root.parent / "go").exists():
    time.sleep(0.005)

async def main():
    svc = FileArtifactService(root)
    scope = ArtifactScope("app", "alice", "s1")
    vs = await asyncio.gather(*(svc.save(scope, "hot", f"{tag}-{i}".encode()) for i in range(count)))
    print(",".join(map(str, vs)))

asyncio.run(main())
"""


def test_two_processes_save_without_losing_versions(tmp_path: Path) -> None:
    root = tmp_path / "artifacts"
    src_dir = str(Path(execspace.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src_dir, os.environ.get("PYTHONPATH")]))}
    count = 40
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(root), tag, str(count)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for tag in ("p1", "p2")
    ]
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / f"ready-{t}").exists() for t in ("p1", "p2")):
            assert time.monotonic() < deadline, "workers did not start"
            assert all(p.poll() is None for p in procs), "a worker died early"
            time.sleep(0.01)
        (tmp_path / "go").touch()
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], [o[1].decode() for o in outs]
    got = [int(v) for out, _ in outs for v in out.decode().strip().split(",")]
    assert sorted(got) == list(range(1, 2 * count + 1))

    svc = FileArtifactService(root)

    async def read_all() -> set[bytes]:
        return {(await svc.load(S1, "hot", v)).data for v in range(1, 2 * count + 1)}

    expected = {f"{t}-{i}".encode() for t in ("p1", "p2") for i in range(count)}
    assert asyncio.run(read_all()) == expected


# -- file layout ----------------------------------------------------------------------------


async def test_file_service_persists_across_instances(tmp_path: Path) -> None:
    await FileArtifactService(tmp_path).save(S1, "doc", b"kept", "text/plain")
    art = await FileArtifactService(tmp_path).load(S1, "doc")
    assert (art.version, art.data, art.mime_type) == (1, b"kept", "text/plain")


async def test_incomplete_version_is_ignored_and_not_reused(tmp_path: Path) -> None:
    svc = FileArtifactService(tmp_path)
    await svc.save(S1, "doc", b"complete")
    # a writer that crashed after claiming version 2 (no meta.json yet)
    crashed = tmp_path / "app" / "alice" / "s1" / "doc" / "2"
    assert crashed.parent.is_dir()
    crashed.mkdir()
    (crashed / "data").write_bytes(b"half")
    assert await svc.list_versions(S1, "doc") == [1]
    assert (await svc.load(S1, "doc")).data == b"complete"
    with pytest.raises(ArtifactNotFound):
        await svc.load(S1, "doc", 2)
    assert await svc.save(S1, "doc", b"next") == 3


async def test_file_service_never_writes_outside_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    evil = ArtifactScope("..", "..", "..")
    await FileArtifactService(root).save(evil, "x", b"1")
    await FileArtifactService(root).save(evil, "user:x", b"2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["root"]
    assert (await FileArtifactService(root).load(evil, "x")).data == b"1"
    assert await FileArtifactService(root).list_names(evil) == ["user:x", "x"]


async def test_session_named_like_user_dir_does_not_collide(tmp_path: Path) -> None:
    svc = FileArtifactService(tmp_path)
    odd = ArtifactScope("app", "alice", "_user")
    await svc.save(odd, "user:doc", b"user-wide")
    await svc.save(odd, "doc", b"session")  # a session name, not the user-wide one
    assert (await svc.load(S1, "user:doc")).data == b"user-wide"
    with pytest.raises(ArtifactNotFound):
        await svc.load(S1, "doc")
    assert (await svc.load(odd, "doc")).data == b"session"


async def test_long_names_are_stored_and_listed(tmp_path: Path) -> None:
    svc = FileArtifactService(tmp_path)
    base = "n" * 300
    names = [base + "-a", base + "-b", "x" * 130 + "~" + "0" * 32]
    for n in names:
        await svc.save(S1, n, n[-2:].encode())
    for n in names:
        assert (await svc.load(S1, n)).data == n[-2:].encode()
    assert await svc.list_names(S1) == sorted(names)


# -- references and scopes ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "expected"),
    [
        ("artifact://doc@3", ("doc", 3)),
        ("doc@3", ("doc", 3)),
        ("doc", ("doc", None)),
        ("artifact://doc", ("doc", None)),
        ("doc@", ("doc@", None)),
        ("a@b", ("a@b", None)),
        ("a@b@12", ("a@b", 12)),
        ("mail@host@x", ("mail@host@x", None)),
        ("out/report.csv@007", ("out/report.csv", 7)),
        ("user:prefs.json@2", ("user:prefs.json", 2)),
        ("doc@²", ("doc@²", None)),  # a Unicode digit is not a version
        ("doc@-1", ("doc@-1", None)),
    ],
)
def test_parse_artifact_ref(ref: str, expected: tuple[str, int | None]) -> None:
    assert parse_artifact_ref(ref) == expected


@pytest.mark.parametrize("ref", ["", "artifact://", "@3", "artifact://@3", "artifact://../x@1", "/abs@1"])
def test_parse_artifact_ref_refuses_bad_names(ref: str) -> None:
    with pytest.raises(InvalidSpec):
        parse_artifact_ref(ref)


@pytest.mark.parametrize("name", ["doc", "a@b", "x@5", "out/r.csv", "user:p"])
def test_format_parse_round_trip(name: str) -> None:
    ref = format_artifact_ref(name, 4)
    assert ref == f"artifact://{name}@4"
    assert parse_artifact_ref(ref) == (name, 4)


@pytest.mark.parametrize(
    ("ws_id", "expected"),
    [
        ("app/user/session", ("app", "user", "session")),
        ("app/user", ("app", "user", "default")),
        ("app", ("app", "default", "default")),
        ("", ("default", "default", "default")),
        ("a//c", ("a", "default", "c")),
        ("a/b/c/d", ("a", "b", "c/d")),
    ],
)
def test_scope_from_workspace_id(ws_id: str, expected: tuple[str, str, str]) -> None:
    scope = ArtifactScope.from_workspace_id(ws_id)
    assert (scope.app, scope.user, scope.session) == expected


@pytest.mark.parametrize("make", [lambda: ArtifactScope("", "u", "s"), lambda: ArtifactScope("a", "u\0", "s")])
def test_scope_refuses_empty_or_nul(make: Callable[[], ArtifactScope]) -> None:
    with pytest.raises(InvalidSpec):
        make()
