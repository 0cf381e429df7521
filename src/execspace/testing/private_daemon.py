"""A throw-away private container daemon (``dockerd`` or ``podman system service``), for tests and benchmarks.

Each daemon gets its own data root and socket under a fresh directory in ``/tmp`` and is
stopped with :meth:`PrivateDaemon.stop`; nothing of the host's own daemon is touched.
Podman is configured for this kind of host: the ``runc`` runtime (``crun`` refuses
hybrid cgroups) and the ``cgroupfs`` manager (no systemd). Both need root.

:func:`import_host_usr_image` builds, offline and in about 0.1 s, an *empty* image whose
``/usr`` and ``/etc`` come from the host by read-only binds (:data:`HOST_USR_BINDS`): for
tests only, since it shows the host's programs and ``/etc`` to the container.
``execspace image build`` builds a real self-contained image.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.container.daemon import LANGUAGES_LABEL
from ..languages import available_languages

__all__ = [
    "HOST_USR_BINDS",
    "HOST_USR_IMAGE",
    "DaemonUnavailable",
    "PrivateDaemon",
    "import_host_usr_image",
    "ping",
    "start_private_daemon",
]

HOST_USR_IMAGE = "execspace-test:host-usr"
HOST_USR_BINDS = {"/usr": "/usr", "/etc": "/etc"}

# exit_command_delay: Podman keeps each finished exec (and its conmon) for 300 s, as Docker keeps exec records.
# The backend reads the exit code right after the stream ends, so a short delay is enough; 0 would lose it, and
# 300 would leave conmons behind a throw-away daemon for five minutes
_PODMAN_CONF = (
    '[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\nexit_command_delay = 10\n'
)


class DaemonUnavailable(Exception):
    """The daemon cannot run here; the message says exactly why (tests skip with it)."""


@dataclass
class PrivateDaemon:
    kind: str
    """``docker`` or ``podman``."""
    host: str
    """``unix://…`` URL of the daemon."""
    socket: str
    proc: subprocess.Popen[bytes] | None = None
    tmp: Path | None = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.tmp is not None:
            _unmount_below(self.tmp)  # podman leaves its overlay storage mounted
            shutil.rmtree(self.tmp, ignore_errors=True)


def ping(host: str) -> bool:
    if host.startswith("unix://") and not _answers(host.removeprefix("unix://")):
        return False  # the SDK leaks the socket of a failed unix connect (a missing path, or no daemon behind it)
    try:
        import docker  # type: ignore[import-untyped]
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


def _answers(path: str) -> bool:
    """Whether something accepts connections on the unix socket ``path`` (a stale socket file refuses them)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(3)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _dockerd_argv(tmp: Path, sock: Path) -> tuple[list[str], dict[str, str]]:
    argv = ["dockerd", "--iptables=false", "--bridge=none", "--data-root", str(tmp / "data")]
    argv += ["--exec-root", str(tmp / "exec"), "--pidfile", str(tmp / "docker.pid"), "-H", f"unix://{sock}"]
    return argv, dict(os.environ)


def _podman_argv(tmp: Path, sock: Path) -> tuple[list[str], dict[str, str]]:
    (tmp / "containers.conf").write_text(_PODMAN_CONF)
    storage = f'[storage]\ndriver = "overlay"\nrunroot = "{tmp}/run"\ngraphroot = "{tmp}/root"\n'
    (tmp / "storage.conf").write_text(storage)
    env = {**os.environ, "CONTAINERS_CONF": str(tmp / "containers.conf")}
    env["CONTAINERS_STORAGE_CONF"] = str(tmp / "storage.conf")
    argv = ["podman", "--root", str(tmp / "root"), "--runroot", str(tmp / "run")]
    return [*argv, "system", "service", "--time=0", f"unix://{sock}"], env


def start_private_daemon(kind: str = "docker", timeout: float = 30.0) -> PrivateDaemon:
    """Start a private ``dockerd`` or Podman service and wait until it answers; raises ``DaemonUnavailable``."""
    program = "dockerd" if kind == "docker" else "podman"
    if shutil.which(program) is None:
        package = "docker.io" if kind == "docker" else "podman"
        raise DaemonUnavailable(f"{program} is not installed (apt-get install {package})")
    if os.getuid() != 0:
        raise DaemonUnavailable(f"starting a private {program} needs root")
    tmp = Path(tempfile.mkdtemp(prefix=f"es{kind[:3]}-", dir="/tmp"))  # short: unix socket paths are limited
    sock = tmp / f"{kind}.sock"
    argv, env = (_dockerd_argv if kind == "docker" else _podman_argv)(tmp, sock)
    with open(tmp / "daemon.log", "wb") as log:  # the daemon keeps its own copy of the fd
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    daemon = PrivateDaemon(kind, f"unix://{sock}", str(sock), proc, tmp)
    deadline = time.monotonic() + timeout
    while not ping(daemon.host):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = (tmp / "daemon.log").read_text(errors="replace")[-800:]
            daemon.stop()
            raise DaemonUnavailable(f"a private {program} did not start: {tail}")
        time.sleep(0.05)
    return daemon


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


def import_host_usr_image(client: Any, tag: str = HOST_USR_IMAGE) -> str:
    """Import the empty test image as ``tag`` (no registry involved) and return ``tag``.

    Its languages are those whose runtimes this host's /usr has, as the image runs the host's /usr.
    """
    repo, _, version = tag.partition(":")
    languages = ",".join(available_languages("/usr/local/bin:/usr/bin:/bin"))
    answer = client.api.import_image_from_data(
        _empty_root_tar(), repository=repo, tag=version or "latest", changes=[f"LABEL {LANGUAGES_LABEL}={languages}"]
    )
    try:
        client.images.get(tag)
    except Exception:
        # Podman 4.3's compat import ignores the tag (it names the image <repo>:latest): tag it by id
        image_id = _imported_id(answer)
        client.images.get(image_id).tag(repo, version or "latest")
        client.images.get(tag)
    return tag


def _imported_id(answer: Any) -> str:
    import json

    for line in str(answer).splitlines():
        with contextlib.suppress(ValueError):
            status = json.loads(line).get("status", "")
            if status.startswith("sha256:"):
                return str(status)
    raise DaemonUnavailable(f"the daemon did not say which image it imported: {answer!r}")


def _unmount_below(path: Path) -> None:
    with open("/proc/self/mounts") as f:
        mounts = [line.split()[1] for line in f]
    for mnt in sorted((m for m in mounts if m.startswith(f"{path}/")), reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False, capture_output=True)
