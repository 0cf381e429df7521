"""Round 2 attacks on host-side ownership and host-source staging, judged by what the host observes.

- F2: while the host re-opens a workspace (layout + chown to the sandbox uid), a program flips a layout
  directory between a directory and a symlink to a root-only host file or directory; the victim's owner and
  mode must never change.
- F5: while the host stages ``host://`` inputs, a program with a write grant on the host root swaps a
  directory there for a symlink to a 0700 secret outside ``host_roots``; the secret must never be copied.
- A new workspace whose directory reuses a deleted workspace's inode must get a new sandbox uid, so a
  process left over from the deleted one cannot write into it.

The races are bounded (a few hundred host rounds, the program stops on a stop file or after a minute) and
synchronised by polling a ready file the program writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import execspace
from execspace import InputError, InputSpec, PathDenied, PutFile, RunProgramSpec, RunResult
from execspace.backends.sandbox import SandboxPolicy
from execspace.registry import probe_backend
from tests.support import make_traversable

pytestmark = pytest.mark.timeout(180)

ROUNDS = 300
ROOT_ONLY = pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="only root chowns workspaces to a per-workspace sandbox uid (a normal user's sandbox runs as itself)",
)

#: Run in the sandbox: in directory argv[1], swap entry argv[2] for a symlink to each later argument in
#: turn and back, as fast as it can, until the host writes the stop file (or a minute passes).
FLIPPER = r"""
import os, sys, time
here, name, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
os.chdir(here)
stop = os.environ["STOP_FILE"]
for i, t in enumerate(targets):
    os.symlink(t, f".{name}.lnk{i}")
with open(os.environ["READY_FILE"], "w"):
    pass
end, i = time.monotonic() + 60, 0
while time.monotonic() < end and not os.path.exists(stop):
    link = f".{name}.lnk{i % len(targets)}"
    i += 1
    try:
        os.rename(name, f".{name}.real")
        os.rename(link, name)  # the symlink is in place ...
        os.rename(name, link)
        os.rename(f".{name}.real", name)  # ... and the directory is back
    except OSError:
        pass
