"""The user's config file: ``$XDG_CONFIG_HOME/execspace/config.toml`` (``~/.config/execspace/config.toml`` when
``XDG_CONFIG_HOME`` is unset), read when a setting is not given as an argument or in the environment::

    [container]
    image = "execspace-python:1"
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import SetupFailed

__all__ = ["config_path", "config_string"]


def config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base, "execspace", "config.toml")


def config_string(backend: str, section: str, key: str) -> str | None:
    """``key`` of ``[section]`` in the config file, or None (no file, no such setting); ``SetupFailed`` for
    ``backend`` naming the file (and the line, for a malformed one)."""
    import tomllib  # only the callers that fall back to the file pay for it

    path = config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SetupFailed(backend, f"cannot read the config file {path} ({exc})", f"fix or remove {path}") from exc
    except tomllib.TOMLDecodeError as exc:  # its message ends "(at line N, column M)"
        raise SetupFailed(backend, f"the config file {path} is not valid TOML: {exc}", f"fix {path}") from exc
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise SetupFailed(backend, f"the config file {path} has {section} = {table!r}, not a table", f"fix {path}")
    value = table.get(key)
    if value is not None and not isinstance(value, str):
        raise SetupFailed(
            backend,
            f"the config file {path} has [{section}] {key} = {value!r}, not a string",
            f'write {key} = "NAME" under [{section}] in {path}',
        )
    return value
