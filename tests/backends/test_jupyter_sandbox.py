"""Kernels inside the OS sandbox: real ipykernel kernels in real bubblewrap, attacked from inside, checked from
the host. Run as root (per-workspace uid, cgroups) and as an unprivileged user (rlimits; see ``./run``)."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

pytest.importorskip("jupyter_client", reason="needs the jupyter extra (pip install 'execspace[jupyter]')")

import execspace
from execspace import BaseEngine, ResourceLimits, RunProgramSpec, Workspace
from execspace.backends.jupyter import (
    AutoKernels,
    HostKernels,
    KernelSessions,
    SandboxedKernels,
)
from execspace.capabilities import Isolation
from execspace.errors import EnvironmentNotFound, InvalidSpec, SetupFailed
from execspace.testing.processes import new_tag, pids_with
from execspace.workspace.hostmanager import HostWorkspaceManager
from tests.backends.jupyter_support import kernels_of, require_sandboxed_kernels
from tests.support import held_still, make_traversable, snapshot_files

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
async def _sandbox_works() -> None:
    await require_sandboxed_kernels()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[BaseEngine]:
    make_traversable(tmp_path)
    # no warm pool here (its tests are in test_jupyter_sandbox_pool.py): pooled starts would compete for CPU
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "ws", interrupt_grace=1.0, mode=SandboxedKernels(pool_size=0)
    ) as eng:
        yield eng


@pytest.fixture
def kernels(engine: BaseEngine) -> KernelSessions:
    return kernels_of(engine)


@pytest.fixture
async def ws(engine: BaseEngine) -> Workspace:
    return await engine.manager.create_workspace("nb/sandboxed")


async def test_capabilities_say_the_kernel_is_sandboxed(engine: BaseEngine) -> None:
    caps = engine.describe()
    assert str(caps.isolation) == "process" and caps.persistent_state and caps.network_control
    assert not caps.network_default
    assert caps.details["kernel_isolation"] == "sandbox" and caps.kernels is not None
    assert caps.kernels.isolation is Isolation.PROCESS and caps.kernels.kernel_limits == {"memory_bytes", "pids"}
    assert "memory_bytes=" in caps.details["kernel_limits"]
    assert any("warm pool" in d for d in caps.does_not_protect) and caps.details["pool"] == "off (pool_size=0)"


async def test_state_persists_and_a_plot_comes_back_as_png(kernels: KernelSessions, ws: Workspace) -> None:
    first = await kernels.execute(ws, "import os\ntotal = 40\nprint(os.getcwd())")
    assert first.exit_code == 0 and first.text == "/workspace/work\n"
    assert (await kernels.execute(ws, "total + 2")).text == "42\n"
    plot = await kernels.execute(ws, "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    pngs = [f for f in plot.files if f.endswith(".png")]
    assert plot.exit_code == 0 and len(pngs) == 1
    assert ws.host_path is not None and (ws.host_path / pngs[0]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_kernel_cannot_reach_a_host_tcp_listener(kernels: KernelSessions, ws: Workspace) -> None:
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        cell = (
            "import socket\n"
            "try:\n"
            f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\n"
            "except OSError as exc:\n"
            "    print('refused', type(exc).__name__)\n"
        )
        result = await kernels.execute(ws, cell, timeout=20)
    assert result.text.startswith("refused"), result.text
    assert accepted == []


async def test_kernel_cannot_open_unix_sockets(kernels: KernelSessions, ws: Workspace) -> None:
    assert ws.host_path is not None
    # a host daemon's socket where the kernel can see it (its own workspace), and an abstract one
    path = ws.host_path / "work" / "daemon.sock"
    abstract = f"\0execspace-test-{secrets.token_hex(4)}"
    listeners = []
    for address in (str(path), abstract):
        s = socket.socket(socket.AF_UNIX)
        s.bind(address)
        s.listen()
        s.setblocking(False)
        listeners.append(s)
    os.chmod(path, 0o777)
    try:
        cell = (
            "import socket\n"
            f"for address in ('/workspace/work/daemon.sock', {abstract!r}):\n"
            "    try:\n"
            "        socket.socket(socket.AF_UNIX).connect(address)\n"
            "        print('connected')\n"
            "    except OSError as exc:\n"
            "        print('errno', exc.errno)\n"
            "a, b = socket.socketpair()\n"
            "a.send(b'pair ok'); print(b.recv(10).decode())\n"
        )
        result = await kernels.execute(ws, cell, timeout=20)
        assert result.text.splitlines() == ["errno 1", "errno 1", "pair ok"], result.text  # EPERM from seccomp
        for s in listeners:
            with pytest.raises(BlockingIOError):
                s.accept()
    finally:
        for s in listeners:
            s.close()


async def test_kernel_cannot_write_outside_its_workspace(
    kernels: KernelSessions, ws: Workspace, tmp_path: Path
) -> None:
    targets = [tmp_path / "canary.txt", Path("/etc/execspace-canary"), Path(__file__).with_name("canary.txt")]
    cell = (
        "ok = []\n"
        f"for p in {[str(t) for t in targets]!r} + ['/workspace/work/inside.txt']:\n"
        "    try:\n"
        "        open(p, 'w').write('x'); ok.append(p)\n"
        "    except OSError:\n"
        "        pass\n"
        "print(ok)\n"
    )
    result = await kernels.execute(ws, cell)
    assert result.text == "['/workspace/work/inside.txt']\n", result.text
    assert not any(t.exists() for t in targets)
    assert ws.host_path is not None and (ws.host_path / "work" / "inside.txt").read_text() == "x"


async def test_kernel_cannot_read_shadow_or_root(kernels: KernelSessions, ws: Workspace) -> None:
    cell = (
        "import os\n"
        "for p in ('/etc/shadow', '/root/.bashrc', '/root/.profile'):\n"
        "    try:\n"
        "        open(p).read(1); print('read', p)\n"
        "    except OSError as exc:\n"
        "        print('denied', p, type(exc).__name__)\n"
        "try:\n"
        "    print(sorted(os.listdir('/root')))\n"
        "except OSError as exc:\n"
        "    print('no /root', type(exc).__name__)\n"
    )
    result = await kernels.execute(ws, cell)
    lines = result.text.splitlines()
    assert [line.split()[0] for line in lines[:3]] == ["denied"] * 3, result.text
    if lines[3].startswith("["):  # /root exists in the sandbox only as a mount point for granted paths
        host_entries = set(os.listdir("/root")) if os.access("/root", os.R_OK) else set()
        assert host_entries.isdisjoint(eval(lines[3])) or set(eval(lines[3])) <= {".pyenv"}


async def test_memory_limit_kills_the_kernel_and_the_next_call_gets_a_fresh_one(
    engine: BaseEngine, tmp_path: Path
) -> None:
    # a cgroup counts what is used; RLIMIT_AS (no cgroups: not root) counts address space, of which a kernel's
    # threads reserve far more than they use, so it needs a higher limit to start at all
    cgroup = "cgroup" in engine.describe().details["memory_bytes"]
    limit, hog = (300 * MiB, "blob = b'x' * (1024 * MiB)") if cgroup else (2048 * MiB, "blob = b'x' * (4096 * MiB)")
    async with execspace.open_engine(
        "jupyter",
        workspace_root=tmp_path / "mem",
        mode=SandboxedKernels(kernel_limits=ResourceLimits(memory_bytes=limit)),
    ) as eng:
        ks, ws = eng.kernels, await eng.manager.create_workspace("nb/mem")
        assert (await ks.execute(ws, f"kept = 1\nMiB = {MiB}")).exit_code == 0
        result = await ks.execute(ws, hog, timeout=60)
        if cgroup:
            assert result.kernel_died and result.state_lost and "memory_bytes" in result.text, result.text
            after = await ks.execute(ws, "'kept' in globals()")
            assert after.state_lost and after.text.endswith("False\n") and "fresh kernel" in after.text
        else:  # the allocation fails inside the kernel, which lives on
            assert result.error is not None and result.error[0] == "MemoryError", result.text
            assert (await ks.execute(ws, "kept")).text == "1\n"


@pytest.mark.slow
async def test_pids_limit_holds_in_the_kernel(engine: BaseEngine, tmp_path: Path) -> None:
    if "pids" not in engine.describe().enforced_limits:
        pytest.skip("pids is not enforced here: " + engine.describe().details["pids"])
    async with execspace.open_engine(
        "jupyter", workspace_root=tmp_path / "pids", mode=SandboxedKernels(kernel_limits=ResourceLimits(pids=64))
    ) as eng:
        ks, ws = eng.kernels, await eng.manager.create_workspace("nb/pids")
        cell = (
            "import threading, time\n"
            "started = 0\n"
            "try:\n"
            "    for _ in range(300):\n"
            "        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); started += 1\n"
            "except RuntimeError as exc:\n"
            "    print('stopped', started)\n"
        )
        result = await ks.execute(ws, cell, timeout=60)
        assert result.text.startswith("stopped"), result.text
        assert int(result.text.split()[1]) < 64
        await asyncio.sleep(3)
        assert (await ks.execute(ws, "started")).exit_code == 0  # the kernel survived its threads


async def test_timeout_interrupts_the_sandboxed_kernel_and_keeps_state(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 7")
    looped = await kernels.execute(ws, "while True:\n    pass", timeout=1.0)
    assert looped.timed_out and looped.exit_code == -2 and not looped.state_lost
    assert (await kernels.execute(ws, "kept")).text == "7\n"


@pytest.mark.slow
async def test_kernel_ignoring_interrupt_is_restarted(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 1")
    cell = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    stuck = await kernels.execute(ws, cell, timeout=1.0)
    assert stuck.timed_out and stuck.state_lost and "restarted" in stuck.text
    fresh = await kernels.execute(ws, "'kept' in globals()")
    assert fresh.text.endswith("False\n")


async def test_two_sessions_are_isolated(engine: BaseEngine, kernels: KernelSessions) -> None:
    a = await engine.manager.create_workspace("nb/a")
    b = await engine.manager.create_workspace("nb/b")
    assert a.host_path is not None and b.host_path is not None
    await kernels.execute(a, "secret = 'a-only'\nopen('secret.txt', 'w').write('a-only')")
    cell = (
        "import os\n"
        "print('secret' in globals(), os.listdir('/workspace/work'))\n"
        f"print(os.path.exists({str(a.host_path)!r}), os.path.exists({str(a.host_path / 'work' / 'secret.txt')!r}))\n"
    )
    seen = await kernels.execute(b, cell)
    assert seen.text.splitlines() == ["False ['inputs']", "False False"], seen.text


async def test_programs_of_the_engine_are_sandboxed_too(engine: BaseEngine, ws: Workspace, tmp_path: Path) -> None:
    result = await engine.runner.run_program(
        ws, RunProgramSpec("sh", ["-c", f"cat /etc/shadow; touch {tmp_path}/prog-canary; id -u"])
    )
    assert "root:" not in result.stdout and not (tmp_path / "prog-canary").exists()
    assert result.stdout.strip().splitlines()[-1] != "0"


async def test_sandbox_killed_between_calls_is_reported_and_replaced(kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "kept = 1")
    session = kernels._sessions[str(ws.host_path)]
    assert session.kernel is not None and session.kernel.proc.pid is not None
    os.kill(session.kernel.proc.pid, signal.SIGKILL)  # the sandbox's bwrap, as an OOM killer or admin would
    for _ in range(100):
        if not await session.kernel.proc.is_alive():
            break
        await asyncio.sleep(0.05)
    after = await kernels.execute(ws, "'kept' in globals()")
    assert after.state_lost and "died between calls" in after.text and after.text.endswith("False\n")


async def test_cleanup_stops_the_kernel(engine: BaseEngine, kernels: KernelSessions, ws: Workspace) -> None:
    await kernels.execute(ws, "x = 1")
    session = kernels._sessions[str(ws.host_path)]
    assert session.kernel is not None
    proc = session.kernel.proc
    await engine.manager.cleanup(ws)
    assert not await proc.is_alive()


async def test_auto_falls_back_loudly_and_sandbox_fails_closed(tmp_path: Path) -> None:
    broken = tmp_path / "no-bwrap"
    with pytest.raises(SetupFailed, match="cannot sandbox kernels"):
        async with execspace.open_engine(
            "jupyter", workspace_root=tmp_path / "a", mode=SandboxedKernels(bwrap=str(broken))
        ):
            pass
    with pytest.warns(RuntimeWarning, match="WITHOUT isolation"):
        async with execspace.open_engine(
            "jupyter", workspace_root=tmp_path / "b", mode=AutoKernels(bwrap=str(broken), pool_size=0)
        ) as eng:
            caps = eng.describe()
    assert str(caps.isolation) == "none" and caps.details["kernel_isolation"].startswith("none (auto")
    assert caps.kernels is not None and str(caps.kernels.isolation) == "none"
    # sandbox options the host cannot honour: no fallback
    with pytest.raises(SetupFailed):
        async with execspace.open_engine(
            "jupyter", workspace_root=tmp_path / "c", mode=SandboxedKernels(bwrap=str(broken), network=False)
        ):
            pass
    # ... nor can they be given to host kernels: an option the mode has not is refused before anything opens
    with pytest.raises(InvalidSpec, match="has no option network"):
        async with execspace.open_engine("jupyter", workspace_root=tmp_path / "d", mode=HostKernels(), network=False):
            pass
    with pytest.raises(InvalidSpec, match="not a kernel mode"):
        async with execspace.open_engine("jupyter", workspace_root=tmp_path / "d", mode="none"):
            pass


KERNEL_FROM_THIS_VENV = textwrap.dedent(
    """
    import asyncio, json, sys, execspace
    async def main():
        async with execspace.open_engine("jupyter", workspace_root=sys.argv[1]) as eng:
            ws = await eng.manager.create_workspace("venv-0700")
            cell = "import sys, os, ipykernel; print(sys.prefix, os.getuid(), ipykernel.__name__)"
            r = await eng.kernels.execute(ws, cell)
            print(json.dumps([str(eng.describe().isolation), sys.prefix, r.exit_code, r.text]))
    asyncio.run(main())
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="root mounts the venv (unshare -m)")
async def test_kernels_run_from_a_venv_under_a_0700_directory_without_changing_it(tmp_path: Path) -> None:
    """The newcomer's ``/root/.venv``: this test run's venv, bind-mounted (in a mount namespace of the test's own)
    into a 0700 directory, runs the engine; its kernel is sandboxed and runs that venv, which stays as it was."""
    make_traversable(tmp_path)
    home = tmp_path / "home"
    (home / ".venv").mkdir(parents=True)
    home.chmod(0o700)
    script = tmp_path / "kernel.py"
    script.write_text(KERNEL_FROM_THIS_VENV)
    before = {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in (home, home / ".venv")}
    mount_then_run = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    ran = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount_then_run, "sh",
         sys.prefix, str(home / ".venv"), str(home / ".venv" / "bin" / "python"), str(script), str(tmp_path / "ws")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    isolation, prefix, code, text = json.loads(ran.stdout.splitlines()[-1])
    assert (isolation, prefix) == ("process", str(home / ".venv"))
    assert code == 0 and text.split()[0] == prefix and text.split()[2] == "ipykernel", text
    assert int(text.split()[1]) != 0  # the workspace's own uid read the venv
    assert {p: (os.lstat(p).st_mode, os.lstat(p).st_uid) for p in before} == before
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


