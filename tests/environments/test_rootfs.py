"""Rootfs environments (issue 13): ``base = "rootfs"`` with ``apt`` packages builds a minimal Debian root from the
host's own apt sources; the sandbox (per-run and session) shows it as the program's ``/``, the container backend
imports it as an image; a package that does not exist and a build killed with SIGKILL leave nothing in use.

The shared rootfs is built in the normal store (``default_root()``) so that a second run on the same machine finds
it built (the first build downloads a minimal Debian from the apt archive: 1–1.5 minutes here); the failure cases use
stores of their own under ``tmp_path``."""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import execspace
from execspace import EnvironmentBuildFailed, InvalidSpec, RunProgramSpec
from execspace.backends.container.daemon import connect
from execspace.environments import Environment, EnvironmentSpec, EnvironmentStore, build
from execspace.environments.rootfs import debian_target, host_sources
from execspace.registry import probe_backend
from tests.backends.container_support import container_engine
from tests.backends.docker_fixture import Daemon
from tests.support import CLI, make_traversable

#: A first build downloads a minimal Debian (about a minute here, more on a loaded machine).
BUILD_TIMEOUT = 900
#: ``lua5.4`` is not on the host (checked below), so finding it proves the sandbox runs the rootfs's /usr.
ROOTFS = EnvironmentSpec(
    name="rootfs-tools",
    base="rootfs",
    apt=("jq", "lua5.4"),
    env={"GREETING": "from the spec"},
    files={"etc/execspace-note": "written by the build"},
    description="a minimal Debian with jq and Lua (the tests' rootfs)",
)
SCRIPT = (
    "cat /etc/debian_version; echo '{\"a\": [1, 2]}' | jq -c .a; lua5.4 -e 'print(6 * 7)'; "
    'echo "$PATH|$GREETING"; cat /etc/execspace-note; echo; id -u; touch /usr/x 2>/dev/null; echo "ro=$?"'
)


@pytest.fixture(scope="module")
def rootfs() -> Environment:
    if not shutil.which("mmdebstrap"):
        pytest.fail("mmdebstrap is missing: ./run test installs it (APT_TEST_PACKAGES)")
    return asyncio.run(build(ROOTFS))


async def _require_sandbox() -> None:
    probe = await probe_backend("sandbox")
    if not probe.ok:
        pytest.skip(f"no sandbox here: {probe.reason}")


def _store_env(root: Path) -> dict[str, str]:
    make_traversable(root.parent)
    return {**os.environ, "EXECSPACE_ENVIRONMENTS": str(root)}


# -- specs and sources


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"apt": ("jq",)}, 'add base = "rootfs"'),
        ({"suite": "trixie"}, 'add base = "rootfs"'),
        ({"base": "rootfs", "requirements": ("six",)}, "install Python packages with apt"),
        ({"base": "rootfs", "npm": ("left-pad",)}, "is for host-based environments"),
        ({"base": "rootfs", "apt": ("./x.deb",)}, "not a Debian package name"),
        ({"base": "rootfs", "apt": ("jq; rm -rf /",)}, "not a Debian package name"),
        ({"base": "rootfs", "suite": "Bookworm/../x"}, "not a Debian suite name"),
        ({"base": "docker"}, "use 'host' or 'rootfs'"),
    ],
)
def test_a_bad_rootfs_spec_is_refused(spec: dict[str, object], says: str) -> None:
    with pytest.raises(InvalidSpec, match=says):
        EnvironmentSpec(name="x", **spec)  # type: ignore[arg-type]


def test_host_specs_keep_their_address_and_the_suite_is_part_of_a_rootfs() -> None:
    # digests computed by the code before rootfs environments existed: built trees keep their names
    old = EnvironmentSpec(name="x", requirements=("six==1.16.0",), env={"A": "1"}, files={"share/a": "b"})
    assert old.digest("3.11.2") == "aea17b19ca7dc7f2"
    assert "base" not in old.canonical()
    assert ROOTFS.digest("debian bookworm amd64") != ROOTFS.digest("debian trixie amd64")
    assert ROOTFS.digest("debian bookworm amd64") != EnvironmentSpec(
        name=ROOTFS.name, base="rootfs", suite="trixie", apt=ROOTFS.apt, env=ROOTFS.env, files=ROOTFS.files
    ).digest("debian bookworm amd64")


