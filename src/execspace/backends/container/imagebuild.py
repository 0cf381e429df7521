"""``execspace image build``: the container backend's image, made by the installed package (no checkout needed).

Two ways, the same image: a small Debian with ``python3`` (its whole standard library: ``python3-minimal`` lacks
``contextvars``, ``asyncio``… that environments' packages import) and the ``execspace.languages`` label naming the
runtimes it has.

- ``rootfs`` (default where ``mmdebstrap`` is installed, a Debian host): the root is built on the host from the
  host's own apt sources (:mod:`execspace.environments.rootfs`, as rootfs environments are) and imported into the
  daemon (``docker import``): no registry is involved.
- ``dockerfile``: the daemon builds the :data:`DOCKERFILE` shipped in this package (``FROM debian:bookworm-slim``;
  ``--base`` names another), which needs a daemon that can pull the base image and reach Debian's archive.

Each line of progress (mmdebstrap's, the daemon's build output) goes to ``progress`` as it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ...environments import DEBIAN_PATH
from ...environments.buildcommand import run_command
from ...environments.rootfs import debian_target, mmdebstrap_argv
from ...errors import EnvironmentBuildFailed, SetupFailed
from ...languages import available_languages
from .daemon import LANGUAGES_LABEL
from .envimage import tar_stream

__all__ = ["DEFAULT_IMAGE", "DOCKERFILE", "IMAGE_PACKAGES", "Via", "build_image", "default_via"]

#: The image the docs, ``execspace doctor`` and the acceptance checks name.
DEFAULT_IMAGE = "execspace-python:bookworm"
#: What the image has beyond a minimal Debian: Python with its whole standard library.
IMAGE_PACKAGES = ("python3",)
#: The Dockerfile of the ``dockerfile`` way, package data beside this module.
DOCKERFILE = "image.Dockerfile"

Via = Literal["rootfs", "dockerfile"]
Progress = Callable[[str], None]


def default_via() -> Via:
    """``rootfs`` where this host can build a Debian root (root, mmdebstrap installed), else ``dockerfile``."""
    return "rootfs" if os.geteuid() == 0 and shutil.which("mmdebstrap") else "dockerfile"


def dockerfile_text() -> str:
    return resources.files(__package__).joinpath(DOCKERFILE).read_text(encoding="utf-8")


async def build_image(client: Any, name: str, via: Via, progress: Progress, *, suite: str = "", base: str = "") -> str:
    """Build the image ``name`` on ``client``'s daemon ``via`` one of the two ways; returns ``name``.

    Raises:
        EnvironmentBuildFailed: the root could not be built (no Debian host, mmdebstrap failed: its last lines).
        SetupFailed: the daemon refused the import or the build (its message).
    """
    if via == "rootfs":
        await _from_rootfs(client, name, progress, suite)
    else:
        await asyncio.to_thread(_from_dockerfile, client, name, progress, base)
    return name


async def _from_rootfs(client: Any, name: str, progress: Progress, suite: str) -> None:
    if os.geteuid() != 0:
        # a normal user's mmdebstrap makes the tree in a user namespace: files of subordinate uids, which neither
        # the import can read (/etc/shadow) nor we can remove
        raise EnvironmentBuildFailed(
            "building the image's root filesystem needs root", "run it as root (sudo), or build with --via dockerfile"
        )
    target = debian_target(suite)
    with tempfile.TemporaryDirectory(prefix="execspace-image-") as tmp:
        sources, tree = Path(tmp, "sources.list"), Path(tmp, "rootfs")
        await asyncio.to_thread(sources.write_text, target.sources, encoding="utf-8")
        progress(f"building a Debian {target.suite} root with {', '.join(IMAGE_PACKAGES)} (mmdebstrap, host apt)")
        await _stream(mmdebstrap_argv(target, IMAGE_PACKAGES, tree, sources), progress)
        os.chmod(tree, 0o755)  # noqa: S103 - the image's /
        os.chmod(tree / "tmp", 0o1777)  # noqa: S103 - the daemon copies it onto the container's tmpfs /tmp
        languages = ",".join(available_languages(":".join(f"{tree}{d}" for d in DEBIAN_PATH.split(":"))))
        progress(f"importing it into the daemon as {name} (languages: {languages or 'none'})")
        repository, _, tag = name.rpartition(":") if ":" in name.rpartition("/")[2] else (name, "", "latest")
        changes = [f"ENV PATH={DEBIAN_PATH}", f"LABEL {LANGUAGES_LABEL}={languages}"]
        try:
            answer = await asyncio.to_thread(
                client.api.import_image_from_data, tar_stream(tree), repository=repository, tag=tag, changes=changes
            )
        except Exception as exc:
            raise SetupFailed("container", f"the daemon did not import the image ({exc})", _DAEMON_FIX) from exc
    await asyncio.to_thread(_tagged, client, name, repository, tag, answer)


def _tagged(client: Any, name: str, repository: str, tag: str, answer: Any) -> None:
    """Make sure the daemon knows the image as ``name``: Podman's compat import ignores the tag (``<repo>:latest``)."""
    import docker.errors  # type: ignore[import-untyped]

    with contextlib.suppress(docker.errors.ImageNotFound):
        client.images.get(name)
        return
    imported = next((w for w in str(answer).replace('"', " ").split() if w.startswith("sha256:")), "")
    try:
        client.images.get(imported or f"{repository}:latest").tag(repository, tag)
        client.images.get(name)
    except Exception as exc:
        raise SetupFailed("container", f"the daemon imported the root but has no image {name} ({exc})", "") from exc


def _from_dockerfile(client: Any, name: str, progress: Progress, base: str) -> None:
    progress(f"building {name} from the packaged Dockerfile (FROM {base or 'debian:bookworm-slim'}) on the daemon")
    args = {"BASE": base} if base else {}
    try:
        for event in client.api.build(
            fileobj=io.BytesIO(_context()), custom_context=True, tag=name, buildargs=args, rm=True, decode=True
        ):
            if "error" in event:
                raise SetupFailed("container", f"the daemon's build of {name} failed: {event['error']}", _BUILD_FIX)
            for line in str(event.get("stream", "")).splitlines():
                if line.strip():
                    progress(line)
    except SetupFailed:
        raise
    except Exception as exc:
        raise SetupFailed("container", f"the daemon did not build {name} ({exc})", _BUILD_FIX) from exc


def _context() -> bytes:
    """The build context: the Dockerfile alone."""
    data = dockerfile_text().encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def _stream(argv: list[str], progress: Progress) -> None:
    """Run ``argv``, each line of its output to ``progress``; a failure names the command and its last lines."""
    code, lines = await run_command(argv, progress)
    if code != 0:
        raise EnvironmentBuildFailed(
            f"mmdebstrap failed (exit {code}):\n" + "\n".join(lines[-20:]),
            "check the host's apt sources reach Debian's archive, or build with --via dockerfile",
        )


_DAEMON_FIX = "check the daemon is healthy and has room (docker system df), then build again"
_BUILD_FIX = (
    "the daemon must be able to pull the base image and reach Debian's archive; on a Debian host without that, "
    "build with --via rootfs (apt-get install mmdebstrap)"
)
