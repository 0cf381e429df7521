"""Which environment variables a program sees.

Order of construction (later wins):

1. the inherited base: ``all`` host variables, the ``core`` set, or ``none``
   (``clean_env=True`` on a run forces ``none``);
2. secret-looking names dropped (on by default), then ``exclude``;
3. ``include_only`` keeps just the listed names, if given;
4. ``set`` from the policy, then the run's own ``env``;
5. a minimal ``PATH`` when none is left;
6. the workspace variables (``WORKSPACE_DIR``, ``HOME``, ``TMPDIR``…), which always win.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["CORE_VARIABLES", "MINIMAL_PATH", "SECRET_MARKERS", "EnvPolicy", "is_secret_name"]

#: Variables kept by ``inherit="core"``: enough for programs to behave, nothing that identifies secrets.
CORE_VARIABLES = frozenset(
    {"PATH", "SHELL", "HOME", "TMPDIR", "TMP", "TEMP", "LANG", "LC_ALL", "LC_CTYPE", "USER", "LOGNAME", "TERM", "TZ"}
)
_CORE_ORDER = tuple(sorted(CORE_VARIABLES))
#: Substrings that mark a variable name as a secret (matched on the upper-cased name).
SECRET_MARKERS = ("KEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "AUTH", "COOKIE", "SESSION")
MINIMAL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_VALID_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@functools.lru_cache(maxsize=1024)  # every run asks about the same few names
def is_secret_name(name: str) -> bool:
    """True when ``name`` looks like it holds a credential (``API_KEY``, ``GITHUB_TOKEN``…)."""
    upper = name.upper()
    return any(marker in upper for marker in SECRET_MARKERS)


@dataclass(frozen=True, slots=True)
class EnvPolicy:
    """How a run's environment is built from the host's (see the module docstring for the order)."""

    inherit: Literal["all", "core", "none"] = "core"
    exclude_secrets: bool = True
    """Drop variables whose names look like secrets (KEY, TOKEN, SECRET, PASSWORD, CREDENTIAL…)."""
    exclude: Sequence[str] = ()
    """Extra names or fnmatch patterns (``AWS_*``) to drop from the inherited base."""
    include_only: Sequence[str] | None = None
    """If given, keep only these inherited names/patterns (after the excludes)."""
    set: Mapping[str, str] = field(default_factory=dict)
    """Variables always set (a run's own ``env`` overrides them)."""

    def build(
        self,
        host_env: Mapping[str, str],
        run_env: Mapping[str, str],
        workspace_env: Mapping[str, str],
        *,
        clean: bool = False,
    ) -> dict[str, str]:
        """Return the environment of one run."""
        base = self._inherited(host_env, "none" if clean else self.inherit)
        env = {**base, **self.set, **run_env}
        if not env.get("PATH"):
            env["PATH"] = MINIMAL_PATH
        env.update(workspace_env)
        return env

    def inherited_names(self, names: Iterable[str], *, clean: bool = False) -> list[str]:
        """Which of ``names`` (those of an environment whose values are read elsewhere: a remote sandbox's) a run
        inherits, in order: step 1 to 3 of the module docstring."""
        return list(self._inherited(dict.fromkeys(names, ""), "none" if clean else self.inherit))

    def program_path(self, host_env: Mapping[str, str]) -> str:
        """The PATH a run gets from ``host_env`` (where its language runtimes are looked up)."""
        return self.build(host_env, {}, {})["PATH"]

    def _inherited(self, host_env: Mapping[str, str], inherit: str) -> dict[str, str]:
        if inherit == "none":
            return {}
        if inherit == "core":
            # a dozen lookups, not a walk of the whole host environment (every run pays for this), each one
            # lookup (os.environ's ``in`` and ``[]`` each encode the key and decode the value)
            env = {k: v for k in _CORE_ORDER if (v := host_env.get(k)) is not None}
        else:
            env = {k: v for k, v in host_env.items() if _VALID_NAME.match(k)}
        if self.exclude_secrets:
            env = {k: v for k, v in env.items() if not is_secret_name(k)}
        if self.exclude:
            env = {k: v for k, v in env.items() if not _matches(k, self.exclude)}
        if self.include_only is not None:
            env = {k: v for k, v in env.items() if _matches(k, self.include_only)}
        return env


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)
