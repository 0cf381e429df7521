"""The warm pool of sandboxed kernels: real ipykernel kernels in real bubblewrap, started in workspace slots
that become new workspaces, checked from the host. Run as root (per-workspace uid) and as an unprivileged
user (the sandbox runs as that user)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

import execspace
from execspace import BaseEngine, Persistence, RunProgramSpec, WorkspacePolicy
from execspace.backends.jupyter import (
    KernelSessions,
    SandboxedKernels,
)
from execspace.backends.sandbox import SandboxPolicy
from execspace.backends.sandbox.bwrap import sandbox_uid
from tests.backends.jupyter_support import alive, kernels_of, require_sandboxed_kernels
from tests.support import make_traversable


@pytest.fixture(autouse=True)
async def _sandbox_works() -> None:
    await require_sandboxed_kernels()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", mode=SandboxedKernels(pool_size=2)
    ) as eng:
        yield eng


def pool_of(engine: BaseEngine) -> KernelSessions:
    return kernels_of(engine)


def pooled_pids(ks: KernelSessions) -> set[int]:
    """Host pids of the idle kernels' sandboxes (bwrap: its death takes the kernel along)."""
    assert ks.pool is not None
    return {k.proc.pid for k in ks.pool.idle_kernels()}


def slots(root: Path) -> list[Path]:
    return sorted(root.glob(".pool-*"))


async def test_pooled_kernel_serves_the_first_cell_of_a_new_workspace(engine: BaseEngine, tmp_path: Path) -> None:
    ks = pool_of(engine)
    root = tmp_path / "ws"
    assert ks.pool is not None and await ks.pool.wait_ready(60)
    assert "workspace slot" in engine.describe().details["pool"]
    pids, before = pooled_pids(ks), {p.name: [r.name for r in (p / "runs").iterdir()] for p in slots(root)}
    assert len(pids) == 2 and len(before) == 2 and all(len(runs) == 1 for runs in before.values())
    ws = await engine.manager.create_workspace("nb/pooled")
    assert ws.host_path is not None and ws.host_path.parent == root
    taken = [name for name in before if not (root / name).exists()]
    assert len(taken) == 1  # the slot became the workspace: renamed, not copied
    cell = "import os\nopen('made.txt', 'w').write('from the kernel')\nprint(os.getcwd(), os.environ['RUN_DIR'])"
    first = await ks.execute(ws, cell)
    assert first.exit_code == 0, first.text
    cwd, run_dir = first.text.split()
    # the run directory the pooled kernel started with: no cold start happened
    assert cwd == "/workspace/work" and run_dir == f"/workspace/runs/{before[taken[0]][0]}"
    (pid,) = pids - pooled_pids(ks)
    session = ks._sessions[str(ws.host_path)].kernel
    assert session is not None and session.proc.pid == pid and alive(pid)  # the pooled sandbox serves the session
    made = ws.host_path / "work" / "made.txt"
    assert made.read_text() == "from the kernel"
    assert '"id": "nb/pooled"' in (ws.host_path / "metadata.json").read_text()
    if os.geteuid() == 0:
        uid = sandbox_uid(ws.host_path)
        assert made.stat().st_uid == uid and ws.host_path.stat().st_uid == uid and uid != 0
    program = await engine.runner.run_program(
        ws, RunProgramSpec("sh", ["-c", "cat made.txt; echo ' +prog' >> made.txt"])
    )
    assert program.exit_code == 0 and program.stdout == "from the kernel", program.stderr
    assert (await ks.execute(ws, "print(open('made.txt').read())")).text == "from the kernel +prog\n\n"


async def test_pooled_kernel_cannot_write_outside_or_reach_the_network(engine: BaseEngine, tmp_path: Path) -> None:
    ks = pool_of(engine)
    assert ks.pool is not None and await ks.pool.wait_ready(60)
    ws = await engine.manager.create_workspace("nb/attacker")
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    targets = [tmp_path / "canary.txt", tmp_path / "ws" / "canary.txt", Path("/etc/execspace-canary")]
    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cell = (
        "import socket\n"
        f"for p in {[str(t) for t in targets]!r} + ['/workspace/metadata.json']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); print('wrote', p)\n"
        "    except OSError as exc:\n"
        "        print('denied', type(exc).__name__)\n"
        "for family, address in ((socket.AF_INET, ('127.0.0.1', %d)), (socket.AF_UNIX, '/workspace/work/s')):\n"
        "    try:\n"
        "        socket.socket(family).connect(address); print('connected')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)\n"
    ) % port
    async with server:
        result = await ks.execute(ws, cell, timeout=20)
    assert "wrote" not in result.text and "connected" not in result.text, result.text
    assert result.text.count("denied") == 4 and result.text.count("refused") == 2, result.text
    assert accepted == [] and not any(t.exists() for t in targets)
    assert ws.host_path is not None and '"id": "nb/attacker"' in (ws.host_path / "metadata.json").read_text()