"""


async def _sandbox_probe() -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")


def _victims(tmp_path: Path) -> dict[Path, tuple[int, int, int]]:
    """A root-only (caller-only) file and directory outside every workspace, with their owner and mode."""
    secret_file = tmp_path / "victim-file"
    secret_file.write_text("root-only")
    secret_file.chmod(0o600)
    secret_dir = tmp_path / "victim-dir"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "inputs").mkdir(mode=0o700)  # what a swapped `work` would expose as work/inputs
    victims = [secret_file, secret_dir, secret_dir / "inputs"]
    return {p: _identity(p) for p in victims}


def _identity(p: Path) -> tuple[int, int, int]:
    st = p.lstat()
    return st.st_uid, st.st_gid, st.st_mode


@contextlib.asynccontextmanager
async def _flipping(
    start: Callable[[RunProgramSpec], Awaitable[RunResult]],
    ws_dir: Path,
    sandbox_ws: str,
    here: str,
    name: str,
    targets: list[str],
) -> AsyncIterator[None]:
    """Run FLIPPER in the workspace (its files under ``ws_dir/out``) while the body runs; stop it after."""
    ready, stop = ws_dir / "out" / ".flipper-ready", ws_dir / "out" / ".flipper-stop"
    env = {"READY_FILE": f"{sandbox_ws}/out/{ready.name}", "STOP_FILE": f"{sandbox_ws}/out/{stop.name}"}
    spec = RunProgramSpec("python3", ["-c", FLIPPER, here, name, *targets], env=env, timeout=120)
    task = asyncio.ensure_future(start(spec))
    try:
        deadline = time.monotonic() + 30
        while not ready.exists():
            if task.done():
                result = task.result()
                pytest.fail(f"the flipper did not start: {result.stderr}")
            assert time.monotonic() < deadline, "the flipper never became ready"
            await asyncio.sleep(0.02)
        yield
    finally:
        stop.touch()
        result = await task
    assert result.exit_code == 0, result.stderr


# -- F2: re-opening a workspace never chowns through a swapped layout directory ------------------------------


@ROOT_ONLY
async def test_reopening_a_workspace_never_chowns_through_a_flipped_layout_dir(tmp_path: Path) -> None:
    await _sandbox_probe()
    make_traversable(tmp_path)
    victims = _victims(tmp_path)
    ws_dir = tmp_path / "project"
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        ws = await engine.manager.create_workspace("chown/race", path=ws_dir)

        async def run(spec: RunProgramSpec) -> RunResult:
            return await engine.runner.run_program(ws, spec)

        targets = [str(tmp_path / "victim-file"), str(tmp_path / "victim-dir" / "inputs")]
        async with _flipping(run, ws_dir, ws.path, f"{ws.path}/work", "inputs", targets):
            for _ in range(ROUNDS):
                # refused when the swap is seen (or a directory is missing mid-swap): nothing may change then
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    await engine.manager.create_workspace("chown/race", path=ws_dir)
                assert {p: _identity(p) for p in victims} == victims
    assert {p: _identity(p) for p in victims} == victims


@ROOT_ONLY
async def test_container_reopen_never_chowns_through_a_flipped_work_dir(
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """On 240d4f8 the container mounted the whole workspace writable: the program flipped ``work`` itself, an
    intermediate component of every ``work/...`` layout path (``lchown`` follows it). Now the workspace root is
    read-only to it (F10), so ``work`` cannot be flipped at all; what it can still flip, ``work/inputs``, is
    flipped while the host re-opens the workspace."""
    from tests.backends.container_support import container_engine

    daemon, image = request.getfixturevalue("docker_daemon"), request.getfixturevalue("test_image")
    make_traversable(tmp_path)
    victims = _victims(tmp_path)
    ws_dir = tmp_path / "project"
    async with container_engine(daemon, image, tmp_path / "ws", pool_size=0) as engine:
        ws = await engine.manager.create_workspace("chown/container", path=ws_dir)

        async def run(spec: RunProgramSpec) -> RunResult:
            return await engine.runner.run_program(ws, spec)

        swap = (
            "import os\nos.chdir(os.environ['WORKSPACE_DIR'])\ntry:\n    os.rename('work', '.w')\nexcept OSError as e:"
        )
        swap += "\n    print(e.errno)\nelse:\n    print('moved')"
        moved = await run(RunProgramSpec("python3", ["-c", swap]))
        assert moved.stdout.strip() in {str(errno.EROFS), str(errno.EBUSY)}, moved.stdout + moved.stderr
        assert (ws_dir / "work").is_dir() and not (ws_dir / "work").is_symlink()
        targets = [str(tmp_path / "victim-file"), str(tmp_path / "victim-dir")]
        async with _flipping(run, ws_dir, ws.path, f"{ws.path}/work", "inputs", targets):
            for _ in range(ROUNDS):
                with contextlib.suppress(PathDenied, FileNotFoundError):
                    await engine.manager.create_workspace("chown/container", path=ws_dir)
                assert {p: _identity(p) for p in victims} == victims
    assert {p: _identity(p) for p in victims} == victims


# -- F5: host:// staging never copies from outside host_roots ------------------------------------------------

SECRET = b"SECRET-outside-host-roots-7f3a"


async def test_host_staging_never_copies_a_secret_swapped_in_by_a_program(tmp_path: Path) -> None:
    await _sandbox_probe()
    make_traversable(tmp_path)
    allowed = tmp_path / "allowed"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "sub" / "f").write_text("public")
    for d in (allowed, allowed / "sub"):
        d.chmod(0o777)  # the program's write grant must work for a sandbox uid too
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o700)
    (secret / "f").write_bytes(SECRET)
    (secret / "f").chmod(0o600)
    policy = SandboxPolicy().with_write_paths(allowed)
    opts = {"workspace_root": tmp_path / "ws", "policy": policy, "host_roots": [allowed]}
    async with execspace.open_engine("sandbox", **opts) as engine:
        attacker = await engine.manager.create_workspace("stage/attacker")
        victim = await engine.manager.create_workspace("stage/victim")
        assert attacker.host_path is not None and victim.host_path is not None

        async def run(spec: RunProgramSpec) -> RunResult:
            return await engine.runner.run_program(attacker, spec)

        inputs = [
            InputSpec(f"host://{allowed}/sub/f", dest="work/got-file"),  # an intermediate component swapped
            InputSpec(f"host://{allowed}/sub", dest="work/got-dir"),  # the staged directory itself swapped
        ]
        async with _flipping(run, attacker.host_path, attacker.path, str(allowed), "sub", [str(secret)]):
            for _ in range(ROUNDS):
                for spec in inputs:
                    # refused mid-swap: nothing may have been copied then
                    with contextlib.suppress(PathDenied, InputError, OSError):
                        await engine.fs.stage_inputs(victim, [spec])
                assert not _holds(victim.host_path / "work", SECRET)
        # once nobody swaps it, the public file stages
        await engine.fs.stage_inputs(victim, inputs)
        assert (victim.host_path / "work/got-file").read_text() == "public"
        assert (victim.host_path / "work/got-dir/f").read_text() == "public"


async def test_a_symlink_inside_host_roots_is_followed_only_within_them(tmp_path: Path) -> None:
    """A link the user put in a host root is resolved from the allowed root, never the kernel's way."""
    allowed = tmp_path / "allowed"
    (allowed / "v2").mkdir(parents=True)
    (allowed / "v2" / "f").write_text("v2")
    (allowed / "latest").symlink_to("v2")  # a deliberate link, staying inside the root
    (tmp_path / "secret").mkdir(mode=0o700)
    (tmp_path / "secret" / "f").write_bytes(SECRET)
    (allowed / "escape").symlink_to(tmp_path / "secret")
    async with execspace.open_engine("local", workspace_root=tmp_path / "ws", host_roots=[allowed]) as engine:
        ws = await engine.manager.create_workspace("stage/links")
        assert ws.host_path is not None
        await engine.fs.stage_inputs(ws, [InputSpec(f"host://{allowed}/latest/f", dest="work/a")])
        await engine.fs.stage_inputs(ws, [InputSpec(f"host://{allowed}/latest", dest="work/b")])
        assert (ws.host_path / "work/a").read_text() == "v2"
        assert (ws.host_path / "work/b/f").read_text() == "v2"
        for src in (f"{allowed}/escape/f", f"{allowed}/escape"):
            with pytest.raises(PathDenied, match="outside the allowed host roots"):
                await engine.fs.stage_inputs(ws, [InputSpec(f"host://{src}", dest="work/c")])
            with pytest.raises(PathDenied, match="outside the allowed host roots"):
                await engine.fs.stage_directory(ws, Path(src), "work/d")
        assert not _holds(ws.host_path, SECRET)


