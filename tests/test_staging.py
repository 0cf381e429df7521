"""Staging inputs and collecting outputs over the WorkspaceFS primitives."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from execspace.artifacts import ArtifactScope, InMemoryArtifactService
from execspace.errors import (
    ArtifactNotFound,
    InputError,
    InvalidSpec,
    LimitExceeded,
    PartialOutputCommit,
    PathDenied,
    UsageError,
)
from execspace.models import File, FileEntry, InputSpec, OutputSpec, PutFile, Workspace
from execspace.workspace.hostfs import HostWorkspaceFS
from execspace.workspace.layout import ensure_layout
from execspace.workspace.staging import (
    MetadataLocks,
    WorkspaceFSBase,
    collect_outputs,
    load_ws_metadata,
    save_ws_metadata,
    stage_inputs,
)

SCOPE = ArtifactScope("app", "alice", "s1")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "ws"
    r.mkdir()
    ensure_layout(r)
    return r


@pytest.fixture
def ws(root: Path) -> Workspace:
    return Workspace(id="app/alice/s1", path=str(root), backend="local", host_path=root)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    h = tmp_path / "host"
    h.mkdir()
    return h


@pytest.fixture
def artifacts() -> InMemoryArtifactService:
    return InMemoryArtifactService()


@pytest.fixture
def fs(artifacts: InMemoryArtifactService, host_root: Path) -> HostWorkspaceFS:
    return HostWorkspaceFS(artifacts=artifacts, host_roots=[host_root])


class RemoteLikeFS(WorkspaceFSBase):
    """Only the WorkspaceFS primitives, for workspaces the host cannot see (``host_path=None``).

    Stands in for a container or remote backend: it has no ``link_host`` and the
    workspaces it hands out carry no host path.
    """

    def __init__(self, inner: HostWorkspaceFS, root: Path) -> None:
        super().__init__()
        self.inner = inner
        self.root = root

    async def stat(self, ws: Workspace, path: str) -> FileEntry:
        return await self.inner.stat(self._real(ws), path)

    def _real(self, ws: Workspace) -> Workspace:
        return dataclasses.replace(ws, host_path=self.root)

    async def put_files(self, ws: Workspace, files: Sequence[PutFile]) -> None:
        await self.inner.put_files(self._real(ws), files)

    async def read_file(self, ws: Workspace, path: str, *, max_bytes: int | None = None) -> File:
        return await self.inner.read_file(self._real(ws), path, max_bytes=max_bytes)

    async def list(self, ws: Workspace, patterns: Sequence[str]) -> list[FileEntry]:
        return await self.inner.list(self._real(ws), patterns)

    async def collect(
        self,
        ws: Workspace,
        patterns: Sequence[str],
        *,
        max_files: int = 100,
        max_file_bytes: int = 1 << 22,
        max_total_bytes: int = 1 << 26,
    ) -> list[File]:
        return await self.inner.collect(
            self._real(ws),
            patterns,
            max_files=max_files,
            max_file_bytes=max_file_bytes,
            max_total_bytes=max_total_bytes,
        )

    async def stage_directory(self, ws: Workspace, src: Path, dest: str, *, read_only: bool = False) -> None:
        await self.inner.stage_directory(self._real(ws), src, dest, read_only=read_only)


def meta_of(root: Path) -> Any:
    return json.loads((root / "metadata.json").read_text())


async def stage(fs: HostWorkspaceFS, ws: Workspace, *inputs: InputSpec, host_root: Path | None = None) -> list[str]:
    return await stage_inputs(
        fs,
        ws,
        list(inputs),
        artifacts=fs.artifacts,
        scope=SCOPE,
        host_roots=[host_root] if host_root else [],
        locks=fs.locks,
    )


# -- bytes and artifacts ------------------------------------------------------------------


async def test_bytes_input(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    assert await stage(fs, ws, InputSpec(b"hello", dest="work/data/h.txt")) == ["work/data/h.txt"]
    assert (root / "work/data/h.txt").read_bytes() == b"hello"
    [rec] = meta_of(root)["inputs"]
    assert rec["src"] == "bytes"
    assert rec["dest"] == "work/data/h.txt"
    assert rec["resolved"].startswith("sha256:2cf24dba")


async def test_bytes_input_needs_a_file_dest(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(InvalidSpec):
        await stage(fs, ws, InputSpec(b"x", dest="work/"))


async def test_artifact_input_latest_and_explicit_version(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    await artifacts.save(SCOPE, "out/report.csv", b"v1")
    await artifacts.save(SCOPE, "out/report.csv", b"v2")
    await artifacts.save(SCOPE, "user:prefs.json", b"{}")
    written = await stage(
        fs,
        ws,
        InputSpec("artifact://out/report.csv"),
        InputSpec("artifact://out/report.csv@1", dest="work/old.csv"),
        InputSpec("artifact://user:prefs.json"),
    )
    assert written == ["work/inputs/report.csv", "work/old.csv", "work/inputs/prefs.json"]
    assert (root / "work/inputs/report.csv").read_bytes() == b"v2"
    assert (root / "work/old.csv").read_bytes() == b"v1"
    assert (root / "work/inputs/prefs.json").read_bytes() == b"{}"
    recs = meta_of(root)["inputs"]
    assert [(r["resolved"], r["version"]) for r in recs] == [
        ("out/report.csv", 2),
        ("out/report.csv", 1),
        ("user:prefs.json", 1),
    ]


async def test_artifact_scope_defaults_to_workspace_id(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    await artifacts.save(ArtifactScope("app", "alice", "s1"), "doc", b"mine")
    await stage_inputs(fs, ws, [InputSpec("artifact://doc")], artifacts=artifacts)
    assert (root / "work/inputs/doc").read_bytes() == b"mine"


async def test_missing_artifact(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(ArtifactNotFound, match="'ghost'"):
        await stage(fs, ws, InputSpec("artifact://ghost"))


async def test_artifact_input_without_service(ws: Workspace, host_root: Path) -> None:
    fs = HostWorkspaceFS(host_roots=[host_root])
    with pytest.raises(InputError, match=r"no artifact service configured: pass artifacts=\.\.\. to open_engine"):
        await stage_inputs(fs, ws, [InputSpec("artifact://doc")])


async def test_pin_reuses_the_recorded_version(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    await artifacts.save(SCOPE, "model.bin", b"first")
    await stage(fs, ws, InputSpec("artifact://model.bin", pin=True))
    await artifacts.save(SCOPE, "model.bin", b"second")

    await stage(fs, ws, InputSpec("artifact://model.bin", pin=True))
    assert (root / "work/inputs/model.bin").read_bytes() == b"first"
    # another dest has no record yet: latest
    await stage(fs, ws, InputSpec("artifact://model.bin", dest="work/m2.bin", pin=True))
    assert (root / "work/m2.bin").read_bytes() == b"second"
    # without pin: latest
    await stage(fs, ws, InputSpec("artifact://model.bin"))
    assert (root / "work/inputs/model.bin").read_bytes() == b"second"
    versions = [r["version"] for r in meta_of(root)["inputs"]]
    assert versions == [1, 1, 2, 2]


async def test_link_mode_refused_for_artifacts(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(UsageError, match="mode='copy'"):
        await stage(fs, ws, InputSpec("artifact://doc", mode="link"))


# -- host inputs ------------------------------------------------------------------------------


async def test_host_file_inside_allowed_root(fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path) -> None:
    (host_root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (host_root / "run.sh").chmod(0o755)
    assert await stage(fs, ws, InputSpec(f"host://{host_root}/run.sh"), host_root=host_root) == ["work/inputs/run.sh"]
    staged = root / "work/inputs/run.sh"
    assert staged.read_text() == "#!/bin/sh\necho hi\n"
    assert not staged.is_symlink()
    assert staged.stat().st_mode & 0o111
    [rec] = meta_of(root)["inputs"]
    assert rec["resolved"] == str((host_root / "run.sh").resolve())


async def test_host_path_outside_roots_is_denied_before_anything_is_staged(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    with pytest.raises(PathDenied, match=r"outside the allowed host roots .*host_roots=") as info:
        await stage(
            fs,
            ws,
            InputSpec(b"first", dest="work/first.txt"),
            InputSpec(f"host://{secret}"),
            host_root=host_root,
        )
    assert str(host_root.resolve()) in str(info.value)
    assert not (root / "work/first.txt").exists()
    assert not (root / "work/inputs/secret.txt").exists()
    assert not (root / "metadata.json").exists()


async def test_host_input_with_no_roots_allowed(fs: HostWorkspaceFS, ws: Workspace, host_root: Path) -> None:
    (host_root / "f").write_text("x")
    with pytest.raises(PathDenied, match=r"\(none\)"):
        await stage(fs, ws, InputSpec(f"host://{host_root}/f"))


async def test_host_symlink_escaping_the_root_is_denied(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("s3cret")
    (host_root / "innocent.txt").symlink_to(tmp_path / "secret.txt")
    (host_root / "dotdot").symlink_to(tmp_path)
    for src in (f"host://{host_root}/innocent.txt", f"host://{host_root}/dotdot/secret.txt"):
        with pytest.raises(PathDenied):
            await stage(fs, ws, InputSpec(src), host_root=host_root)
    with pytest.raises(PathDenied):
        await stage(fs, ws, InputSpec(f"host://{host_root}/../secret.txt"), host_root=host_root)
    assert not any((root / "work/inputs").iterdir())


async def test_host_directory_skips_symlinks_inside(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    data = host_root / "data"
    (data / "sub").mkdir(parents=True)
    (data / "a.txt").write_text("A")
    (data / "sub" / "b.txt").write_text("B")
    (data / "leak.txt").symlink_to(outside / "secret.txt")
    (data / "sub" / "leakdir").symlink_to(outside)
    (data / "inner.txt").symlink_to(data / "a.txt")  # even links that stay inside are skipped

    assert await stage(fs, ws, InputSpec(f"host://{data}"), host_root=host_root) == ["work/inputs/data"]
    staged = root / "work/inputs/data"
    found = sorted(str(p.relative_to(staged)) for p in staged.rglob("*"))
    assert found == ["a.txt", "sub", "sub/b.txt"]
    assert (staged / "sub/b.txt").read_text() == "B"
    assert not any(p.is_symlink() for p in staged.rglob("*"))


async def test_missing_host_path(fs: HostWorkspaceFS, ws: Workspace, host_root: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        await stage(fs, ws, InputSpec(f"host://{host_root}/nope"), host_root=host_root)


async def test_host_path_must_be_absolute(fs: HostWorkspaceFS, ws: Workspace, host_root: Path) -> None:
    with pytest.raises(InputError, match="absolute"):
        await stage(fs, ws, InputSpec("host://relative/x"), host_root=host_root)


async def test_host_file_cap(ws: Workspace, root: Path, host_root: Path) -> None:
    from execspace.workspace.staging import Stager

    (host_root / "big").write_bytes(b"x" * 101)
    (host_root / "ok").write_bytes(b"x" * 100)
    stager = Stager(HostWorkspaceFS(host_roots=[host_root]), host_roots=[host_root], max_input_bytes=100)
    await stager.stage_inputs(ws, [InputSpec(f"host://{host_root}/ok")])
    with pytest.raises(LimitExceeded, match="101 bytes"):
        await stager.stage_inputs(ws, [InputSpec(f"host://{host_root}/big")])
    assert not (root / "work/inputs/big").exists()


async def test_link_mode_makes_a_symlink(fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path) -> None:
    (host_root / "shared").mkdir()
    await stage(fs, ws, InputSpec(f"host://{host_root}/shared", mode="link"), host_root=host_root)
    link = root / "work/inputs/shared"
    assert link.is_symlink()
    assert Path(os.readlink(link)) == (host_root / "shared").resolve()
    assert meta_of(root)["inputs"][0]["mode"] == "link"


async def test_link_mode_needs_host_paths(fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path) -> None:
    (host_root / "f").write_text("x")
    remote = RemoteLikeFS(fs, root)
    with pytest.raises(UsageError, match="link mode needs a backend with host paths; use mode='copy'"):
        await stage_inputs(remote, ws, [InputSpec(f"host://{host_root}/f", mode="link")], host_roots=[host_root])
    assert not (root / "work/inputs/f").exists()


# -- workspace and skill inputs ---------------------------------------------------------------


async def test_workspace_file_and_directory_copy(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    (root / "work/res/deep").mkdir(parents=True)
    (root / "work/res/a.txt").write_text("A")
    (root / "work/res/deep/b.sh").write_text("#!/bin/sh\n")
    (root / "work/res/.hidden").write_text("H")
    written = await stage(
        fs,
        ws,
        InputSpec("workspace://work/res/a.txt", dest="work/copy.txt"),
        InputSpec("workspace://work/res"),
    )
    assert written == ["work/copy.txt", "work/inputs/res"]
    assert (root / "work/copy.txt").read_text() == "A"
    copied = root / "work/inputs/res"
    assert sorted(str(p.relative_to(copied)) for p in copied.rglob("*") if p.is_file()) == [
        ".hidden",
        "a.txt",
        "deep/b.sh",
    ]
    assert (copied / "deep/b.sh").stat().st_mode & 0o111  # scripts stay runnable


async def test_workspace_path_with_glob_characters_is_literal(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    (root / "work/[x]").mkdir()
    (root / "work/[x]/f.txt").write_text("bracket")
    (root / "work/x").mkdir()
    (root / "work/x/g.txt").write_text("plain")
    await stage(fs, ws, InputSpec("workspace://work/[x]", dest="work/copied"))
    assert [p.name for p in (root / "work/copied").iterdir()] == ["f.txt"]


@pytest.mark.parametrize(
    "src",
    ["workspace://../outside", "workspace://work/../../x", "workspace:///etc/passwd", "skill://../work"],
)
async def test_workspace_escapes_are_denied(fs: HostWorkspaceFS, ws: Workspace, src: str) -> None:
    with pytest.raises(PathDenied):
        await stage(fs, ws, InputSpec(src, dest="work/x"))


async def test_workspace_symlink_is_not_followed(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, tmp_path: Path
) -> None:
    (tmp_path / "secret.txt").write_text("s3cret")
    (root / "work/link.txt").symlink_to(tmp_path / "secret.txt")
    with pytest.raises(PathDenied):
        await stage(fs, ws, InputSpec("workspace://work/link.txt"))
    assert not (root / "work/inputs/link.txt").exists()


async def test_missing_workspace_path(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(InputError, match="does not exist"):
        await stage(fs, ws, InputSpec("workspace://work/nope"))


async def test_skill_inputs(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    (root / "skills/pdf/scripts").mkdir(parents=True)
    (root / "skills/pdf/SKILL.md").write_text("# pdf")
    (root / "skills/pdf/scripts/x.py").write_text("print(1)")
    written = await stage(fs, ws, InputSpec("skill://pdf"), InputSpec("skill://pdf/SKILL.md", dest="work/"))
    assert written == ["work/inputs/pdf", "work/SKILL.md"]
    assert (root / "work/inputs/pdf/scripts/x.py").read_text() == "print(1)"
    assert (root / "work/SKILL.md").read_text() == "# pdf"
    assert [r["resolved"] for r in meta_of(root)["inputs"]] == ["skills/pdf", "skills/pdf/SKILL.md"]


async def test_unknown_scheme(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(InputError, match="unsupported input source 'ftp://x'"):
        await stage(fs, ws, InputSpec("ftp://x"))


@pytest.mark.parametrize("dest", ["metadata.json", "../x", "/abs", "work/../../x"])
async def test_bad_or_reserved_dest(fs: HostWorkspaceFS, ws: Workspace, root: Path, dest: str) -> None:
    with pytest.raises(PathDenied):
        await stage(fs, ws, InputSpec(b"{}", dest=dest))
    assert not (root / "metadata.json").exists()


async def test_partial_failure_records_what_was_staged(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    with pytest.raises(ArtifactNotFound):
        await stage(fs, ws, InputSpec(b"ok", dest="work/ok.txt"), InputSpec("artifact://ghost"))
    assert (root / "work/ok.txt").read_bytes() == b"ok"
    assert [r["dest"] for r in meta_of(root)["inputs"]] == ["work/ok.txt"]


async def test_concurrent_staging_loses_no_record(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    await asyncio.gather(*(stage(fs, ws, InputSpec(b"%d" % i, dest=f"work/f{i}")) for i in range(20)))
    dests = sorted(r["dest"] for r in meta_of(root)["inputs"])
    assert dests == sorted(f"work/f{i}" for i in range(20))


async def test_staging_works_without_host_paths(fs: HostWorkspaceFS, root: Path, host_root: Path) -> None:
    remote_ws = Workspace(id="app/alice/s1", path="/workspace", backend="remote", host_path=None)
    remote = RemoteLikeFS(fs, root)
    (host_root / "d").mkdir()
    (host_root / "d" / "f.txt").write_text("F")
    await stage_inputs(
        remote,
        remote_ws,
        [InputSpec(b"b", dest="work/b"), InputSpec(f"host://{host_root}/d")],
        host_roots=[host_root],
    )
    assert (root / "work/b").read_bytes() == b"b"
    assert (root / "work/inputs/d/f.txt").read_text() == "F"
    assert len(meta_of(root)["inputs"]) == 2


# -- metadata ---------------------------------------------------------------------------------


async def test_corrupt_metadata_is_recovered_and_kept(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    garbage = b'{"inputs": [ this is not json \xff'
    (root / "metadata.json").write_bytes(garbage)
    await stage(fs, ws, InputSpec(b"x", dest="work/x"))
    meta = meta_of(root)
    assert [r["dest"] for r in meta["inputs"]] == ["work/x"]
    assert meta["id"] == "app/alice/s1"
    aside = meta["recovered_from"]
    assert aside.startswith("metadata.json.corrupt-")
    assert (root / aside).read_bytes() == garbage
    assert oct((root / "metadata.json").stat().st_mode & 0o777) == oct(0o600)


async def test_metadata_with_wrong_types_counts_as_corrupt(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    bad = json.dumps({"inputs": [{"src": "s", "dest": "d", "resolved": "r", "mode": "copy", "version": "3"}]})
    (root / "metadata.json").write_text(bad)
    meta = await load_ws_metadata(fs, ws)
    assert meta.inputs == []
    assert meta.recovered_from is not None
    assert (root / meta.recovered_from).read_text() == bad


async def test_metadata_round_trip_and_missing(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    fresh = await load_ws_metadata(fs, ws)
    assert (fresh.id, fresh.inputs, fresh.recovered_from) == ("app/alice/s1", [], None)
    fresh.skills["pdf"] = {"digest": "abc"}
    await save_ws_metadata(fs, ws, fresh)
    again = await load_ws_metadata(fs, ws)
    assert again.skills == {"pdf": {"digest": "abc"}}
    assert again.recovered_from is None


def test_metadata_locks_are_per_workspace() -> None:
    locks = MetadataLocks()
    a = Workspace(id="a", path="/a", backend="local")
    assert locks.lock(a) is locks.lock(dataclasses.replace(a, path="/elsewhere"))
    assert locks.lock(a) is not locks.lock(Workspace(id="b", path="/b", backend="local"))


# -- outputs ----------------------------------------------------------------------------------


def write_outputs(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


async def test_collect_count_cap(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    write_outputs(root, {f"out/f{i}.txt": b"x" for i in range(5)})
    m = await collect_outputs(fs, ws, OutputSpec(max_files=3), locks=fs.locks)
    assert [f.name for f in m.files] == ["out/f0.txt", "out/f1.txt", "out/f2.txt"]
    assert m.limits_hit
    exact = await collect_outputs(fs, ws, OutputSpec(max_files=5), locks=fs.locks)
    assert len(exact.files) == 5
    assert not exact.limits_hit


async def test_collect_per_file_cap(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    write_outputs(root, {"out/big.txt": b"0123456789", "out/small.txt": b"abcd"})
    m = await collect_outputs(fs, ws, OutputSpec(max_file_bytes=4, inline=True))
    big, small = m.files
    assert (big.content, big.size_bytes, big.truncated) == (b"0123", 10, True)
    assert (small.content, small.size_bytes, small.truncated) == (b"abcd", 4, False)
    assert m.limits_hit


async def test_collect_total_cap(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    write_outputs(root, {"out/a": b"AAAA", "out/b": b"BBBB", "out/c": b"CCCC"})
    m = await collect_outputs(fs, ws, OutputSpec(max_total_bytes=6, inline=True))
    assert [(f.name, f.content, f.truncated) for f in m.files] == [
        ("out/a", b"AAAA", False),
        ("out/b", b"BB", True),
    ]
    assert m.limits_hit
    # exactly at the cap: everything fits, nothing was cut
    exact = await collect_outputs(fs, ws, OutputSpec(max_total_bytes=12, inline=True))
    assert [f.content for f in exact.files] == [b"AAAA", b"BBBB", b"CCCC"]
    assert not exact.limits_hit
    # the budget ends exactly at a file boundary with more files left
    boundary = await collect_outputs(fs, ws, OutputSpec(max_total_bytes=8, inline=True))
    assert [f.content for f in boundary.files] == [b"AAAA", b"BBBB"]
    assert boundary.limits_hit


async def test_collect_without_inline_has_no_content(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    write_outputs(root, {"out/r.csv": b"a,b\n"})
    [ref] = (await collect_outputs(fs, ws)).files
    assert ref.content is None
    assert ref.mime_type == "text/csv"
    assert ref.host_path == root / "out/r.csv"
    assert (ref.saved_as, ref.version) == (None, None)


async def test_save_outputs_as_artifacts(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    write_outputs(root, {"out/r.csv": b"a,b\n", "out/img/p.bin": b"\x00\x01"})
    spec = OutputSpec(save=True, name_prefix="run1/")
    m = await collect_outputs(fs, ws, spec, artifacts=artifacts, scope=SCOPE)
    assert [(f.name, f.saved_as, f.version) for f in m.files] == [
        ("out/img/p.bin", "artifact://run1/out/img/p.bin@1", 1),
        ("out/r.csv", "artifact://run1/out/r.csv@1", 1),
    ]
    art = await artifacts.load(SCOPE, "run1/out/r.csv")
    assert (art.data, art.mime_type) == (b"a,b\n", "text/csv")
    (root / "out/r.csv").write_bytes(b"changed")
    m2 = await collect_outputs(fs, ws, OutputSpec(globs=["out/*.csv"], save=True), artifacts=artifacts, scope=SCOPE)
    assert [f.saved_as for f in m2.files] == ["artifact://out/r.csv@1"]
    m3 = await collect_outputs(fs, ws, spec, artifacts=artifacts, scope=SCOPE)
    assert m3.files[1].saved_as == "artifact://run1/out/r.csv@2"
    outputs = meta_of(root)["outputs"]
    assert outputs[0]["saved_as"] == ["artifact://run1/out/img/p.bin@1", "artifact://run1/out/r.csv@1"]
    assert (outputs[1]["globs"], outputs[1]["files"]) == (["out/*.csv"], ["out/r.csv"])
    assert outputs[1]["saved_as"] == ["artifact://out/r.csv@1"]


async def test_save_of_truncated_file_fails_before_saving_anything(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    write_outputs(root, {"out/a.txt": b"small", "out/b.txt": b"x" * 50})
    with pytest.raises(LimitExceeded, match=r"'out/b\.txt' \(50 bytes\).*max_file_bytes \(now 10\)"):
        await collect_outputs(fs, ws, OutputSpec(save=True, max_file_bytes=10), artifacts=artifacts, scope=SCOPE)
    with pytest.raises(LimitExceeded, match=r"'out/b\.txt'.*max_total_bytes \(now 20\)"):
        await collect_outputs(fs, ws, OutputSpec(save=True, max_total_bytes=20), artifacts=artifacts, scope=SCOPE)
    assert await artifacts.list_names(SCOPE) == []
    assert not (root / "metadata.json").exists()


async def test_save_without_service(ws: Workspace, root: Path) -> None:
    write_outputs(root, {"out/a.txt": b"a"})
    with pytest.raises(UsageError, match="artifact service"):
        await collect_outputs(HostWorkspaceFS(), ws, OutputSpec(save=True))


async def test_invalid_saved_name_fails_before_saving(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    write_outputs(root, {"out/a.txt": b"a"})
    with pytest.raises(InvalidSpec):
        await collect_outputs(fs, ws, OutputSpec(save=True, name_prefix="/"), artifacts=artifacts, scope=SCOPE)
    assert await artifacts.list_names(SCOPE) == []


async def test_collect_records_output(fs: HostWorkspaceFS, ws: Workspace, root: Path) -> None:
    write_outputs(root, {"out/a.txt": b"a", "out/b.txt": b"b"})
    await collect_outputs(fs, ws, OutputSpec(max_files=1))
    [rec] = meta_of(root)["outputs"]
    assert (rec["globs"], rec["files"], rec["saved_as"], rec["limits_hit"]) == (
        ["out/**"],
        ["out/a.txt"],
        [],
        True,
    )


async def test_metadata_write_failure_is_a_partial_commit(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, artifacts: InMemoryArtifactService
) -> None:
    write_outputs(root, {"out/a.txt": b"a"})
    (root / "metadata.json").mkdir()  # the record cannot be written over a directory
    with pytest.raises(PartialOutputCommit, match="collected and saved") as info:
        await collect_outputs(fs, ws, OutputSpec(save=True), artifacts=artifacts, scope=SCOPE)
    assert [f.saved_as for f in info.value.manifest.files] == ["artifact://out/a.txt@1"]
    assert isinstance(info.value.cause, PathDenied)
    assert (await artifacts.load(SCOPE, "out/a.txt")).data == b"a"


async def test_collect_without_host_paths(fs: HostWorkspaceFS, root: Path) -> None:
    write_outputs(root, {"out/a.txt": b"a"})
    remote_ws = Workspace(id="app/alice/s1", path="/workspace", backend="remote", host_path=None)
    m = await collect_outputs(RemoteLikeFS(fs, root), remote_ws, OutputSpec(inline=True))
    [ref] = m.files
    assert (ref.name, ref.content, ref.host_path) == ("out/a.txt", b"a", None)
    assert meta_of(root)["outputs"][0]["files"] == ["out/a.txt"]


async def test_globs_must_not_be_a_string(fs: HostWorkspaceFS, ws: Workspace) -> None:
    with pytest.raises(InvalidSpec):
        await collect_outputs(fs, ws, OutputSpec(globs="out/**"))


async def test_hostfs_delegates_to_staging(
    fs: HostWorkspaceFS, ws: Workspace, root: Path, host_root: Path, artifacts: InMemoryArtifactService
) -> None:
    (host_root / "in.txt").write_text("in")
    await fs.stage_inputs(ws, [InputSpec(f"host://{host_root}/in.txt")])
    assert (root / "work/inputs/in.txt").read_text() == "in"
    write_outputs(root, {"out/o.txt": b"o"})
    m = await fs.collect_outputs(ws, OutputSpec(save=True))
    assert m.files[0].saved_as == "artifact://out/o.txt@1"
    assert (await artifacts.load(ArtifactScope.from_workspace_id(ws.id), "out/o.txt")).data == b"o"
