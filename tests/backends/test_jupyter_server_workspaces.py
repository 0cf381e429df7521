"""Remote mode with ``shared_filesystem=False``, against a real Jupyter Server and Kernel Gateway started here.

The server and its kernels run on this host, but the engine never gets a host path: workspaces live under the
server's root and every file moves through a kernel. The tests touch the server's directory only to verify
what the engine did there (and to plant what a hostile program would, outside the workspace).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator
from itertools import count
from pathlib import Path

import pytest
import pytest_asyncio

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

from execspace import (
    BaseEngine,
    FileKind,
    InputSpec,
    OutputSpec,
    Persistence,
    PutFile,
    RunProgramSpec,
    Workspace,
    WorkspacePolicy,
    open_engine,
)
from execspace.artifacts import ArtifactScope, InMemoryArtifactService
from execspace.backends.jupyter import ServerKernels
from execspace.backends.jupyter.remote_server import LocalServer, start_local_server
from execspace.backends.jupyter.serverapi import ServerApi
from execspace.backends.jupyter.serverkernels import RemoteKernelSessions
from execspace.backends.jupyter.serverworkspaces import CHUNK
from execspace.errors import CapabilityError, LimitExceeded, PathDenied, UnsupportedBackend, WorkspaceNotFound
from tests.backends.jupyter_support import wait_dead

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(importlib.util.find_spec("jupyter_server") is None, reason="jupyter_server is not installed"),
]

_roots = count()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalServer]:
    async with start_local_server(tmp_path_factory.mktemp("farroot")) as srv:
        yield srv


@pytest.fixture(scope="module")
def allowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("allowed")


@pytest_asyncio.fixture(loop_scope="module")
async def engine(server: LocalServer, allowed: Path) -> AsyncIterator[BaseEngine]:
    async with open_engine(
        "jupyter",
        host_roots=[allowed],
        artifacts=InMemoryArtifactService(),
        interrupt_grace=1.0,
        mode=ServerKernels(
            url=server.url, token=server.token, shared_filesystem=False, remote_root=f"far{next(_roots)}"
        ),
    ) as eng:
        yield eng


@pytest_asyncio.fixture(loop_scope="module")
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("far/session")


def on_server(server: LocalServer, ws: Workspace) -> Path:
    """Where the workspace is on the server (only for verifying: the engine has no such path)."""
    path = Path(ws.path)
    assert path.is_relative_to(server.root_dir.resolve()) and ws.host_path is None
    return path


async def test_workspace_is_made_on_the_server_with_the_layout(
    server: LocalServer, engine: BaseEngine, ws: Workspace
) -> None:
    root = on_server(server, ws)
    for d in ("work", "work/inputs", "out", "runs", "skills", "src", "home", "tmp"):
        assert (root / d).is_dir(), d
    assert (root / "metadata.json").is_file() and oct(root.stat().st_mode & 0o777) == "0o700"
    kernels: RemoteKernelSessions = engine.kernels
    cell = await kernels.execute(ws, "import os\nprint(os.getcwd())\nprint(os.environ['OUTPUT_DIR'])")
    assert cell.text == f"{root / 'work'}\n{root / 'out'}\n"
    again = await engine.manager.get_workspace("far/session")
    assert again.path == ws.path
    with pytest.raises(WorkspaceNotFound):
        await engine.manager.get_workspace("never/made")
    with pytest.raises(UnsupportedBackend):
        await engine.manager.create_workspace("x", path=server.root_dir / "elsewhere")


async def test_put_read_collect_round_trip_with_binary_and_chunked_files(
    server: LocalServer, engine: BaseEngine, ws: Workspace
) -> None:
    binary = bytes(range(256)) * 3
    big = os.urandom(3 * CHUNK + 12345)  # several chunks each way
    await engine.fs.put_files(
        ws, [PutFile("work/a.txt", "héllo\n"), PutFile("out/b.bin", binary), PutFile("out/big.bin", big, 0o600)]
    )
    root = on_server(server, ws)
    assert (root / "out/big.bin").read_bytes() == big and oct((root / "out/big.bin").stat().st_mode & 0o777) == "0o600"
    assert (await engine.fs.read_file(ws, "work/a.txt")).content == "héllo\n".encode()
    read = await engine.fs.read_file(ws, "out/big.bin")
    assert read.content == big and read.size_bytes == len(big) and not read.truncated
    head = await engine.fs.read_file(ws, "out/big.bin", max_bytes=CHUNK + 7)
    assert head.content == big[: CHUNK + 7] and head.truncated
    files = {f.name: f for f in await engine.fs.collect(ws, ["out/**", "work/*.txt"])}
    assert sorted(files) == ["out/b.bin", "out/big.bin", "work/a.txt"]
    assert files["out/b.bin"].content == binary and files["out/big.bin"].content == big
    assert not list(root.rglob("*.tmp"))  # no temp file left behind by the chunked writes
    with pytest.raises(FileNotFoundError):
        await engine.fs.read_file(ws, "out/missing")


async def test_collect_caps_and_limit_exceeded(engine: BaseEngine, ws: Workspace) -> None:
    await engine.fs.put_files(ws, [PutFile(f"out/cap/{i}.txt", f"file {i} " * 10) for i in range(5)])
    two = await engine.fs.collect(ws, ["out/cap/*.txt"], max_files=2)
    assert [f.name for f in two] == ["out/cap/0.txt", "out/cap/1.txt"]
    capped = await engine.fs.collect(ws, ["out/cap/*.txt"], max_file_bytes=5, max_total_bytes=12)
    assert [(f.name, f.content, f.truncated) for f in capped] == [
        ("out/cap/0.txt", b"file ", True),
        ("out/cap/1.txt", b"file ", True),
        ("out/cap/2.txt", b"fi", True),
    ]
    manifest = await engine.fs.collect_outputs(ws, OutputSpec(globs=["out/cap/*.txt"], max_files=3))
    assert manifest.limits_hit and len(manifest.files) == 3
    with pytest.raises(LimitExceeded, match="cannot save truncated"):
        await engine.fs.collect_outputs(ws, OutputSpec(globs=["out/cap/*.txt"], max_file_bytes=4, save=True))


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "work/../../x", "out/../../../etc/passwd"])
async def test_traversal_is_refused(server: LocalServer, engine: BaseEngine, ws: Workspace, bad: str) -> None:
    with pytest.raises(PathDenied):
        await engine.fs.put_files(ws, [PutFile(bad, "pwned")])
    with pytest.raises(PathDenied):
        await engine.fs.read_file(ws, bad)
    with pytest.raises(PathDenied):
        await engine.fs.collect(ws, [bad])
    assert not (on_server(server, ws).parent / "x").exists()


async def test_the_agent_on_the_server_refuses_traversal_by_itself(engine: BaseEngine, ws: Workspace) -> None:
    files = engine.fs.files  # type: ignore[attr-defined]  # bypasses the client's own checks
    for bad in ("../metadata.json", "/etc/passwd", "out/../../x"):
        with pytest.raises(PathDenied):
            await files.call("read", {"ws": ws.path, "path": bad, "offset": 0, "n": 10})
        with pytest.raises(PathDenied):
            item = {"path": bad, "b64": "eA==", "mode": 0o644, "tmp": None, "final": True}
            await files.call("write", {"ws": ws.path, "items": [item]})
    item = {"path": "out/x", "b64": "eA==", "mode": 0o644, "tmp": "../../evil", "final": True}
    with pytest.raises(PathDenied, match="not one of our temp files"):
        await files.call("write", {"ws": ws.path, "items": [item]})


async def test_links_and_fifos_planted_by_kernel_code_are_not_followed(
    server: LocalServer, engine: BaseEngine, ws: Workspace
) -> None:
    secret = on_server(server, ws).parent / "secret.txt"  # outside the workspace, beside it on the server
    secret.write_text("TOP SECRET")
    kernels: RemoteKernelSessions = engine.kernels
    plant = (
        "import os\n"
        f"os.makedirs('../out/trap', exist_ok=True)\n"
        f"os.symlink({str(secret)!r}, '../out/trap/link.txt')\n"
        f"os.symlink({str(secret.parent)!r}, '../out/trap/dir')\n"
        f"os.link({str(secret)!r}, '../out/trap/hard.txt')\n"
        "os.mkfifo('../out/trap/fifo')\n"
        "open('../out/trap/ok.txt', 'w').write('fine')"
    )
    assert (await kernels.execute(ws, plant)).exit_code == 0
    files = await engine.fs.collect(ws, ["out/trap/**"])
    assert [(f.name, f.text) for f in files] == [("out/trap/ok.txt", "fine")]
    for path, why in [
        ("out/trap/link.txt", "symlink"),
        ("out/trap/dir/secret.txt", "symlink"),
        ("out/trap/hard.txt", "hard links"),
        ("out/trap/fifo", "not a regular file"),
    ]:
        with pytest.raises(PathDenied, match=why):
            await engine.fs.read_file(ws, path)
    with pytest.raises(PathDenied, match="symlink"):  # nor is anything written through the link
        await engine.fs.put_files(ws, [PutFile("out/trap/dir/secret.txt", "overwritten")])
    await engine.fs.put_files(ws, [PutFile("out/trap/link.txt", "replaced")])  # replaces the link itself
    assert secret.read_text() == "TOP SECRET"


async def test_stage_inputs_uploads_bytes_and_allowed_host_files(
    engine: BaseEngine, ws: Workspace, allowed: Path, tmp_path: Path
) -> None:
    (allowed / "data.csv").write_text("a,b\n1,2\n")
    (allowed / "tree").mkdir(exist_ok=True)
    (allowed / "tree" / "x.txt").write_text("in a tree")
    outside = tmp_path / "private.txt"
    outside.write_text("not yours")
    (allowed / "tree" / "leak.txt").unlink(missing_ok=True)
    (allowed / "tree" / "leak.txt").symlink_to(outside)  # a link out of the allowed tree is not followed
    dests = await engine.fs.stage_inputs(
        ws,
        [
            InputSpec(b"\x00\x01raw", dest="work/inputs/raw.bin"),
            InputSpec(f"host://{allowed / 'data.csv'}"),
            InputSpec(f"host://{allowed / 'tree'}"),
        ],
    )
    assert dests == ["work/inputs/raw.bin", "work/inputs/data.csv", "work/inputs/tree"]
    kernels: RemoteKernelSessions = engine.kernels
    cell = await kernels.execute(
        ws,
        "print(open('inputs/raw.bin','rb').read(), open('inputs/data.csv').read().split(), "
        "open('inputs/tree/x.txt').read())",
    )
    assert cell.text == "b'\\x00\\x01raw' ['a,b', '1,2'] in a tree\n"
    assert [f.name for f in await engine.fs.collect(ws, ["work/inputs/tree/**"])] == ["work/inputs/tree/x.txt"]
    for src in (f"host://{outside}", f"host://{allowed}/../{tmp_path.name}/private.txt"):
        with pytest.raises(PathDenied, match="outside the allowed host roots"):
            await engine.fs.stage_inputs(ws, [InputSpec(src)])


async def test_collect_outputs_saves_artifacts_and_cell_outputs_are_files_on_the_server(
    server: LocalServer, engine: BaseEngine, ws: Workspace
) -> None:
    kernels: RemoteKernelSessions = engine.kernels
    cell = await kernels.execute(
        ws,
        "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))\nopen('../out/r.txt','w').write('42')",
    )
    assert cell.exit_code == 0 and len(cell.files) == 1 and cell.files[0].endswith(".html"), cell.text
    assert (on_server(server, ws) / cell.files[0]).read_text() == "<b>hi</b>"
    manifest = await engine.fs.collect_outputs(ws, OutputSpec(globs=[cell.files[0], "out/r.txt"], save=True))
    assert sorted(r.name for r in manifest.files) == sorted([cell.files[0], "out/r.txt"])
    assert all(r.saved_as and r.host_path is None for r in manifest.files)
    art = await engine.fs.artifacts.load(ArtifactScope.from_workspace_id(ws.id), "out/r.txt")  # type: ignore[attr-defined]
    assert art.data == b"42"
    record = (await engine.fs.read_file(ws, "metadata.json")).text
    assert "out/r.txt" in record


async def test_cleanup_removes_the_workspace_and_its_kernel(server: LocalServer, engine: BaseEngine) -> None:
    ws = await engine.manager.create_workspace("far/gone")
    kernels: RemoteKernelSessions = engine.kernels
    pid = int((await kernels.execute(ws, "import os\nprint(os.getpid())")).text)
    root = on_server(server, ws)
    assert root.is_dir()
    await engine.manager.cleanup(ws)
    assert not root.exists() and await wait_dead(pid)
    forged = Workspace(id="x", path=str(server.root_dir), backend="jupyter")
    with pytest.raises(PathDenied):
        await engine.manager.cleanup(forged)
    assert server.root_dir.is_dir()


async def test_turn_workspaces_of_one_id_get_their_own_kernels(engine: BaseEngine) -> None:
    turn = WorkspacePolicy(persistence=Persistence.TURN)
    first = await engine.manager.create_workspace("far/turns", turn)
    second = await engine.manager.create_workspace("far/turns", turn)
    assert first.path != second.path
    kernels: RemoteKernelSessions = engine.kernels
    cwds = [(await kernels.execute(w, "import os\nprint(os.getcwd())")).text for w in (first, second)]
    assert cwds == [f"{first.path}/work\n", f"{second.path}/work\n"]
    for w in (first, second):
        await engine.manager.cleanup(w)


async def test_closing_the_engine_deletes_its_kernels_on_the_server(server: LocalServer) -> None:
    async with open_engine(
        "jupyter",
        mode=ServerKernels(url=server.url, token=server.token, shared_filesystem=False, remote_root="farclose"),
    ) as eng:
        ws = await eng.manager.create_workspace("closing")
        await eng.kernels.execute(ws, "1")
        api = ServerApi(server.url, server.token)
        assert len(await api.kernel_ids()) == 2  # the file kernel and the workspace's
    try:
        assert await api.kernel_ids() == []
    finally:
        api.close()
    assert Path(ws.path).is_dir()  # closing keeps workspaces (cleanup removes them)


async def test_programs_are_refused_and_capabilities_say_so(engine: BaseEngine, ws: Workspace) -> None:
    with pytest.raises(CapabilityError, match="shared_filesystem=False"):
        await engine.runner.run_program(ws, RunProgramSpec("touch", ["ran"]))
    with pytest.raises(CapabilityError):
        await engine.runner.start_program(ws, RunProgramSpec("true"))
    caps = engine.describe()
    # nothing runs on this host: programs are refused and the kernels are the server's
    assert not caps.host_paths and caps.languages == ("python",) and str(caps.isolation) == "remote"
    assert (
        caps.kernels is not None and str(caps.kernels.isolation) == "remote" and caps.kernels.languages == ("python",)
    )
    assert "no shared filesystem" in caps.details["mode"]
    assert any("file API trusts the server side" in line for line in caps.does_not_protect)


@pytest.mark.slow
async def test_kernel_gateway_without_shared_filesystem(tmp_path: Path) -> None:
    pytest.importorskip("kernel_gateway")
    async with (
        start_local_server(tmp_path, kind="gateway") as gw,
        open_engine(
            "jupyter", mode=ServerKernels(url=gw.url, token=gw.token, shared_filesystem=False, remote_root="gwroot")
        ) as eng,
    ):
        ws = await eng.manager.create_workspace("gw")
        assert Path(ws.path) == tmp_path.resolve() / "gwroot" / Path(ws.path).name
        await eng.fs.put_files(ws, [PutFile("work/in.txt", "from us")])
        cell = await eng.kernels.execute(ws, "print(open('in.txt').read())\n_ = open('../out/o','w').write('x')")
        assert cell.text == "from us\n"
        assert [(f.name, f.text) for f in await eng.fs.collect(ws, ["out/*"])] == [("out/o", "x")]
        pid = int((await eng.kernels.execute(ws, "import os\nprint(os.getpid())")).text)
        await eng.manager.cleanup(ws)
        assert not Path(ws.path).exists() and await wait_dead(pid)


async def test_list_stat_exists_and_links_on_the_server(server: LocalServer, engine: BaseEngine, ws: Workspace) -> None:
    root = on_server(server, ws)
    outside = root.parent / "outside-list"
    outside.mkdir(exist_ok=True)
    (outside / "keep.txt").write_text("keep")
    await engine.fs.put_files(ws, [PutFile("out/l/d/f.txt", "abc")])
    os.symlink(outside, root / "out/l/link")
    os.mkfifo(root / "out/l/fifo")
    kinds = {e.path: (e.kind, e.size) for e in await engine.fs.list(ws, ["out/l/**"])}
    assert kinds == {
        "out/l/d": (FileKind.DIR, 0),
        "out/l/d/f.txt": (FileKind.FILE, 3),
        "out/l/fifo": (FileKind.OTHER, 0),
        "out/l/link": (FileKind.SYMLINK, len(str(outside))),
    }
    assert (await engine.fs.stat(ws, "out/l/link")).kind is FileKind.SYMLINK
    assert await engine.fs.exists(ws, "out/l/d/f.txt") and not await engine.fs.exists(ws, "out/l/nope")
    with pytest.raises(FileNotFoundError):
        await engine.fs.stat(ws, "out/l/nope")
    for attempt in (
        engine.fs.stat(ws, "out/l/link/keep.txt"),
        engine.fs.remove(ws, "out/l/link/keep.txt"),
        engine.fs.make_dir(ws, "out/l/link/new"),
        engine.fs.rename(ws, "out/l/link/keep.txt", "out/stolen"),
    ):
        with pytest.raises(PathDenied, match="symlink"):
            await attempt
    await engine.fs.remove(ws, "out/l")  # the tree with the link in it: the link goes, its target stays
    assert not (root / "out/l").exists() and (outside / "keep.txt").read_text() == "keep"
    assert sorted(p.name for p in outside.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "work/../../x"])
async def test_tree_operations_refuse_traversal(
    server: LocalServer, engine: BaseEngine, ws: Workspace, bad: str
) -> None:
    await engine.fs.put_files(ws, [PutFile("work/t.txt", "t")])
    for attempt in (
        engine.fs.stat(ws, bad),
        engine.fs.exists(ws, bad),
        engine.fs.remove(ws, bad),
        engine.fs.make_dir(ws, bad),
        engine.fs.rename(ws, "work/t.txt", bad),
        engine.fs.rename(ws, bad, "work/t2.txt"),
        engine.fs.list(ws, [bad]),
    ):
        with pytest.raises(PathDenied):
            await attempt
    files = engine.fs.files  # type: ignore[attr-defined]  # the agent refuses by itself too
    for op, args in (("stat", {"path": bad}), ("remove_path", {"path": bad}), ("make_dir", {"path": bad})):
        with pytest.raises(PathDenied):
            await files.call(op, {"ws": ws.path, **args})
    with pytest.raises(PathDenied):
        await files.call("rename", {"ws": ws.path, "src": "work/t.txt", "dst": bad})
    assert (on_server(server, ws) / "work/t.txt").read_text() == "t"


async def test_make_dir_rename_and_remove_a_read_only_staged_tree(
    server: LocalServer, engine: BaseEngine, ws: Workspace, allowed: Path
) -> None:
    root = on_server(server, ws)
    await engine.fs.make_dir(ws, "work/m/n")
    await engine.fs.make_dir(ws, "work/m/n")
    assert (root / "work/m/n").is_dir()
    await engine.fs.put_files(ws, [PutFile("work/new.txt", "new"), PutFile("work/old.txt", "old")])
    await engine.fs.rename(ws, "work/new.txt", "work/old.txt")
    assert (root / "work/old.txt").read_text() == "new" and not (root / "work/new.txt").exists()
    await engine.fs.rename(ws, "work/m", "work/x/y/moved")
    assert (root / "work/x/y/moved/n").is_dir()
    with pytest.raises(FileNotFoundError):
        await engine.fs.rename(ws, "work/missing", "work/z")
    tree = allowed / "rotree"
    (tree / "sub").mkdir(parents=True, exist_ok=True)
    (tree / "sub" / "b.txt").write_text("b")
    await engine.fs.stage_directory(ws, tree, "work/ro", read_only=True)
    for p in (root / "work/ro/sub", root / "work/ro"):
        p.chmod(0o555)
    await engine.fs.remove(ws, "work/ro")
    assert not (root / "work/ro").exists() and (tree / "sub" / "b.txt").read_text() == "b"
    with pytest.raises(FileNotFoundError):
        await engine.fs.remove(ws, "work/ro")
