"""Attacks from root inside a machine-mode sandbox (``machine=True``: ``sudo`` is the root of the sandbox's own user
namespace, which owns its system's overlays), judged by what the host observes: the host's files, other
workspaces and their upper layers, the environment store, the network, the limits, the cgroup and the mount table
stay out of its reach, and its upper layer is within the workspace's disk bound."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import threading
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

import execspace
from execspace import ResourceLimits, RunProgramSpec
from execspace.backends.sandbox import SessionConfig
from execspace.environments import build, builtin_spec
from execspace.registry import probe_backend
from execspace.workspace.diskimages import disk_tools_missing
from tests.support import make_traversable

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio]

Box = tuple[execspace.BaseEngine, execspace.Workspace]


async def _require_machine(options: Mapping[str, Any]) -> None:
    if os.geteuid() != 0:
        pytest.skip("machine mode maps two host uids into each sandbox's user namespace: root only here")
    probe = await probe_backend("sandbox", **options)
    if not probe.ok:
        pytest.skip(f"sandbox unavailable: {probe.reason}")


@pytest_asyncio.fixture
async def engine(tmp_path: Path, sandbox_mode: Mapping[str, Any]) -> AsyncIterator[execspace.BaseEngine]:
    await _require_machine(sandbox_mode)
    make_traversable(tmp_path)
    spec = builtin_spec("base")
    assert spec is not None
    await build(spec)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", machine=True, environment="base", **sandbox_mode
    ) as eng:
        yield eng


async def root(box: Box, script: str, **kw: Any) -> execspace.RunResult:
    """``script`` run by root inside (``sudo``)."""
    eng, ws = box
    spec = RunProgramSpec("sudo", ["-n", "/bin/sh", "-c", script], timeout=60, **kw)
    return await eng.runner.run_program(ws, spec)


def digest(top: str) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames.sort()
        for name in sorted([*dirnames, *filenames]):
            st = os.lstat(os.path.join(dirpath, name))
            h.update(f"{dirpath}/{name}:{st.st_mode}:{st.st_uid}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


async def test_root_inside_cannot_read_or_plant_host_files(engine: execspace.BaseEngine, tmp_path: Path) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("HOST SECRET")
    os.chmod(secret, 0o644)
    ws = await engine.manager.create_workspace("attacker")
    shadow = "/etc/shadow" if os.path.exists("/etc/shadow") else "/dev/null"
    r = await root(
        (engine, ws),
        f"cat {secret} /root/.bashrc {shadow}; ls /home /root; cat /proc/1/environ; "
        "echo planted > /etc/planted-by-root; touch /usr/planted-by-root; echo ok",
    )
    assert r.stdout.endswith("ok\n"), r.stderr
    assert "HOST SECRET" not in r.stdout and ":$" not in r.stdout
    assert not Path("/etc/planted-by-root").exists() and not Path("/usr/planted-by-root").exists()


async def test_root_inside_cannot_reach_another_workspace_or_its_layers(engine: execspace.BaseEngine) -> None:
    victim = await engine.manager.create_workspace("victim")
    r = await root((engine, victim), "echo VICTIM > /etc/victim-only")
    assert r.exit_code == 0, r.stderr
    r = await engine.runner.run_program(victim, RunProgramSpec("/bin/sh", ["-c", "echo VICTIM > ~/victim.txt"]))
    assert r.exit_code == 0, r.stderr
    assert victim.host_path is not None
    attacker = await engine.manager.create_workspace("attacker")
    paths = [victim.host_path, victim.host_path / ".execspace" / "machine", victim.host_path.parent / ".machine-stage"]
    probe = " ".join(
        f"ls -a {p}; cat {p}/work/victim.txt {p}/.execspace/machine/host-etc/upper/victim-only;" for p in paths
    )
    r = await root((engine, attacker), f"{probe} cat /etc/victim-only; grep -r VICTIM /etc /opt 2>/dev/null; echo end")
    assert "VICTIM" not in r.stdout and "victim.txt" not in r.stdout and r.stdout.endswith("end\n"), r.stdout


async def test_root_inside_cannot_change_the_seeds_every_sandbox_starts_on(engine: execspace.BaseEngine) -> None:
    """The layers' seeds are shared read-only by every sandbox: root rewrites, removes and chmods what they hold
    (its passwd, its sudo, the root-owned directories), looks for them by their host path, and another sandbox
    still starts on them unchanged."""
    ws = await engine.manager.create_workspace("seed-attacker")
    assert ws.host_path is not None
    seeds = ws.host_path.parent / ".machine-seeds"
    await root((engine, ws), "true")  # the seeds are built by the first start
    before = digest(str(seeds))
    attack = (
        "echo 'evil:x:0:0::/:/bin/sh' >> /etc/passwd; rm -f /usr/local/bin/sudo; chmod 777 /etc /opt /var;"
        "echo evil > /usr/local/bin/python; rm -rf /usr/local/bin; touch /etc/planted;"
        f"ls {seeds} 2>&1; cat {seeds}/*/passwd 2>&1; grep -o 'seed[0-9]*' /proc/self/mountinfo | head -3; echo end"
    )
    r = await root((engine, ws), attack)
    assert r.stdout.endswith("end\n") and "root:x:0:0" not in r.stdout, r.stdout  # no seed's passwd read by path
    assert digest(str(seeds)) == before
    other = await engine.manager.create_workspace("seed-other")
    r = await engine.runner.run_program(
        other, RunProgramSpec("/bin/sh", ["-c", "grep -c evil /etc/passwd; ls /etc/planted; sudo -n id -un"])
    )
    assert r.stdout == "0\nroot\n" and "No such file" in r.stderr, (r.stdout, r.stderr)


async def test_root_inside_cannot_change_the_environment_store(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("store")
    r = await engine.runner.run_program(ws, RunProgramSpec("python", ["-c", "import sys; print(sys.prefix)"]))
    tree = r.stdout.strip()
    assert tree.startswith("/") and os.path.isdir(tree), r.stderr
    before = digest(tree)
    r = await root(
        (engine, ws),
        f"echo 'import os' > {tree}/lib/python3.11/site-packages/planted.pth; rm -rf {tree}/bin; "
        f"touch {tree}/x; ls {os.path.dirname(tree)}; echo done",
    )
    assert r.stdout.strip().endswith("done"), r.stderr
    assert digest(tree) == before
    assert os.path.isdir(f"{tree}/bin")


async def test_root_inside_has_no_network_when_off(engine: execspace.BaseEngine) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            accepted.append(server.accept())

    thread = threading.Thread(target=accept)
    thread.start()
    try:
        ws = await engine.manager.create_workspace("net")
        script = (
            'python3 -c "import socket; s=socket.socket(); s.settimeout(2); '
            f"s.connect(('127.0.0.1', {port})); print('CONNECTED')\"; "
            "python3 -c \"import socket; print(socket.getaddrinfo('example.com', 80))\"; ip link set lo down; echo end"
        )
        r = await root((engine, ws), script)
    finally:
        thread.join()
        server.close()
    assert "CONNECTED" not in r.stdout and r.stdout.endswith("end\n") and not accepted


async def test_root_inside_cannot_raise_its_limits_leave_its_cgroup_or_mount(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("limits")
    script = (
        "ulimit -H -n 1000000 && echo RAISED-NOFILE; "
        "python3 -c 'import resource as r; inf = r.RLIM_INFINITY; r.setrlimit(r.RLIMIT_NPROC, (inf, inf)); "
        'print("RAISED-NPROC")\';'
        "echo $$ > /sys/fs/cgroup/cgroup.procs && echo LEFT-CGROUP; "
        "mount -t tmpfs none /mnt && echo MOUNTED; umount -l /etc && echo UNMOUNTED; "
        "unshare -U -r true && echo UNSHARED; unshare -m true && echo UNSHARED-NS; "
        "nsenter -t 1 -m true && echo ENTERED; chroot / true && echo CHROOTED; "
        "grep CapEff /proc/self/status; echo end"
    )
    r = await root((engine, ws), script, limits=ResourceLimits(pids=256))
    for bad in ("RAISED", "LEFT-CGROUP", "MOUNTED", "UNMOUNTED", "UNSHARED", "ENTERED", "CHROOTED"):
        assert bad not in r.stdout, r.stdout
    assert r.stdout.endswith("end\n")
    # root's capabilities inside are CAP_SETUID, CAP_SETGID and CAP_DAC_READ_SEARCH, of its own namespace only
    eff = int(r.stdout.split("CapEff:")[1].split()[0], 16)
    assert eff == (1 << 6) | (1 << 7) | (1 << 2), hex(eff)


@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_the_upper_layer_respects_the_disk_bound(tmp_path: Path, mode: str) -> None:
    if why := disk_tools_missing():
        pytest.skip(why)
    options: dict[str, Any] = {"mode": "session", "session": SessionConfig(disk_bytes=24 * 1024 * 1024)}
    await _require_machine(options)
    make_traversable(tmp_path)
    async with execspace.open_engine("sandbox", workspace_root=tmp_path / "ws", machine=True, **options) as eng:
        ws = await eng.manager.create_workspace("disk")
        try:
            await _fills_the_upper_layer(eng, ws, mode)
        finally:
            await eng.manager.cleanup(ws)  # its disk unmounted: nothing left on the host's mount table


async def _fills_the_upper_layer(eng: execspace.BaseEngine, ws: execspace.Workspace, mode: str) -> None:
    """64 MiB into the system's upper layer, in 1 MiB writes: the bound stops it."""
    spec = RunProgramSpec("sudo", ["-n", "dd", "if=/dev/zero", "of=/opt/fill", "bs=1M", "count=64"], timeout=60)
    if mode == "per-run":
        # a run the session does not fit (pids, as root) gets a sandbox of its own, over the same layers
        spec = RunProgramSpec(spec.cmd, spec.args, timeout=60, limits=ResourceLimits(pids=256))
    r = await eng.runner.run_program(ws, spec)
    assert r.exit_code != 0 and "No space left on device" in r.stderr, (r.exit_code, r.stderr)
    assert ws.host_path is not None
    upper = ws.host_path / ".execspace" / "machine" / "host-opt" / "upper" / "fill"
    assert upper.stat().st_blocks * 512 < 24 * 1024 * 1024
