"""Round 2, host-side file work on trees a hostile program controls (issue 10: F1, F11, F12).

F1: cleanup while a program of the workspace still runs must neither chmod nor delete anything outside the
workspace (the program keeps a directory non-empty, renames it away and plants a symlink to a victim), and
no process of the workspace may survive it. F11: a 2,000-deep directory chain neither crashes the CLI nor
leaves the per-turn workspace behind. F12: the disk limit counts allocated blocks (fallocate KEEP_SIZE).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import resource
import secrets
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import execspace
from execspace import PathDenied, RunProgramSpec, WorkspacePolicy
from execspace.registry import probe_backend
from execspace.testing.processes import wait_no_process
from execspace.workspace.confine import MAX_WALK_DEPTH, ConfinedRoot
from execspace.workspace.hostmanager import HostWorkspaceManager
from tests.redteam.conftest import SANDBOX_MODES
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(180)

EXECSPACE = str(Path(sys.executable).with_name("execspace"))

# Keeps work/a/b non-empty and flips work/a between the real directory and a symlink to the victim, so that
# a removal re-resolving "work/a/..." by path lands in the victim. Runs until killed.
RACER = r"""
import os, sys
victim = sys.argv[1]
os.makedirs('a/b', exist_ok=True)
for i in range(20):
    open(f'a/b/f{i}', 'w').close()
open('ready', 'w').close()
i = 0
while True:
    i += 1
    try:
        open(f'a/b/g{i}', 'w').close()
        os.rename('a', 'x')
        os.symlink(victim, 'a')
        for j in range(5):  # the symlink stands a while; b stays non-empty
            open(f'x/b/h{i}-{j}', 'w').close()
        os.unlink('a')
        os.rename('x', 'a')
    except OSError:
        try:
            if os.path.islink('a'):  # never write through our own link: only the host may be fooled by it
                os.unlink('a')
            os.makedirs('a/b', exist_ok=True)
        except OSError:
            pass