async def test_environment_is_a_keyword_of_the_jupyter_backend_and_only_for_sandboxed_kernels(
    tmp_path: Path,
) -> None:
    with pytest.raises(InvalidSpec, match="environment='code-interpreter' runs sandboxed kernels"):
        async with execspace.open_engine("jupyter", mode=HostKernels(), environment="code-interpreter"):
            pass
    with pytest.raises(InvalidSpec, match="contradicts SandboxedKernels"):
        async with execspace.open_engine(
            "jupyter", mode=SandboxedKernels(environment="base"), environment="code-interpreter"
        ):
            pass
    with pytest.raises(EnvironmentNotFound, match="no-such-environment"):
        async with execspace.open_engine("jupyter", workspace_root=tmp_path / "ws", environment="no-such-environment"):
            pass


async def test_a_snapshot_stops_the_kernel_for_its_instant(
    engine: BaseEngine, kernels: KernelSessions, ws: Workspace
) -> None:
    """The kernel writes from a thread of its own and from a child process; a snapshot stops both (its whole
    sandbox) for its copy, and they go on after it."""
    tag = new_tag("kernel-freeze")
    cell = (
        "import subprocess, threading\n"
        f"child = subprocess.Popen(['/bin/sh', '-c', 'while :; do echo tick >> child; done # {tag}'])\n"
        "def write():\n"
        "    with open('thread', 'a', buffering=1) as f:\n"
        "        while True:\n"
        "            f.write('tick\\n')\n"
        "threading.Thread(target=write, daemon=True).start()\n"
    )
    assert (await kernels.execute(ws, cell, timeout=20)).error is None
    assert ws.host_path is not None
    files = [ws.host_path / "work/child", ws.host_path / "work/thread"]
    while not all(f.exists() for f in files) or not pids_with(tag):
        await asyncio.sleep(0.01)
    manager = engine.manager
    assert isinstance(manager, HostWorkspaceManager)
    async with manager._frozen(ws):
        assert pids_with(tag) and all(held_still(pid) for pid in pids_with(tag))
    snap = await manager.snapshot(ws)
    async with snapshot_files(engine, snap) as frozen_tree:
        for f in files:
            frozen = (frozen_tree / "work" / f.name).read_bytes()
            assert frozen == b"tick\n" * (len(frozen) // 5), f.name  # no half-written line: nobody wrote meanwhile
            while f.stat().st_size <= len(frozen):  # they go on after it
                await asyncio.sleep(0.01)
    assert not any(held_still(pid) for pid in pids_with(tag))
