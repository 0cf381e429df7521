"""Environments and images: a rootfs environment as a container image, its tree imported into the daemon once
(``docker import``, no registry), tagged by the environment's digest, so that every later engine finds it
(docs/environments.md); and whether an image can run a venv environment's Python (:func:`environment_misfit`)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...environments import DEBIAN_PATH, Environment
from ...errors import SetupFailed
from ...languages import available_languages
from .daemon import LANGUAGES_LABEL

__all__ = ["ENVIRONMENT_REPOSITORY", "environment_image", "environment_misfit", "tar_stream"]

#: The repository of environment images; the tag is the environment's name and digest.
ENVIRONMENT_REPOSITORY = "execspace-env"


def environment_image(client: Any, environment: Environment) -> str:
    """The image of the rootfs ``environment`` on ``client``'s daemon, imported now if the daemon has none
    (blocking: a minimal rootfs takes a few seconds). The digest names the tree's content, so an image found under
    its tag is that tree."""
    import docker.errors  # type: ignore[import-untyped]

    assert environment.root is not None
    tag = f"{environment.name}-{environment.digest}"
    name = f"{ENVIRONMENT_REPOSITORY}:{tag}"
    try:
        client.images.get(name)
        return name
    except docker.errors.ImageNotFound:
        pass
    # the interpreters the tree has, looked up in it (its PATH's directories under its root)
    languages = ",".join(available_languages(":".join(f"{environment.root}{d}" for d in DEBIAN_PATH.split(":"))))
    changes = [f"ENV PATH={DEBIAN_PATH}", f"LABEL {LANGUAGES_LABEL}={languages}"]
    client.api.import_image_from_data(
        tar_stream(environment.root), repository=ENVIRONMENT_REPOSITORY, tag=tag, changes=changes
    )
    client.images.get(name)  # the daemon said nothing useful if the import failed: this says it
    return name


#: Standard-library modules environments' packages import that ``python3-minimal`` leaves out: a venv environment's
#: python is the host's, its standard library the image's.
_STDLIB = ("asyncio", "contextvars", "json", "sqlite3", "ssl", "zoneinfo", "email", "http")
_FIND_MISSING = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"


def environment_misfit(api: Any, cid: str, environment: Environment, image: str, user: str) -> SetupFailed | None:
    """The error to raise when the image of container ``cid`` cannot run ``environment``'s Python (its interpreter
    does not start there, or the image's standard library lacks modules: a ``python3-minimal`` image); None when it
    can."""
    python = str(environment.python)
    exec_id = api.exec_create(cid, [python, "-I", "-c", _FIND_MISSING, *_STDLIB], user=user)["Id"]
    out = bytes(api.exec_start(exec_id)).decode("utf-8", "replace").strip()
    code = api.exec_inspect(exec_id).get("ExitCode")
    if code == 0 and not out:
        return None
    lacks = (
        f"its Python's standard library lacks {', '.join(out.split())} (python3-minimal has only part of it)"
        if code == 0
        else f"the environment's python ({python}, the host's Python {environment.python_version}) does not start "
        f"there: {out.splitlines()[-1] if out else f'exit {code}'}"
    )
    return SetupFailed(
        "container",
        f"image {image} cannot run environment {environment.name!r}: {lacks}",
        f"use an image with python3 and its whole standard library, Python {environment.python_version} at the "
        "host's path (the same Debian release as this host): `execspace image build` makes one",
    )


class _Chunks(io.RawIOBase):
    """What tarfile writes, kept until the stream takes it."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        data, self.parts = b"".join(self.parts), []
        return data


def tar_stream(root: Path) -> Iterator[bytes]:
    """``root`` as a tar stream (owners, modes, links and device nodes as they are), made as the daemon reads it."""
    out = _Chunks()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for top, dirs, files in os.walk(root):
            dirs.sort()
            for name in [*dirs, *sorted(files)]:
                path = os.path.join(top, name)
                tar.add(path, arcname=os.path.relpath(path, root), recursive=False)
                yield out.take()
    yield out.take()