"""


# -- helpers -----------------------------------------------------------------------------------


def make_victim(tmp_path: Path) -> Path:
    """A directory outside every workspace, shaped like what the racer aims at: ``b/`` and files."""
    victim = tmp_path / "victim"
    (victim / "b").mkdir(parents=True)
    (victim / "keep").write_text("keep")
    (victim / "b" / "precious").write_text("precious")
    victim.chmod(0o751)
    (victim / "b").chmod(0o751)
    return victim


def snapshot(victim: Path) -> dict[str, tuple[int, int, int, bytes]]:
    out = {}
    for p in (victim, *sorted(victim.rglob("*"))):
        st = p.lstat()
        out[str(p.relative_to(victim))] = (st.st_mode, st.st_uid, st.st_gid, p.read_bytes() if p.is_file() else b"")
    return out


async def wait_file(path: Path, deadline: float = 20.0) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        await asyncio.sleep(0.005)


@pytest.fixture(params=["local", "sandbox", "sandbox-session"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[execspace.BaseEngine]:
    name, _, mode = request.param.partition("-")
    options = SANDBOX_MODES["session" if mode else "per-run"]
    if name == "sandbox":
        probe = await probe_backend("sandbox", **options)
        if not probe.ok:
            pytest.skip(f"sandbox unavailable: {probe.reason}")
        make_traversable(tmp_path)
    else:
        options = {}
    async with execspace.open_engine(name, workspace_root=tmp_path / "ws", **options) as eng:
        yield eng


@pytest.fixture
async def sandbox(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[execspace.BaseEngine]:
    probe = await probe_backend("sandbox", **sandbox_mode)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", **sandbox_mode) as eng:
        yield eng


def turn() -> WorkspacePolicy:
    return WorkspacePolicy(persistence=execspace.Persistence.TURN)


# -- F1: cleanup with a live program ----------------------------------------------------------------


@pytest.mark.slow
async def test_cleanup_during_a_racing_program_leaves_the_victim_alone(
    engine: execspace.BaseEngine, tmp_path: Path
) -> None:
    victim = make_victim(tmp_path)
    before = snapshot(victim)
    rounds = 60 if engine.name == "sandbox" else 40
    for r in range(rounds):
        tag = f"racer-{secrets.token_hex(6)}"
        ws = await engine.manager.create_workspace(f"race/{r}", turn())
        assert ws.host_path is not None
        spec = RunProgramSpec("python3", ["-c", RACER, str(victim), tag], cwd="work", timeout=60)
        handle = await engine.runner.start_program(ws, spec)
        try:
            await wait_file(ws.host_path / "work" / "ready")
            await engine.manager.cleanup(ws)
            assert snapshot(victim) == before, f"round {r}: the victim outside the workspace changed"
            survivors = wait_no_process(tag)
            assert not survivors, f"round {r}: processes of the workspace outlived its cleanup: {survivors}"
            assert not ws.host_path.exists() and not ws.host_path.is_symlink(), f"round {r}: workspace left"
        finally:
            await handle.kill()
            wait_no_process(tag, 0)


async def test_cleanup_kills_a_started_program_and_a_concurrent_run(
    engine: execspace.BaseEngine, tmp_path: Path
) -> None:
    tag = f"sleeper-{secrets.token_hex(6)}"
    ws = await engine.manager.create_workspace("race/handle", turn())
    assert ws.host_path is not None
    # says it is up once running: a cleanup during the interpreter's start could make it fail on its own
    sleep = "import sys, time; open('up-' + sys.argv[1], 'w').close(); time.sleep(300)"
    handle = await engine.runner.start_program(ws, RunProgramSpec("python3", ["-c", sleep, "h", tag], timeout=120))
    run = engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", sleep, "r", tag], timeout=120))
    concurrent = asyncio.ensure_future(run)
    late: asyncio.Future[execspace.RunResult] | None = None
    try:
        await wait_file(ws.host_path / "work" / "up-h")
        await wait_file(ws.host_path / "work" / "up-r")
        # one more, still being started when the cleanup comes
        late = asyncio.ensure_future(engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", sleep, "l", tag])))
        await asyncio.sleep(0)
        t0 = time.monotonic()
        await engine.manager.cleanup(ws)
        assert time.monotonic() - t0 < 10
        for result in (
            await asyncio.wait_for(handle.wait(), 10),
            *await asyncio.wait_for(asyncio.gather(concurrent, late), 10),
        ):
            assert result.exit_code != 0
        assert not wait_no_process(tag), "a program of the cleaned-up workspace survived"
        assert not ws.host_path.exists()
    finally:
        await handle.kill()
        concurrent.cancel()
        if late is not None:
            late.cancel()
        wait_no_process(tag, 0)


RACE_HOST = r"""
import os, sys
victim = sys.argv[1]
for line in sys.stdin:
    os.chdir(line.strip())
    os.makedirs('a/b', exist_ok=True)
    for i in range(20):
        open(f'a/b/f{i}', 'w').close()
    print('ready', flush=True)
    i = 0
    while os.stat('.').st_nlink:  # until our directory is removed
        i += 1
        try:
            open(f'a/b/g{i}', 'w').close()
            os.rename('a', 'x')
            os.symlink(victim, 'a')
            for j in range(5):  # the symlink stands a while; b stays non-empty
                open(f'x/b/h{i}-{j}', 'w').close()
            os.unlink('a')
            os.rename('x', 'a')
        except OSError:
            try:
                if os.path.islink('a'):
                    os.unlink('a')
                os.makedirs('a/b', exist_ok=True)
            except OSError:
                pass
    os.chdir('/')
    print('done', flush=True)
