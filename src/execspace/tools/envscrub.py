"""Scrub a model-supplied environment before a policy-checked shell command sees it.

The command policy checks what the command line says; the environment can change what
the shell *does* before the first command runs, and what the allowed programs do after:
``BASH_ENV``/``ENV`` source a file, ``BASH_FUNC_*`` define functions that shadow the allowed
commands, ``SHELLOPTS`` with ``PS4`` runs code on trace, ``LD_PRELOAD`` loads a library into
every process, ``PATH`` picks which binary an allowed name means; ``LESSOPEN`` makes ``less``
run a shell, ``PERL5OPT``/``PERL5DB`` make every perl script (``shasum`` is one) run code,
``GIT_CONFIG_*``/``GIT_PAGER`` make ``git`` run any command. No deny list can name every such
variable of every program, so the model's names pass only through an allow-list
(:data:`DEFAULT_ENV_ALLOW`, widened by the application with ``env_allow=``). The shell's and the
loader's own variables (:data:`DROPPED_NAMES`, :data:`DROPPED_PREFIXES`) can never be allowed,
nor a name that is not a plain identifier (bash would not export it as a variable anyway).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from ..errors import InvalidSpec

__all__ = ["DEFAULT_ENV_ALLOW", "DROPPED_NAMES", "DROPPED_PREFIXES", "EnvAllowList", "dropped_names", "scrub"]

#: Names never passed through in policy mode, whatever the allow-list says.
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

#: The model's names a policy-mode run accepts by default: none of them makes a program run code
#: or read a file it would not otherwise read.
DEFAULT_ENV_ALLOW = frozenset({"TZ", "NO_COLOR", "COLUMNS", "LINES", "SOURCE_DATE_EPOCH"})

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _never(name: str) -> bool:
    # fullmatch with \Z: "$" alone would accept a trailing newline
    return _IDENTIFIER.fullmatch(name) is None or name in DROPPED_NAMES or name.startswith(DROPPED_PREFIXES)


class EnvAllowList:
    """The exact names of the model's ``env`` a policy-mode run passes on; everything else is dropped.

    Raises:
        InvalidSpec: a name that may never pass (a shell or loader variable, not an identifier).
    """

    def __init__(self, names: Iterable[str] = DEFAULT_ENV_ALLOW) -> None:
        if isinstance(names, str):
            raise InvalidSpec(f"env_allow is a list of names, got one string {names!r}")
        self.names = frozenset(names)
        if bad := sorted(n for n in self.names if _never(n)):
            raise InvalidSpec(
                f"env_allow names {bad} can never be passed in policy mode: they change what the shell or the "
                "dynamic loader runs, or are not plain identifiers"
            )

    def allows(self, name: str) -> bool:
        return name in self.names

    def describe(self) -> str:
        """Which names pass, and how the application widens the list (for the model and the developer)."""
        shown = ", ".join(sorted(self.names)) or "none"
        return (
            f"policy mode passes only these env names: {shown}; an application that has checked what a variable "
            "makes its allowed programs do widens the list with WorkspaceExecTool(env_allow=[...])"
        )


def scrub(env: Mapping[str, str], allow: EnvAllowList | None = None) -> dict[str, str]:
    """The variables of ``env`` that may reach a policy-checked shell."""
    allow = allow or EnvAllowList()
    return {k: v for k, v in env.items() if allow.allows(k)}


def dropped_names(env: Mapping[str, str], allow: EnvAllowList | None = None) -> list[str]:
    """The names :func:`scrub` drops, sorted (to tell the model what was ignored)."""
    allow = allow or EnvAllowList()
    return sorted(k for k in env if not allow.allows(k))
