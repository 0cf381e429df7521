"""A rootfs environment as a container image: its tree imported into the daemon once (``docker import``, no
registry), tagged by the environment's digest, so that every later engine finds it (docs/environments.md)."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...environments import DEBIAN_PATH, Environment
from ...languages import available_languages
from .daemon import LANGUAGES_LABEL

__all__ = ["ENVIRONMENT_REPOSITORY", "environment_image"]

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
        _tar_stream(environment.root), repository=ENVIRONMENT_REPOSITORY, tag=tag, changes=changes
    )
    client.images.get(name)  # the daemon said nothing useful if the import failed: this says it
    return name


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


def _tar_stream(root: Path) -> Iterator[bytes]:
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
