"""Session fixtures for the container backend: a reachable daemon and an image built offline.

If no daemon answers, a private ``dockerd`` is started (when installed; CI installs
``docker.io``) with its own data root and socket, and stopped at the end. Nothing is
installed here; without a daemon the tests skip with the reason.

The test image is an empty root with the host's ``/usr`` and ``/etc`` bind-mounted
read-only — for tests only (it exposes the host's programs and /etc to the container);
docs/backends.md has the recipe for a real self-contained image.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

TEST_IMAGE = "execspace-test:host-usr"
TEST_BINDS = {"/usr": "/usr", "/etc": "/etc"}


@dataclass(frozen=True)
class Daemon:
    host: str
    """``unix://…`` URL of the daemon."""
    socket: str


def _ping(host: str) -> bool:
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        return False  # the SDK leaks the socket of a failed unix connect
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.DockerClient(base_url=host, timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False


def _start_private_dockerd(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    sock = tmp / "docker.sock"
    with open(tmp / "dockerd.log", "wb") as log:  # the daemon keeps its own copy of the fd
        proc = subprocess.Popen(
            [
                "dockerd",
                "--iptables=false",
                "--bridge=none",
                "--data-root",
                str(tmp / "data"),
                "--exec-root",
                str(tmp / "exec"),
                "--pidfile",
                str(tmp / "docker.pid"),
                "-H",
                f"unix://{sock}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return proc, f"unix://{sock}"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def docker_daemon() -> Iterator[Daemon]:
    pytest.importorskip("docker", reason="the docker SDK is not installed (pip install 'execspace[docker]')")
    existing = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if _ping(existing):
        yield Daemon(existing, existing.removeprefix("unix://"))
        return
    if shutil.which("dockerd") is None:
        pytest.skip(f"no container daemon at {existing} and dockerd is not installed (apt-get install docker.io)")
    if os.getuid() != 0:
        pytest.skip(f"no container daemon at {existing}, and starting dockerd needs root")
    tmp = Path(tempfile.mkdtemp(prefix="esdock-", dir="/tmp"))  # short: unix socket paths are limited
    proc, host = _start_private_dockerd(tmp)
    try:
        deadline = time.monotonic() + 30
        while not _ping(host):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (tmp / "dockerd.log").read_text(errors="replace")[-800:]
                pytest.skip(f"a private dockerd did not start: {tail}")
            time.sleep(0.1)
        yield Daemon(host, str(tmp / "docker.sock"))
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _empty_root_tar() -> bytes:
    """A root with mount points and the merged-/usr links, so host /usr works inside."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for d in ("usr", "etc", "sbin", "tmp", "workspace", "proc", "dev", "sys"):
            info = tarfile.TarInfo(d)
            # the daemon copies the image's /tmp mode onto the tmpfs, so /tmp must be 1777 as in real images
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(scope="session")
def test_image(docker_daemon: Daemon) -> str:
    """Imports the test image once (about 0.1 s); no registry is involved."""
    import docker

    client = docker.DockerClient(base_url=docker_daemon.host, timeout=30)
    try:
        client.api.import_image_from_data(_empty_root_tar(), repository=TEST_IMAGE.split(":")[0], tag="host-usr")
        client.images.get(TEST_IMAGE)
    finally:
        client.close()
    return TEST_IMAGE
