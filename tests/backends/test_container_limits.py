"""Per-run rlimits inside the workspace container, and the network opt-in, against a real daemon."""

from __future__ import annotations

import resource
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import execspace
from execspace import RunProgramSpec
from execspace.backends.container.daemon import connect
from execspace.backends.container.limits import rlimit_argv
from execspace.errors import CapabilityError, PolicyViolation
from execspace.models import ResourceLimits
from tests.backends.container_support import container_engine, engine_fixture, sh
from tests.backends.docker_fixture import Daemon

pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")


engine = engine_fixture(pool_size=0)


@pytest.fixture
async def ws(engine: execspace.BaseEngine) -> execspace.Workspace:
    return await engine.manager.create_workspace("limits")


def _limits(stdout: str) -> dict[str, tuple[str, str]]:
    """``/proc/self/limits`` as name → (soft, hard)."""
    rows = {}
    for line in stdout.splitlines()[1:]:
        parts = line[26:].split()
        rows[line[:26].strip()] = (parts[0], parts[1])
    return rows


async def test_run_limits_are_the_programs_rlimits(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    limits = ResourceLimits(cpu_seconds=1.5, file_size_bytes=10_000, memory_bytes=64 * 1024 * 1024)
    r = await engine.runner.run_program(ws, sh("cat /proc/self/limits", limits=limits))
    assert r.exit_code == 0, r.stderr
    seen = _limits(r.stdout)
    assert seen["Max cpu time"] == ("2", "3")  # whole seconds, rounded up; SIGKILL a second after SIGXCPU
    assert seen["Max file size"] == ("9728", "9728")  # rounded down to 512-byte blocks: never looser
    assert seen["Max address space"] == (str(64 * 1024 * 1024),) * 2
    plain = _limits((await engine.runner.run_program(ws, sh("cat /proc/self/limits"))).stdout)
    assert plain["Max cpu time"] == ("unlimited", "unlimited")  # limits belong to the run, not the container


async def test_cpu_limit_stops_a_busy_loop(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    r = await engine.runner.run_program(ws, sh("while :; do :; done", limits=ResourceLimits(cpu_seconds=1), timeout=20))
    assert not r.timed_out
    assert r.limit_hit == "cpu_seconds"


async def test_file_size_limit_stops_a_large_write(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    assert ws.host_path is not None
    limits = ResourceLimits(file_size_bytes=4096)
    r = await engine.runner.run_program(ws, sh("exec head -c 1000000 /dev/zero > big", limits=limits))
    assert r.limit_hit == "file_size_bytes"
    assert (ws.host_path / "work" / "big").stat().st_size == 4096


async def test_memory_limit_below_the_container_cap(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    limits = ResourceLimits(memory_bytes=64 * 1024 * 1024)
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", "bytearray(200 << 20)"], limits=limits))
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    r = await engine.runner.run_program(ws, RunProgramSpec("python3", ["-c", "bytearray(200 << 20)"]))
    assert r.exit_code == 0, r.stderr


def test_a_limit_the_shell_cannot_set_stops_the_run() -> None:
    """Fail closed: when ``ulimit`` refuses (a hard limit already lower), the program never starts.

    Run with the host's /bin/sh, the shell the test image uses, so the hard limit can be lowered first."""
    argv = rlimit_argv(ResourceLimits(file_size_bytes=1 << 20), container_memory=1 << 30)

    def lower_the_hard_limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))

    r = subprocess.run([*argv, "echo", "ran"], preexec_fn=lower_the_hard_limit, capture_output=True, text=True)
    assert r.returncode == 126 and r.stdout == ""
    assert "cannot apply the run limits" in r.stderr


# -- network -------------------------------------------------------------------------------------


@pytest.fixture
def daemon_network(docker_daemon: Daemon) -> Iterator[str]:
    client = connect(docker_daemon.host)
    name = f"es-test-{secrets.token_hex(3)}"
    network = client.networks.create(name, driver="bridge")
    try:
        yield name
    finally:
        network.remove()
        client.close()


def _interfaces(stdout: str) -> set[str]:
    return {line.split(":")[0].strip() for line in stdout.splitlines()[2:]}


async def test_network_is_off_by_default(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    caps = engine.describe()
    assert caps.network_control and not caps.network_default and caps.details["network"] == "none"
    r = await engine.runner.run_program(ws, sh("cat /proc/net/dev", network="off"))
    assert _interfaces(r.stdout) == {"lo"}
    with pytest.raises(CapabilityError):
        await engine.runner.run_program(ws, sh("true", network="on"))


async def test_network_opt_in_attaches_the_daemon_network(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, daemon_network: str
) -> None:
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0, network=daemon_network) as eng:
        caps = eng.describe()
        assert caps.network_default and not caps.network_control and caps.details["network"] == daemon_network
        ws = await eng.manager.create_workspace("net")
        r = await eng.runner.run_program(ws, sh("cat /proc/net/dev", network="on"))
        assert _interfaces(r.stdout) == {"lo", "eth0"}
        with pytest.raises(CapabilityError):  # this container cannot take the network away from one run
            await eng.runner.run_program(ws, sh("true", network="off"))


@pytest.mark.parametrize("network", ["host", "container:abc", ""])
async def test_sharing_another_network_namespace_is_refused(
    docker_daemon: Daemon, test_image: str, tmp_path: Path, network: str
) -> None:
    with pytest.raises(PolicyViolation):
        async with container_engine(docker_daemon, test_image, tmp_path, network=network):
            pass
