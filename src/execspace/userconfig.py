"""The user's config file: ``$XDG_CONFIG_HOME/execspace/config.toml`` (``~/.config/execspace/config.toml`` when
``XDG_CONFIG_HOME`` is unset), read when a setting is not given as an argument or in the environment::

    [container]
    image = "execspace-python:1"
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import InvalidSpec, SetupFailed

__all__ = ["ContainerSettings", "UserConfig", "config_path", "user_config"]


@dataclass(frozen=True, slots=True)
class ContainerSettings:
    """``[container]``: the container backend's settings."""

    image: str | None = None
    """The image workspaces run when neither ``image=`` (``--image``) nor ``$EXECSPACE_CONTAINER_IMAGE`` names one."""


@dataclass(frozen=True, slots=True)
class UserConfig:
    """What the file holds (every key it may have; another is refused naming these)."""

    container: ContainerSettings = field(default_factory=ContainerSettings)


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "execspace", "config.toml")


def user_config(backend: str) -> UserConfig:
    """The config file's settings (all defaults without one); ``SetupFailed`` for ``backend`` naming the file, and
    the line of a malformed one or the key of a wrong setting."""
    from . import tomlconfig  # only the callers that fall back to the file pay for reading TOML

    path = config_path()
    try:
        return tomlconfig.load(UserConfig, path, f"the config file {path}", missing_ok=True)
    except InvalidSpec as exc:
        raise SetupFailed(backend, str(exc), f"fix or remove {path}") from None