def test_the_host_apt_sources_are_read_and_rewritten_for_the_suite(tmp_path: Path) -> None:
    """deb822 and one-line files, disabled and vendor entries dropped, the suite swapped in; no mirror of ours."""
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("# none\ndeb-src http://mirror.test/debian bookworm main\n")
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.test/debian\nSuites: bookworm bookworm-updates\nComponents: main contrib\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://mirror.test/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://off.test/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    )
    (apt / "sources.list.d" / "vendor.list").write_text("deb [arch=amd64] https://vendor.test/apt stable main\n")
    (apt / "sources.list.d" / "old.list.disabled").write_text("deb http://disabled.test/debian bookworm main\n")
    assert len(host_sources(apt)) == 4  # three Debian entries and the vendor's
    release = tmp_path / "os-release"
    release.write_text('ID=debian\nVERSION_CODENAME="bookworm"\n')
    key = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    assert debian_target("trixie", apt, release).sources.splitlines() == [
        f"deb {key} http://mirror.test/debian trixie main contrib",
        f"deb {key} http://mirror.test/debian trixie-updates main contrib",
        "deb http://mirror.test/debian-security trixie-security main",
    ]
    (apt / "sources.list.d" / "debian.sources").unlink()
    with pytest.raises(EnvironmentBuildFailed, match="no entry for Debian bookworm"):
        debian_target("", apt, release)


# -- builds


@pytest.mark.timeout(BUILD_TIMEOUT)
def test_the_rootfs_is_built_once_with_its_packages_and_found_again(rootfs: Environment) -> None:
    assert rootfs.root is not None and rootfs.suite == debian_target("").suite
    assert set(rootfs.packages) == {"jq", "lua5.4"}
    assert (rootfs.root / "usr/bin/lua5.4").is_file() and (rootfs.root / "etc/debian_version").is_file()
    assert (rootfs.root / "etc/execspace-note").read_text() == "written by the build"
    assert not list((rootfs.root / "usr/share/man").glob("*"))  # a minbase without the docs nothing reads
    assert "deb " in (rootfs.path / "sources.list").read_text()  # where it came from, outside the program's view
    started = time.monotonic()
    again = asyncio.run(build(ROOTFS))
    assert again.path == rootfs.path and time.monotonic() - started < 5  # found, not built again


async def test_an_apt_package_that_does_not_exist_fails_naming_it_and_leaves_nothing(tmp_path: Path) -> None:
    make_traversable(tmp_path)
    store = EnvironmentStore(tmp_path / "store")
    bad = EnvironmentSpec(name="bad", base="rootfs", apt=("jq", "no-such-package-execspace"))
    with pytest.raises(EnvironmentBuildFailed, match="apt package\\(s\\) no-such-package-execspace do not exist"):
        await store.build(bad)
    assert store.environments() == []
    assert [p.name for p in store.root.iterdir() if not p.name.startswith(".lock-")] == []


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the build as another user")
def test_a_normal_user_without_subordinate_uids_is_told_what_to_do(tmp_path: Path) -> None:
    """Unprivileged, mmdebstrap's unshare mode needs /etc/subuid ranges: the user 'nobody' has none here."""
    make_traversable(tmp_path)
    store = tmp_path / "store"
    store.mkdir()
    os.chown(store, 65534, 65534)
    (tmp_path / "u.toml").write_text('name = "unprivileged"\nbase = "rootfs"\n')
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    env = {**_store_env(store), "HOME": str(store)}
    if subprocess.run([*drop, *CLI, "--help"], env=env, capture_output=True).returncode != 0:
        pytest.skip("'nobody' cannot run this checkout's execspace (a private directory on the way)")
    r = subprocess.run([*drop, *CLI, "env", "build", str(tmp_path / "u.toml")], env=env, capture_output=True, text=True)
    if "subordinate uids" not in r.stderr and r.returncode == 0:
        pytest.skip("this host gives 'nobody' subordinate uids: the build ran")
    assert r.returncode == 125 and "subordinate uids and gids" in r.stderr and "usermod --add-subuids" in r.stderr


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(str(path))]


