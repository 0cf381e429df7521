"""The workspace I/O facade, on the local and the sandbox backend."""

from __future__ import annotations

from pathlib import Path

import pytest

from execspace import (
    BaseEngine,
    InputSpec,
    LimitExceeded,
    OutputSpec,
    PathDenied,
    PutFile,
    UsageError,
    Workspace,
)
from execspace.artifacts import ArtifactScope, InMemoryArtifactService
from execspace.tools.workspace_io import FileChange, WorkspaceIO, artifact_path
from tests import bindings

pytestmark = pytest.mark.timeout(60)

any_engine = bindings.any_engine
SCOPE = ArtifactScope("app", "user", "session")


@pytest.fixture
def store() -> InMemoryArtifactService:
    return InMemoryArtifactService()


@pytest.fixture
async def io(any_engine: BaseEngine, store: InMemoryArtifactService) -> WorkspaceIO:
    return await WorkspaceIO.open(any_engine, "app/user/session", artifacts=store)


def host(ws: Workspace) -> Path:
    assert ws.host_path is not None
    return ws.host_path


async def test_round_trip_put_stage_run_collect_read_save(io: WorkspaceIO, store: InMemoryArtifactService) -> None:
    await io.put("work/script.py", "import os\nprint(open('inputs/data.csv').read().upper(), end='')\n")
    assert await io.stage_inputs([InputSpec(b"a,b\n1,2\n", dest="work/inputs/data.csv")]) == ["work/inputs/data.csv"]
    r = await io.run("sh", ["-c", 'python3 script.py > "$OUTPUT_DIR/up.csv"'], timeout=20)
    assert r.exit_code == 0, r.stderr
    [collected] = await io.collect()
    assert (collected.name, collected.content, collected.mime_type) == ("out/up.csv", b"A,B\n1,2\n", "text/csv")
    assert (await io.read("out/up.csv")).content == b"A,B\n1,2\n"

    ref = await io.save_artifact("out/up.csv")
    assert ref == "artifact://out/up.csv@1"
    saved = await store.load(SCOPE, "out/up.csv", 1)
    assert (saved.data, saved.mime_type) == (b"A,B\n1,2\n", "text/csv")
    # a new version each time, and the artifact comes back in as an input
    await io.put("out/up.csv", b"v2")
    assert await io.save_artifact("$OUTPUT_DIR/up.csv") == "artifact://out/up.csv@2"
    await io.stage_inputs([InputSpec("artifact://out/up.csv@1", dest="work/inputs/again.csv")])
    assert (await io.read("work/inputs/again.csv")).content == b"A,B\n1,2\n"


async def test_saving_from_work_and_runs_and_the_record_in_metadata(io: WorkspaceIO) -> None:
    r = await io.run("sh", ["-c", "echo w > notes.txt"])
    assert r.exit_code == 0, r.stderr
    await io.put(f"{r.run_dir}/log.txt", "r\n")
    assert await io.save_artifact("./work/notes.txt") == "artifact://work/notes.txt@1"
    assert await io.save_artifact(f"{r.run_dir}/log.txt") == f"artifact://{r.run_dir}/log.txt@1"
    meta = (host(io.workspace) / "metadata.json").read_text()
    assert "artifact://work/notes.txt@1" in meta


@pytest.mark.parametrize(
    "path",
    ["skills/s/SKILL.md", "src/x.py", "home/.bashrc", "tmp/x", "metadata.json", "out", "work", "../x", "/etc/passwd",
     "out/../metadata.json", "", "$WORKSPACE_DIR/metadata.json"],
)  # fmt: skip
def test_artifact_path_refuses(path: str) -> None:
    with pytest.raises(PathDenied):
        artifact_path(path)


