"""The same container backend against Podman's Docker-compatible API (a private ``podman system service``).

Podman on this kind of host needs the ``runc`` runtime (``crun`` refuses hybrid cgroups), the
``cgroupfs`` manager (no systemd) and explicit ulimits (its default nofile is above the host's
hard limit): the private service is configured for the first two, the backend always sets the
third. Skipped, with the reason, where podman is not installed or we are not root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import execspace
from execspace import PutFile
from execspace.backends.container.daemon import connect, daemon_info
from execspace.models import ResourceLimits
from execspace.workspace.slots import SLOT_PREFIX
from tests.backends.container_support import container_engine, engine_containers, engine_fixture, sh
from tests.backends.docker_fixture import Daemon

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")

engine = engine_fixture("podman_daemon", "podman_image", pool_size=1, warm=True)


def test_the_daemon_is_recognised_as_podman(podman_daemon: Daemon) -> None:
    client = connect(podman_daemon.host)
    try:
        info = daemon_info(client, podman_daemon.host)
    finally:
        client.close()
    assert info.product == "Podman"
    assert podman_daemon.host in str(info)


async def test_runs_files_and_hardening_under_podman(engine: execspace.BaseEngine) -> None:
    assert engine.describe().details["daemon"].startswith("Podman ")
    ws = await engine.manager.create_workspace("podman")
    await engine.fs.put_files(ws, [PutFile("work/in.txt", b"hello\n")])
    script = (
        "cat in.txt; id -u; grep CapEff /proc/self/status; cut -d: -f1 /proc/net/dev | tail -n +3;"
        " touch /x 2>/dev/null || echo ro; echo out > $OUTPUT_DIR/r.txt; read x; echo got $x"
    )
    r = await engine.runner.run_program(ws, sh(script, stdin="in\n"))
    assert r.exit_code == 0, r.stderr
    lines = [line.strip() for line in r.stdout.splitlines()]
    assert lines[:2] == ["hello", "65534"]
    assert lines[2].split() == ["CapEff:", "0000000000000000"]  # no capability at all
    assert lines[3:] == ["lo", "ro", "got in"]  # no network but loopback, read-only root, stdin
    files = await engine.fs.collect(ws, ["out/**"])
    assert [(f.name, f.content) for f in files] == [("out/r.txt", b"out\n")]


async def test_timeout_and_limits_under_podman(engine: execspace.BaseEngine) -> None:
    ws = await engine.manager.create_workspace("podman-limits")
    r = await engine.runner.run_program(ws, sh("sleep 30", timeout=0.5))
    assert r.timed_out and r.limit_hit == "timeout"
    r = await engine.runner.run_program(ws, sh("while :; do :; done", limits=ResourceLimits(cpu_seconds=1)))
    assert r.limit_hit == "cpu_seconds"


async def test_pool_and_cleanup_under_podman(podman_daemon: Daemon, podman_image: str, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    async with container_engine(podman_daemon, podman_image, root, pool_size=1, warm=True) as eng:
        warm = list(engine_containers(podman_daemon, eng))
        ws = await eng.manager.create_workspace("pooled")
        r = await eng.runner.run_program(ws, sh("hostname; ls -A /tmp"))
        assert len(warm) == 1 and warm[0].startswith(r.stdout.strip())  # the renamed slot dir is the mount
    assert engine_containers(podman_daemon, eng) == {}
    assert list(root.glob(f"{SLOT_PREFIX}*")) == []


async def test_a_runs_memory_is_a_member_cgroup_under_podman(engine: execspace.BaseEngine) -> None:
    """The member container (the workspace container's network and pid namespaces, a cgroup of the run's size) and
    its OOM-kill counter work through Podman's compat API too."""
    ws = await engine.manager.create_workspace("podman-memory")
    touch = "b = bytearray({} << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"
    start = sh("sleep 30 & echo $! > pid; exec >&- 2>&-")
    assert (await engine.runner.run_program(ws, start)).exit_code == 0
    limits = ResourceLimits(memory_bytes=64 << 20)
    fits = await engine.runner.run_program(
        ws, sh(f'kill -0 $(cat pid) && python3 -c "{touch.format(16)}"', limits=limits)
    )
    assert (fits.exit_code, fits.limit_hit, fits.stdout) == (0, None, "ok\n"), fits.stderr
    breach = await engine.runner.run_program(
        ws, execspace.RunProgramSpec("python3", ["-c", touch.format(200)], limits=limits)
    )
    assert (breach.exit_code, breach.limit_hit) == (-9, "memory_bytes")