def _processes_in(path: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(path) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            continue
    return found


def _kill_mid_install(build_argv: list[str], root: Path, log: Path) -> Path:
    """Start a build, SIGKILL it once mmdebstrap is installing into its tree (its mounts are there then), wait
    until nothing of it is left mounted or running; its half tree."""
    before = set(root.glob(".build-*"))
    with log.open("wb") as out:
        proc = subprocess.Popen(build_argv, env=_store_env(root), stderr=out)
    deadline = time.monotonic() + 300
    while not (started := [p for p in root.glob(".build-*") if p not in before and (p / "rootfs/usr/bin").exists()]):
        assert proc.poll() is None and time.monotonic() < deadline, f"the build ended first: {log.read_text()}"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 30
    while _mounts_under(root) or _processes_in(root):
        assert time.monotonic() < deadline, (_mounts_under(root), _processes_in(root))
        time.sleep(0.05)
    return started[0]


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT)
def test_a_rootfs_build_killed_mid_way_leaves_no_mount_or_process_and_the_next_starts_clean(tmp_path: Path) -> None:
    """SIGKILL while mmdebstrap installs (its /proc, /dev and /sys mounts are in the half tree): the build's own
    namespaces go with it, so nothing is left mounted or running; the half tree is never listed, and the next build
    sweeps it before it starts its own (killed too: a whole build is the shared fixture's)."""
    root = tmp_path / "store"
    (tmp_path / "k.toml").write_text('name = "killed"\nbase = "rootfs"\n')
    build_argv = [*CLI, "env", "build", str(tmp_path / "k.toml")]
    half = _kill_mid_install(build_argv, root, tmp_path / "first.log")
    assert EnvironmentStore(root).environments() == []
    second = _kill_mid_install(build_argv, root, tmp_path / "second.log")
    assert not half.exists() and list(root.glob(".build-*")) == [second]
    assert EnvironmentStore(root).environments() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a tmpfs")
def test_a_half_tree_with_a_mount_in_it_is_refused_and_never_walked(tmp_path: Path) -> None:
    """A half tree still holding a mount (a build killed outside its namespace) is not removed through it."""
    spec = EnvironmentSpec(name="mounted", base="rootfs")
    make_traversable(tmp_path)
    store = EnvironmentStore(tmp_path / "store")
    dev = store.root / f".build-mounted-{spec.digest(debian_target('').runtime)}-0dead0" / "rootfs" / "dev"
    dev.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "execspace-test", str(dev)], check=True)
    try:
        (dev / "keep").write_text("what the mount shows")
        with pytest.raises(EnvironmentBuildFailed, match="still has mounts in it"):
            asyncio.run(store.build(spec))
        assert (dev / "keep").read_text() == "what the mount shows"
    finally:
        subprocess.run(["umount", str(dev)], check=True)


# -- running in it