async def test_save_artifact_refusals(io: WorkspaceIO, store: InMemoryArtifactService, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host secret")
    secret.chmod(0o644)
    await io.put("skills/s/SKILL.md", "---\nname: s\n---\n")
    await io.put("out/big.bin", b"x" * 11)
    script = f'ln -s {secret} "$OUTPUT_DIR/link"; echo a > "$OUTPUT_DIR/a"; ln "$OUTPUT_DIR/a" "$OUTPUT_DIR/hard"'
    r = await io.run("sh", ["-c", script])
    assert r.exit_code == 0, r.stderr
    with pytest.raises(PathDenied):
        await io.save_artifact("skills/s/SKILL.md")
    with pytest.raises(PathDenied):
        await io.save_artifact("out/link")  # a symlink to a host file
    with pytest.raises(PathDenied):
        await io.save_artifact("out/hard")  # a hard link may alias a file outside
    with pytest.raises(FileNotFoundError):
        await io.save_artifact("out/missing")
    with pytest.raises(LimitExceeded):
        await io.save_artifact("out/big.bin", max_bytes=10)
    assert await store.list_names(SCOPE) == []
    assert await io.save_artifact("out/big.bin", max_bytes=11) == "artifact://out/big.bin@1"


async def test_default_cap_and_missing_service(any_engine: BaseEngine, io: WorkspaceIO) -> None:
    small = WorkspaceIO(any_engine, io.workspace, InMemoryArtifactService(), max_artifact_bytes=4)
    await small.put("out/five", b"12345")
    with pytest.raises(LimitExceeded):
        await small.save_artifact("out/five")
    bare = WorkspaceIO(any_engine, io.workspace)  # the engine was opened without an artifact service
    with pytest.raises(UsageError):
        await bare.save_artifact("out/five")


async def test_scope_override(any_engine: BaseEngine, io: WorkspaceIO, store: InMemoryArtifactService) -> None:
    other = ArtifactScope("app", "user", "elsewhere")
    scoped = WorkspaceIO(any_engine, io.workspace, store, other)
    await scoped.put("out/x.txt", "x")
    assert await scoped.save_artifact("out/x.txt") == "artifact://out/x.txt@1"
    assert await store.list_names(other) == ["out/x.txt"] and await store.list_names(SCOPE) == []
    manifest = await scoped.collect_outputs(OutputSpec(globs=["out/x.txt"], save=True))
    assert manifest.files[0].saved_as == "artifact://out/x.txt@2"


async def test_put_refuses_escapes(io: WorkspaceIO) -> None:
    # /etc/x: outside the workspace, and where the file API serves the sandbox's view, read-only there
    for bad in ("../x", "/etc/x", "work/../../x"):
        with pytest.raises(PathDenied):
            await io.put_files([PutFile(bad, b"x")])


async def test_put_refuses_the_workspace_record(io: WorkspaceIO) -> None:
    await io.stage_inputs([InputSpec(b"data", dest="work/inputs/d.txt")])
    record = host(io.workspace) / "metadata.json"
    before = record.read_bytes()
    for name in ("metadata.json", "./metadata.json", "metadata.json.corrupt-1-ab", ".metadata.json.1.ab.tmp"):
        with pytest.raises(PathDenied, match="workspace's own record"):
            await io.put(name, "{}")
    assert record.read_bytes() == before
    await io.put("out/metadata.json", "{}")  # only the record itself is refused


async def test_snapshot_and_changes(io: WorkspaceIO) -> None:
    await io.put("out/keep.txt", "same")
    before = await io.snapshot()
    assert set(before) == {"out/keep.txt"}
    await io.run(
        "sh", ["-c", 'echo new > "$OUTPUT_DIR/n.md"; mkdir -p "$OUTPUT_DIR/d"; echo j > "$OUTPUT_DIR/d/j.json"']
    )
    changed, count = await io.changes(before)
    assert count == 2
    assert changed == [
        FileChange("out/d/j.json", 2, "application/json", "created"),
        FileChange("out/n.md", 4, "text/markdown", "created"),
    ]
    listed, count = await io.changes(before, limit=1)
    assert len(listed) == 1 and count == 2
    assert await io.snapshot("work/inputs") == {}
