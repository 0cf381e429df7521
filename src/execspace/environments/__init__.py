"""Runtime environments: named, immutable trees (a venv of a system Python with pip packages, or a minimal Debian
root with apt packages) built once from the package registries into a per-user cache and bound read-only into every
sandbox that runs in one (docs/environments.md).

::

    env = await build(builtin_spec("code-interpreter"), progress=print)
    env = get("code-interpreter-v1")          # E2B's template name maps to the built-in
    open_engine("sandbox", environment="code-interpreter")
"""

from __future__ import annotations

from pathlib import Path

from .rootfs import DEBIAN_PATH, lookup_in_root
from .spec import BUILTIN_SPECS, TEMPLATE_ALIASES, EnvironmentSpec, builtin_spec, canonical_name, load_spec
from .store import MARKER, BuildEvent, Environment, EnvironmentStore, Progress, default_root

__all__ = [
    "BUILTIN_SPECS",
    "DEBIAN_PATH",
    "MARKER",
    "TEMPLATE_ALIASES",
    "BuildEvent",
    "Environment",
    "EnvironmentSpec",
    "EnvironmentStore",
    "Progress",
    "build",
    "builtin_spec",
    "canonical_name",
    "default_root",
    "get",
    "list_environments",
    "load_spec",
    "lookup_in_root",
    "remove",
]


async def build(spec: EnvironmentSpec, *, progress: Progress | None = None, root: Path | None = None) -> Environment:
    """Build ``spec`` into the store at ``root`` (default :func:`default_root`); see :meth:`EnvironmentStore.build`."""
    return await EnvironmentStore(root).build(spec, progress=progress)


def get(name: str, *, root: Path | None = None) -> Environment:
    """The built environment ``name``; ``EnvironmentNotFound`` naming ``execspace env build NAME`` if there is none."""
    return EnvironmentStore(root).get(name)


def list_environments(*, root: Path | None = None) -> list[Environment]:
    """Every complete environment in the store."""
    return EnvironmentStore(root).environments()


def remove(name: str, *, root: Path | None = None) -> list[Path]:
    """Remove every tree of ``name``; the paths removed."""
    return EnvironmentStore(root).remove(name)
