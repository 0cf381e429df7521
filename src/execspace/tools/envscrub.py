"""Scrub a model-supplied environment before a policy-checked shell command sees it.

The command policy checks what the command line says; the environment can change what
the shell *does* before the first command runs: ``BASH_ENV``/``ENV`` source a file,
``BASH_FUNC_*`` define functions that shadow the allowed commands, ``SHELLOPTS`` with
``PS4`` runs code on trace, ``LD_PRELOAD`` loads a library into every process, ``PATH``
picks which binary an allowed name means. All of these are dropped, as is every name
that is not a plain identifier (bash would not export it as a variable anyway).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["DROPPED_NAMES", "DROPPED_PREFIXES", "dropped_names", "scrub"]

#: Names never passed through in policy mode.
DROPPED_NAMES = frozenset(
    {
        "HOME",
        "ENV",
        "BASH_ENV",
        "PROMPT_COMMAND",
        "PS4",
        "SHELL",
        "SHELLOPTS",
        "BASHOPTS",
        "PATH",
        "IFS",
        "CDPATH",
        "GLOBIGNORE",
    }
)
#: Name prefixes never passed through (dynamic loader of Linux and macOS, exported bash functions).
DROPPED_PREFIXES = ("LD_", "DYLD_", "BASH_FUNC_")

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _allowed(name: str) -> bool:
    # fullmatch with \Z: "$" alone would accept a trailing newline
    return (
        _IDENTIFIER.fullmatch(name) is not None and name not in DROPPED_NAMES and not name.startswith(DROPPED_PREFIXES)
    )


def scrub(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that are safe to hand to a policy-checked shell."""
    return {k: v for k, v in env.items() if _allowed(k)}


def dropped_names(env: Mapping[str, str]) -> list[str]:
    """The names :func:`scrub` drops, sorted (to tell the model what was ignored)."""
    return sorted(k for k in env if not _allowed(k))
