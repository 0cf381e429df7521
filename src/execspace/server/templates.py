"""Templates: what a sandbox is created from (its ``templateID``), that is the runtime environment its commands and
kernels run in and the limits of the whole sandbox.

``base`` runs on the host's system directories (as E2B's base image is a plain system with its own Python);
``code-interpreter-v1`` in the ``code-interpreter`` environment (E2B's data stack), which the server builds the
first time a create needs it (:mod:`.builds`). More come from serve's config file:

.. code-block:: toml

    [templates.small]
    environment = "data"     # a runtime environment (docs/environments.md); left out: the host's dirs
    cpu_count = 0.5          # CPUs of bandwidth (a cgroup CPU quota; fractions allowed)
    memory_mb = 512          # memory of the whole sandbox (a cgroup)
    pids = 64                # processes and threads at once
    idle_pause = 60          # an autoPause sandbox idle this many seconds is paused (0: never; left out: the server's)

    [environments.data]      # its spec (as a SPEC.toml's, but requirements_file): built on first use
    requirements = ["pandas==2.2.3"]

An environment a template names that has no spec here (nor is a built-in) must be built ahead
(``execspace env build SPEC.toml``): its creates answer 500 naming that until it is.

A limit a template leaves out is the server's (``--sandbox-cpus``, ``--sandbox-memory-mb``, ``--sandbox-pids``), and
so is ``idle_pause`` (``--idle-pause``, :mod:`.idle`).
Templates with the same environment and limits share one engine (:class:`Profile`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import tomlconfig
from ..environments import EnvironmentSpec
from ..errors import InvalidSpec

__all__ = ["BUILTIN_TEMPLATES", "Profile", "Template", "load_config", "load_environments"]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True, slots=True)
class Profile:
    """What a sandbox runs in: one engine serves every template with the same profile."""

    environment: str | None = None
    cpus: float | None = None
    memory_mb: int | None = None
    pids: int | None = None
    disk_mb: int | None = None

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.cpus, self.memory_mb, self.pids, self.disk_mb))


@dataclass(frozen=True, slots=True)
class Template:
    """A template a sandbox may be created from (see the module)."""

    name: str
    environment: str | None = None
    """The runtime environment of its commands and kernels (``execspace env build NAME``); None: the host's."""
    cpu_count: float | None = None
    """CPUs of bandwidth for the whole sandbox (a cgroup CPU quota); None: the server's ``--sandbox-cpus``."""
    memory_mb: int | None = None
    """Memory of the whole sandbox; None: the server's ``--sandbox-memory-mb``."""
    disk_mb: int | None = None
    """Disk of the whole sandbox: its workspace is a filesystem of this size of its own, and its ``/tmp`` and
    ``/dev/shm`` tmpfs hold at most this much together (``SessionConfig.disk_bytes``, as root); None: the server's
    ``--sandbox-disk-mb``."""
    pids: int | None = None
    """Processes and threads of the whole sandbox at once; None: the server's ``--sandbox-pids``."""
    idle_pause: float | None = None
    """Seconds an ``autoPause`` sandbox of it may be idle before it is paused (:mod:`.idle`); 0: never; None: the
    server's ``--idle-pause``. Not part of its profile: sandboxes that differ only by it share an engine."""

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise InvalidSpec(f"template name {self.name!r}: use letters, digits, '.', '_' and '-' (at most 100)")
        if self.environment is not None and not _NAME.fullmatch(self.environment):
            raise InvalidSpec(f"template {self.name}: environment {self.environment!r} is not an environment name")
        for name in ("cpu_count", "memory_mb", "disk_mb", "pids"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value <= 0):
                raise InvalidSpec(f"template {self.name}: {name} must be positive, got {value!r}")
        if self.idle_pause is not None and (isinstance(self.idle_pause, bool) or self.idle_pause < 0):
            raise InvalidSpec(
                f"template {self.name}: idle_pause must be 0 (never) or more seconds, got {self.idle_pause!r}"
            )

    def profile(self, cpus: float | None, memory_mb: int | None, pids: int | None, disk_mb: int | None) -> Profile:
        """Its profile, with the server's limits (the arguments) where it names none."""
        return Profile(
            self.environment,
            self.cpu_count if self.cpu_count is not None else cpus,
            self.memory_mb if self.memory_mb is not None else memory_mb,
            self.pids if self.pids is not None else pids,
            self.disk_mb if self.disk_mb is not None else disk_mb,
        )


BUILTIN_TEMPLATES = {
    "base": Template("base"),
    "code-interpreter-v1": Template("code-interpreter-v1", environment="code-interpreter"),
}


@dataclass(frozen=True, slots=True)
class _ConfigFile:
    """What serve's config file holds: ``[templates.NAME]`` tables, each a :class:`Template` but its name, and
    ``[environments.NAME]`` tables, each an :class:`~execspace.environments.EnvironmentSpec` but its name."""

    templates: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    environments: Mapping[str, Mapping[str, object]] = field(default_factory=dict)


def load_config(path: Path) -> dict[str, Template]:
    """The templates of serve's config file (``[templates.NAME]`` tables) over the built-in ones (a table named
    ``base`` or ``code-interpreter-v1`` replaces it).

    Raises:
        InvalidSpec: the file cannot be read, is not TOML, or has a key or value this server does not know.
    """
    source = f"the serve config {path}"
    config = tomlconfig.load(_ConfigFile, path, source)
    templates = dict(BUILTIN_TEMPLATES)
    for name, table in config.templates.items():
        templates[name] = tomlconfig.from_table(Template, table, source, at=f"templates.{name}", fixed={"name": name})
    return templates


def load_environments(path: Path) -> dict[str, EnvironmentSpec]:
    """The environment specs of serve's config file (``[environments.NAME]`` tables), which it builds the first
    time a create needs one.

    Raises:
        InvalidSpec: the file cannot be read, is not TOML, or a spec has a key or value environments do not take.
    """
    source = f"the serve config {path}"
    config = tomlconfig.load(_ConfigFile, path, source)
    return {
        name: tomlconfig.from_table(EnvironmentSpec, table, source, at=f"environments.{name}", fixed={"name": name})
        for name, table in config.environments.items()
    }