def _holds(top: Path, needle: bytes) -> bool:
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            with contextlib.suppress(OSError):
                if needle in Path(dirpath, name).read_bytes():
                    return True
    return False


# -- a reused inode is a new workspace: a new sandbox uid ------------------------------------------------------


@pytest.mark.skipif(
    sys.platform != "linux" or os.geteuid() != 0,
    reason="per-workspace sandbox uids exist only as root (a normal user's sandbox runs as itself)",
)
async def test_a_new_workspace_on_a_reused_inode_is_out_of_reach_of_the_old_ones_processes(tmp_path: Path) -> None:
    await _sandbox_probe()
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws") as engine:
        for attempt in range(5):  # another process on this filesystem may take the freed inode first: again
            found = await _workspace_on_a_reused_inode(engine, tmp_path / f"try{attempt}")
            if found is not None:
                break
        else:
            pytest.skip("the filesystem never handed a deleted workspace's inode to a new directory")
        assert found is not None
        old_uid, candidate = found
        new = await engine.manager.create_workspace("reuse/new", path=candidate)
        assert new.host_path is not None
        await engine.fs.put_files(new, [PutFile("work/own.txt", b"the new workspace's")])
        new_uid = int((await engine.runner.run_program(new, RunProgramSpec("id", ["-u"]))).stdout)
        # a process the old workspace left behind runs as its uid: it must not reach the new workspace
        leftover = subprocess.run(
            ["/bin/sh", "-c", f"echo planted > {new.host_path}/work/planted; cat {new.host_path}/work/own.txt"],
            user=old_uid,
            group=old_uid,
            extra_groups=[],
            capture_output=True,
            check=False,
        )
    assert new_uid != old_uid
    assert not (new.host_path / "work/planted").exists()
    assert b"the new workspace's" not in leftover.stdout


async def _workspace_on_a_reused_inode(engine: execspace.BaseEngine, top: Path) -> tuple[int, Path] | None:
    """Run a workspace under ``top``, remove it, and make a directory on its inode: its uid and that directory."""
    top.mkdir()
    old = await engine.manager.create_workspace("reuse/old", path=top / "old")
    old_uid = int((await engine.runner.run_program(old, RunProgramSpec("id", ["-u"]))).stdout)
    inode = (top / "old").stat().st_ino
    await engine.manager.cleanup(old)
    # the filesystem hands out the lowest free inode, and frees this one only when the last sandbox's mount
    # namespace is gone (a little later)
    candidate = top / "new"
    for _ in range(200):
        candidate.mkdir(mode=0o700)
        if candidate.stat().st_ino == inode:
            return old_uid, candidate
        candidate.rmdir()
        await asyncio.sleep(0.01)
    return None