@pytest.mark.timeout(BUILD_TIMEOUT)
@pytest.mark.parametrize("mode", ["per-run", "session"])
async def test_the_sandbox_runs_the_rootfs_as_its_root(rootfs: Environment, tmp_path: Path, mode: str) -> None:
    """jq and Lua from the rootfs (the host has no Lua), its /etc/debian_version, Debian's PATH, the spec's
    variable, read-only, as the workspace's own uid."""
    await _require_sandbox()
    assert rootfs.root is not None and shutil.which("lua5.4") is None
    make_traversable(tmp_path)
    async with execspace.open_engine(
        "sandbox", workspace_root=tmp_path / "ws", environment="rootfs-tools", mode=mode
    ) as engine:
        assert "debian bookworm" in engine.describe().details["environment"]
        ws = await engine.manager.create_workspace(f"rootfs/{mode}")
        r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", SCRIPT]))
        assert r.exit_code == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[:5] == [
            (rootfs.root / "etc/debian_version").read_text().strip(),
            "[1,2]",
            "42",
            "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin|from the spec",
            "written by the build",
        ]
        assert int(lines[5]) != 0 and lines[6] == "ro=1"
        lua = await engine.runner.run_program(ws, RunProgramSpec("lua5.4", ["-e", "io.write(_VERSION)"]))
        assert (lua.exit_code, lua.stdout) == (0, "Lua 5.4")  # found by name in the rootfs, not on the host
        await engine.manager.cleanup(ws)


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_a_rootfs_sandbox_cannot_see_the_hosts_system_directories(rootfs: Environment, tmp_path: Path) -> None:
    """A file put in the host's /usr is there in a sandbox on the host's system, and absent from a rootfs one; the
    rootfs's own host path (in the store under /var) is in neither: the store is masked in every sandbox."""
    await _require_sandbox()
    make_traversable(tmp_path)
    marker = Path(f"/usr/local/share/execspace-host-only-{secrets.token_hex(4)}")
    marker.write_text("host")
    marker.chmod(0o644)
    probe = RunProgramSpec("sh", ["-c", f"cat {marker}"])
    try:
        for environment, seen in ((None, True), ("rootfs-tools", False)):
            async with execspace.open_engine(
                "sandbox", workspace_root=tmp_path / "ws", environment=environment
            ) as engine:
                ws = await engine.manager.create_workspace("rootfs/host")
                r = await engine.runner.run_program(ws, probe)
                assert (r.exit_code == 0 and r.stdout == "host") is seen, (environment, r)
                where = await engine.runner.run_program(ws, RunProgramSpec("test", ["-e", str(rootfs.path)]))
                assert where.exit_code == 1  # masked under the host's /var; a rootfs has a /var of its own
                # a run can name the rootfs on an engine opened without it: its own sandbox, its own /
                if environment is None:
                    one = await engine.runner.run_program(
                        ws, RunProgramSpec(probe.cmd, probe.args, environment="rootfs-tools")
                    )
                    assert one.exit_code == 1 and "No such file" in one.stderr
                await engine.manager.cleanup(ws)
    finally:
        marker.unlink()


@pytest.mark.timeout(BUILD_TIMEOUT)
async def test_the_container_backend_imports_the_rootfs_as_an_image_once(
    rootfs: Environment, docker_daemon: Daemon, tmp_path: Path
) -> None:
    """No image named, no host binds: the rootfs is the image (``docker import``, tagged by the digest), made on the
    first open and found by the next."""
    make_traversable(tmp_path)
    tag = f"execspace-env:{rootfs.name}-{rootfs.digest}"
    client = connect(docker_daemon.host)
    try:
        with_tag = [i for i in client.images.list() if tag in i.tags]
        for image in with_tag:  # a daemon kept from an earlier run: import again here
            client.images.remove(image.id, force=True)
        ids = []
        for n in range(2):
            async with container_engine(
                docker_daemon, None, tmp_path / f"ws{n}", environment="rootfs-tools", read_only_binds={}, pool_size=0
            ) as engine:
                ws = await engine.manager.create_workspace("rootfs/container")
                r = await engine.runner.run_program(ws, RunProgramSpec("sh", ["-c", SCRIPT]))
                assert r.exit_code == 0, r.stderr
                assert r.stdout.splitlines()[:3] == [
                    (rootfs.root / "etc/debian_version").read_text().strip(),
                    "[1,2]",
                    "42",
                ]
                ids.append(client.images.get(tag).id)
        assert ids[0] == ids[1] and len([i for i in client.images.list() if tag in i.tags]) == 1
        with pytest.raises(InvalidSpec, match="name two images"):
            async with container_engine(docker_daemon, "busybox", tmp_path / "ws3", environment="rootfs-tools"):
                pass
    finally:
        client.close()