"""


@pytest.fixture
def host_racer(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    victim = make_victim(tmp_path)
    argv = [sys.executable, "-c", RACE_HOST, str(victim)]
    with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as proc:
        yield proc
        proc.kill()


async def test_removal_by_fds_against_a_writer_nobody_can_stop(
    tmp_path: Path, host_racer: subprocess.Popen[str]
) -> None:
    """The removal itself, with the kill out of the picture: another process (not this engine's, so not
    stopped first) races it in the workspace. A pass may give up (PathDenied), never act outside."""
    victim = tmp_path / "victim"
    before = snapshot(victim)
    manager = HostWorkspaceManager("local", tmp_path / "ws")
    assert host_racer.stdin is not None and host_racer.stdout is not None
    gave_up = 0
    fds = len(os.listdir("/proc/self/fd"))
    for r in range(300):
        ws = await manager.create_workspace(f"host-race/{r}", turn())
        assert ws.host_path is not None
        host_racer.stdin.write(f"{ws.host_path / 'work'}\n")
        host_racer.stdin.flush()
        assert host_racer.stdout.readline().strip() == "ready"
        try:
            await manager.cleanup(ws)
        except PathDenied:
            gave_up += 1
        assert snapshot(victim) == before, f"round {r}: the victim outside the workspace changed"
        while ws.host_path.exists():  # the racer stops once its directory is gone
            with contextlib.suppress(PathDenied):
                await manager.cleanup(ws)
        assert host_racer.stdout.readline().strip() == "done"
        assert snapshot(victim) == before, f"round {r}: the victim outside the workspace changed"
    assert gave_up < 300
    assert len(os.listdir("/proc/self/fd")) <= fds + 2, "the removal leaks directory fds when it loses a race"


# -- F11: deep trees ---------------------------------------------------------------------------

CHAIN = "import os\nfor _ in range({n}):\n    os.mkdir('d')\n    os.chdir('d')\nopen('bottom', 'w').write('x' * 5000)\n"


@pytest.mark.slow
def test_cli_survives_a_2000_deep_chain_and_reports_the_run_beside_the_refused_collection(tmp_path: Path) -> None:
    """A 2,000-deep tree once cost the run its own result (exit 125, no output): now the run is reported as usual,
    the collection's refusal beside it, and the workspace holding what could not be collected is kept (and
    ``ws rm`` removes it, at any depth); collected elsewhere, the workspace goes as usual."""
    if not asyncio.run(probe_backend("sandbox")).ok:
        pytest.skip("sandbox unavailable")
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    make_traversable(tmpdir)
    env = {**os.environ, "TMPDIR": str(tmpdir), "EXECSPACE_DAEMON": "off"}
    program = ["--", "python3", "-c", CHAIN.format(n=2000) + "print('RAN-TO-END')"]
    for collect in ([], ["--collect", "work/**"]):
        proc = subprocess.run(
            [EXECSPACE, "run", "--backend", "sandbox", "--json", *collect, *program],
            capture_output=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        err = proc.stderr.decode(errors="replace")
        assert "Traceback" not in err and "RecursionError" not in err, err[-2000:]
        assert proc.returncode == 0, (proc.returncode, err[-2000:])  # the program's own status
        report = json.loads(proc.stdout)
        assert report["exit_code"] == 0 and report["stdout"] == "RAN-TO-END\n"
        roots = list(tmpdir.glob("execspace-*/sandbox"))
        if not collect:
            assert report["outputs_error"] is None and report["workspace"] is None
            assert roots and all(not any(r.iterdir()) for r in roots), [list(r.iterdir()) for r in roots]
            continue
        assert report["outputs_error"]["type"] == "PathDenied", report["outputs_error"]
        assert "directory levels" in report["outputs_error"]["message"]
        assert len(report["outputs_error"]["message"]) < 400  # the path is named by its ends, not 4,000 characters
        kept = Path(report["workspace"])
        assert (kept / "work" / "d").is_dir()
        rm = subprocess.run([EXECSPACE, "ws", "rm", str(kept)], capture_output=True, env=env, cwd=tmp_path, timeout=120)
        assert rm.returncode == 0, rm.stderr
        assert not kept.exists() and all(not any(r.iterdir()) for r in roots)


async def test_api_deep_chain_is_measured_refused_by_collect_and_removed(sandbox: execspace.BaseEngine) -> None:
    ws = await sandbox.manager.create_workspace("deep/api", WorkspacePolicy(max_disk_bytes=1 << 30))
    assert ws.host_path is not None
    r = await sandbox.runner.run_program(ws, RunProgramSpec("python3", ["-c", CHAIN.format(n=2000)], cwd="work"))
    assert r.exit_code == 0, r.stderr
    assert r.limit_hit is None
    with ConfinedRoot(str(ws.host_path)) as cr:
        assert cr.disk_usage() > 2000 * 512  # every level counted, the file at the bottom too
    with pytest.raises(PathDenied, match="directory levels"):
        await sandbox.fs.collect(ws, ["work/**"])
    listed = await sandbox.fs.collect(ws, ["out/**"])  # a walk elsewhere is not affected
    assert listed == []
    await sandbox.manager.cleanup(ws)
    assert not ws.host_path.exists()


def test_walks_hold_few_fds_whatever_the_depth(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):  # deeper than PATH_MAX allows by name
            os.mkdir("d", dir_fd=fd)
            nfd = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
        with open(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "wb") as f:
            f.write(b"x" * 10000)
        os.chmod(fd, 0o500)  # a read-only staged level deep down
    finally:
        os.close(fd)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # far fewer fds than levels: a walk holding one per level fails with EMFILE
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 64, hard))
    try:
        with ConfinedRoot(str(root)) as cr:
            assert cr.disk_usage() >= 3000 * 512 + 10000
            assert [e.relpath.rsplit("/", 1)[-1] for e in cr.walk(["d"] * (3000 - MAX_WALK_DEPTH + 1))] == ["f"]
            with pytest.raises(PathDenied, match="directory levels"):
                list(cr.walk([]))
            cr.remove("d")
            assert not cr.exists("d")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# -- F12: disk usage is allocated blocks ---------------------------------------------------------

FALLOCATE = (
    "import ctypes, os\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]\n"
    "fd = os.open('reserved', os.O_WRONLY | os.O_CREAT, 0o644)\n"
    "rc = libc.fallocate(fd, 1, 0, 200 << 20)  # FALLOC_FL_KEEP_SIZE: the size stays 0\n"
    "print('reserved' if rc == 0 else os.strerror(ctypes.get_errno()))\n"
    "assert os.fstat(fd).st_size == 0\n"
)


async def test_fallocate_keep_size_counts_against_the_disk_limit(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("disk/falloc", WorkspacePolicy(max_disk_bytes=20 << 20))
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", FALLOCATE], cwd="work"))
    assert r.exit_code == 0, r.stderr
    if engine.name == "sandbox":  # its seccomp filter refuses the reservation itself (file_size_bytes' bypass)
        assert (r.stdout, r.limit_hit) == (os.strerror(errno.EOPNOTSUPP) + "\n", None)
        return
    assert r.stdout == "reserved\n"
    assert r.limit_hit == "disk_bytes"


async def test_sparse_files_and_hard_links_are_not_overcounted(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("disk/sparse", WorkspacePolicy(max_disk_bytes=20 << 20))
    script = (
        "import os\n"
        "with open('sparse', 'wb') as f:\n"
        "    f.truncate(4 << 30)\n"  # 4 GiB of size, no block on disk
        "with open('data', 'wb') as f:\n"
        "    f.write(os.urandom(8 << 20))\n"
        "os.link('data', 'data2'); os.link('data', 'data3')\n"  # 8 MiB on disk, not 24
    )
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", script], cwd="work"))
    assert r.exit_code == 0, r.stderr
    assert r.limit_hit is None


async def test_data_in_an_unreadable_directory_still_counts(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("disk/hidden", WorkspacePolicy(max_disk_bytes=20 << 20))
    script = (
        "import os\n"
        "os.mkdir('hide')\n"
        "with open('hide/blob', 'wb') as f:\n"
        "    f.write(os.urandom(30 << 20))\n"
        "os.chmod('hide', 0)\n"
    )
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", script], cwd="work"))
    assert r.exit_code == 0, r.stderr
    assert r.limit_hit == "disk_bytes"
    assert ws.host_path is not None
    await engine.manager.cleanup(ws)
    assert not ws.host_path.exists()


def test_disk_usage_counts_directories_once_each(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    for i in range(200):
        (root / f"d{i}").mkdir()
    with ConfinedRoot(str(root)) as cr:
        used = cr.disk_usage()
    assert used >= sum(p.lstat().st_blocks * 512 for p in root.iterdir())
    assert stat.S_ISDIR(root.lstat().st_mode)