@pytest.mark.slow
async def test_two_new_workspaces_never_share_a_pooled_kernel(engine: BaseEngine, tmp_path: Path) -> None:
    ks = pool_of(engine)
    assert ks.pool is not None and await ks.pool.wait_ready(60)
    pids = pooled_pids(ks)
    explicit = await engine.manager.create_workspace("nb/explicit", path=tmp_path / "explicit")
    assert pooled_pids(ks) == pids and len(slots(tmp_path / "ws")) == 2  # path= workspaces start cold
    a, b = [await engine.manager.create_workspace(name) for name in ("nb/a", "nb/b")]
    assert pids.isdisjoint(pooled_pids(ks))  # both taken, refills are new kernels
    cell = "import os\nsecret = os.environ['RUN_DIR']\nopen('mine.txt', 'w').write(secret)\nprint(secret)"
    run_a, run_b = [r.text for r in await asyncio.gather(ks.execute(a, cell), ks.execute(b, cell))]
    assert run_a != run_b
    assert a.host_path is not None and b.host_path is not None and explicit.host_path is not None
    assert (a.host_path / "work" / "mine.txt").read_text() + "\n" == run_a
    assert (b.host_path / "work" / "mine.txt").read_text() + "\n" == run_b
    assert (await ks.execute(b, "print(secret)")).text == run_b
    if os.geteuid() == 0:
        owners = {(w.host_path / "work" / "mine.txt").stat().st_uid for w in (a, b)}
        assert owners == {sandbox_uid(a.host_path), sandbox_uid(b.host_path)} and len(owners) == 2
    # a reopened session (its workspace exists) starts cold: the pool keeps its kernels
    await ks.shutdown(a)
    assert await ks.pool.wait_ready(60)
    idle = pooled_pids(ks)
    again = await engine.manager.create_workspace("nb/a")
    assert (await ks.execute(again, "print(1)")).text == "1\n" and pooled_pids(ks) == idle


async def test_idle_pooled_kernels_are_stopped_and_slots_removed(tmp_path: Path) -> None:
    make_traversable(tmp_path)
    root = tmp_path / "ws"
    async with execspace.open_engine(
        "jupyter", workspace_root=root, mode=SandboxedKernels(pool_size=1, pool_idle_timeout=0.5)
    ) as eng:
        ks = pool_of(eng)
        assert ks.pool is not None and await ks.pool.wait_ready(60)
        (pid,) = pooled_pids(ks)
        for _ in range(100):
            if not alive(pid) and not slots(root):
                break
            await asyncio.sleep(0.1)
        assert not alive(pid) and ks.pool.idle_kernels() == [] and slots(root) == []
        await eng.manager.create_workspace("late")  # the pool was empty: it refills now
        assert await ks.pool.wait_ready(60)
        (refilled,) = pooled_pids(ks)
        # a one-call workspace takes the refilled kernel and is removed before it runs a cell
        gone = await eng.manager.create_workspace("gone", WorkspacePolicy(persistence=Persistence.TURN))
        assert gone.host_path is not None and gone.host_path.name.startswith("gone-") and alive(refilled)
        assert refilled not in pooled_pids(ks) and '"id": "gone"' in (gone.host_path / "metadata.json").read_text()
        await eng.manager.cleanup(gone)
        assert not alive(refilled) and not gone.host_path.exists()
        assert await ks.pool.wait_ready(60)
        (last,) = pooled_pids(ks)
    assert not alive(last) and slots(root) == []


async def test_no_pool_when_the_policy_has_no_access_globs(tmp_path: Path) -> None:
    # globs mask a workspace's matching files when its sandbox starts; a slot's kernel started before they existed
    make_traversable(tmp_path)
    policy = SandboxPolicy(no_access_globs=("**/*.key",))
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", mode=SandboxedKernels(policy=policy, pool_size=1)
    ) as eng:
        assert pool_of(eng).pool is None and "no-access globs" in eng.describe().details["pool"]
        ws = await eng.manager.create_workspace("nb/globs")
        assert ws.host_path is not None
        (ws.host_path / "work" / "secret.key").write_text("k")  # the file API refuses it; the host put it there
        cell = "try:\n    print(open('secret.key').read())\nexcept OSError as exc:\n    print('denied', exc.errno)"
        assert (await pool_of(eng).execute(ws, cell)).text.startswith("denied"), "the cold kernel masks the glob"


_CRASHING_OWNER = """
import asyncio, os, signal, sys
import execspace
from execspace.backends.jupyter import SandboxedKernels

async def main():
    async with execspace.open_engine("jupyter", workspace_root=sys.argv[1], mode=SandboxedKernels(pool_size=1)) as eng:
        assert await eng.kernels.pool.wait_ready(60)
        print("ready", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # a crash: no close, no atexit

asyncio.run(main())
"""


async def test_a_crashed_engines_slots_are_swept_by_the_next_open(engine: BaseEngine, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    ks = pool_of(engine)
    assert ks.pool is not None and await ks.pool.wait_ready(60)
    live = set(slots(root))  # this process's engine: alive, so never swept
    crashed = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _CRASHING_OWNER, str(root), stdout=asyncio.subprocess.PIPE
    )
    out, _ = await asyncio.wait_for(crashed.communicate(), 90)
    assert out == b"ready\n" and crashed.returncode == -9
    left = set(slots(root)) - live
    assert len(left) == 1  # what the crash left behind
    unjudged = root / ".pool-no-owner-record"
    unjudged.mkdir()
    async with execspace.open_engine("jupyter", workspace_root=root, mode=SandboxedKernels(pool_size=0)):
        pass
    remaining = set(slots(root))
    assert not (left & remaining), "the dead owner's slot was not swept"
    assert live <= remaining and unjudged in remaining  # a live owner's slots, and one we cannot judge, stay
