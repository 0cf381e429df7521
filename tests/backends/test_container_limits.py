"""Per-run rlimits inside the workspace container, and the network opt-in, against a real daemon."""

from __future__ import annotations

import resource
import secrets
import signal
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
from tests.backends.container_support import container_engine, engine_containers, engine_fixture, sh
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
    assert seen["Max address space"] == ("unlimited", "unlimited")  # memory is a cgroup's, never RLIMIT_AS
    plain = _limits((await engine.runner.run_program(ws, sh("cat /proc/self/limits"))).stdout)
    assert plain["Max cpu time"] == ("unlimited", "unlimited")  # limits belong to the run, not the container


# -- memory: a cgroup of the size asked for, its OOM kills the evidence --------------------------------------


#: Allocates N MiB and touches every page, so that the memory is really used (RSS), then says so.
TOUCH = "b = bytearray({n} << 20); b[::4096] = b'x' * len(b[::4096]); print('ok')"


def touch(mib: int, memory_mib: int | None = None) -> RunProgramSpec:
    limits = ResourceLimits(memory_bytes=None if memory_mib is None else memory_mib << 20)
    return RunProgramSpec("python3", ["-c", TOUCH.format(n=mib)], limits=limits, timeout=60)


async def test_a_run_gets_the_memory_it_asks_for_above_the_container_cap(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    """The newcomer's ``--memory 1024`` for a 700 MB program: the run's cgroup is what it asked for, not the
    workspace container's cap (here 128 MiB, which the same program without a limit breaches, and is told so)."""
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0, memory_bytes=128 << 20) as eng:
        ws = await eng.manager.create_workspace("mem-above")
        big = await eng.runner.run_program(ws, touch(300, memory_mib=512))
        assert (big.exit_code, big.limit_hit, big.stdout) == (0, None, "ok\n"), big.stderr
        cgroup = await eng.runner.run_program(
            ws, sh(f"cat {V1_LIMIT} || cat /sys/fs/cgroup/memory.max", limits=_mib(512))
        )
        assert cgroup.stdout.split()[0] == str(512 << 20)
        capped = await eng.runner.run_program(ws, touch(300))  # no limit of its own: the container's 128 MiB
        assert (capped.exit_code, capped.limit_hit) == (-signal.SIGKILL, "memory_bytes")
        assert "memory_bytes" in eng.describe().enforced_limits


V1_LIMIT = "/sys/fs/cgroup/memory/memory.limit_in_bytes"


def _mib(n: int) -> ResourceLimits:
    return ResourceLimits(memory_bytes=n << 20)


async def test_a_memory_breach_is_told_by_the_cgroups_oom_kills_not_by_exit_137(
    engine: execspace.BaseEngine, ws: execspace.Workspace
) -> None:
    breach = await engine.runner.run_program(ws, touch(200, memory_mib=64))
    assert (breach.exit_code, breach.limit_hit, breach.stdout) == (-signal.SIGKILL, "memory_bytes", "")
    fits = await engine.runner.run_program(ws, touch(16, memory_mib=64))  # the same cgroup: only new kills count
    assert (fits.exit_code, fits.limit_hit) == (0, None), fits.stderr
    for limits in (_mib(64), None):  # a program's own 137 is not a breach, in a member or in the container
        own = await engine.runner.run_program(ws, sh("exit 137", limits=limits or ResourceLimits()))
        assert (own.exit_code, own.limit_hit) == (-signal.SIGKILL, None)
    killed = await engine.runner.run_program(ws, sh("kill -9 $$", limits=_mib(64)))  # a SIGKILL that is no OOM
    assert (killed.exit_code, killed.limit_hit) == (-signal.SIGKILL, None)
    child = await engine.runner.run_program(
        ws, sh(f'python3 -c "{TOUCH.format(n=200)}"; echo survived', limits=_mib(64))
    )
    assert (child.exit_code, child.limit_hit, child.stdout) == (0, "memory_bytes", "survived\n")  # as the sandbox


async def test_runs_with_a_memory_limit_share_the_workspace_processes_and_loopback(
    docker_daemon: Daemon, test_image: str, tmp_path: Path
) -> None:
    """A member container is the workspace's, but for its cgroup: the same files, processes and loopback as the
    workspace container's runs; one member per distinct limit, all removed with the workspace."""
    async with container_engine(docker_daemon, test_image, tmp_path / "ws", pool_size=0) as eng:
        ws = await eng.manager.create_workspace("mem-shared")
        server = "python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 & echo $! > pid; exec >&- 2>&-"
        assert (await eng.runner.run_program(ws, sh(server))).exit_code == 0
        probe = (
            "import urllib.request, time\nfor _ in range(200):\n    try:\n"
            "        print(urllib.request.urlopen('http://127.0.0.1:8765/pid').status); break\n"
            "    except OSError: time.sleep(0.05)"
        )
        for limit in (64, 96, 64):
            r = await eng.runner.run_program(ws, RunProgramSpec("python3", ["-c", probe], limits=_mib(limit)))
            assert r.stdout == "200\n", r.stderr  # the workspace container's server, on the shared loopback
        seen = await eng.runner.run_program(
            ws, sh("kill -0 $(cat pid) && echo alive && kill $(cat pid)", limits=_mib(64))
        )
        assert seen.stdout == "alive\n", seen.stderr  # its process, seen and signalled from the member
        mine = {cid: c["Labels"] for cid, c in engine_containers(docker_daemon, eng).items()}
        assert len(mine) == 3  # the workspace's container and one member per distinct limit (64, 96 MiB)
        await eng.manager.cleanup(ws)
        assert engine_containers(docker_daemon, eng) == {}


#: Kills the member's first process: the ``sleep`` whose parent is outside the shared pid namespace (ppid 0; the
#: workspace container's has its init for parent), so that the member stops and takes the run with it.
KILL_MEMBER = """
for p in /proc/[0-9]*; do
  s=$(cat $p/stat 2>/dev/null) || continue; s=${s##*) }; set -- $s
  [ "$2" = 0 ] && [ "$(cat $p/comm)" = sleep ] && kill -9 ${p#/proc/}
done
sleep 20
"""


@pytest.mark.slow  # a stopped container's exec streams end about 10 s later
async def test_a_member_that_stopped_is_replaced(
    docker_daemon: Daemon, engine: execspace.BaseEngine, ws: execspace.Workspace
) -> None:
    lost = await engine.runner.run_program(ws, sh(KILL_MEMBER, limits=_mib(64), timeout=15))
    assert not lost.timed_out and lost.exit_code == -signal.SIGKILL  # its container stopped under it
    assert lost.limit_hit is None  # stopped, but the daemon says it was no OOM kill
    again = await engine.runner.run_program(ws, touch(16, memory_mib=64))
    assert (again.exit_code, again.limit_hit) == (0, None), again.stderr
    states = {c["State"] for c in engine_containers(docker_daemon, engine).values()}
    assert states == {"running"}  # the stopped member was removed, a new one runs


async def test_a_memory_limit_no_cgroup_takes_is_refused(engine: execspace.BaseEngine, ws: execspace.Workspace) -> None:
    with pytest.raises(CapabilityError, match="at least 6 MiB"):
        await engine.runner.run_program(ws, sh("true", limits=ResourceLimits(memory_bytes=1 << 20)))


def test_a_limit_the_shell_cannot_set_stops_the_run() -> None:
    """Fail closed: when ``ulimit`` refuses (a hard limit already lower), the program never starts.

    Run with the host's /bin/sh, the shell the test image uses, so the hard limit can be lowered first."""
    argv = rlimit_argv(ResourceLimits(file_size_bytes=1 << 20))

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
