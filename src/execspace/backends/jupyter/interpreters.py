"""The Python that runs a sandboxed kernel: an interpreter the sandbox's uid can execute, with ipykernel.

Light on purpose (no ``zmq``, no ``jupyter_client``): ``execspace serve`` asks it at start-up, before any kernel.
"""

from __future__ import annotations

import contextlib
import os
import site
import stat
import sys
from dataclasses import dataclass

from ...environments import Environment
from ...workspace.hostroots import closed_ancestor

__all__ = ["Interpreter", "environment_interpreter", "find_interpreter"]


@dataclass(frozen=True, slots=True)
class Interpreter:
    """The Python that runs sandboxed kernels: this process's own packages (ipykernel) from a
    Python the sandbox uid can execute."""

    path: str
    site_dirs: tuple[str, ...]
    """This environment's site-packages, added by the launcher (when ``path`` is not this venv's python)."""
    read_paths: tuple[str, ...]
    """Host directories the sandbox policy must let the kernel read (they are hidden by default)."""


def find_interpreter() -> Interpreter | str:
    """The interpreter for sandboxed kernels, or why there is none.

    This venv's python may be a link to an interpreter the sandbox uid cannot reach (a pyenv build in
    ``/root``): then the same ``X.Y`` from the sandbox's PATH runs this venv's site-packages.
    """
    from ..sandbox import hidden_by_default, which_in_sandbox

    own = os.path.realpath(sys.executable)
    python = own if _reachable(own) else None
    if python is None:
        name = f"python{sys.version_info.major}.{sys.version_info.minor}"
        found = which_in_sandbox(name)
        python = found if found is not None and _reachable(found) else None
    if python is None:
        return (
            f"no Python {sys.version_info.major}.{sys.version_info.minor} the sandbox can run ({own} is not reachable)"
        )
    dirs = tuple(d for d in site.getsitepackages() if os.path.isdir(d))
    for d in dirs:
        if not _reachable(d):
            return f"this environment's packages ({d}) are not readable by the sandbox uid"
    prefix = os.path.realpath(sys.prefix)
    return Interpreter(python, dirs, (prefix,) if hidden_by_default(prefix) else ())


def environment_interpreter(environment: Environment) -> Interpreter | str:
    """The interpreter of a runtime environment (its own python, site-packages and ipykernel: the sandbox binds
    its tree), or why it cannot run kernels."""
    if not any(name.lower() == "ipykernel" for name in environment.packages):
        return (
            f"the environment {environment.name!r} has no ipykernel: add it to the spec's requirements and build "
            "again (the built-in code-interpreter has it)"
        )
    return Interpreter(str(environment.python), (), ())


def _reachable(path: str) -> bool:
    """Whether the sandbox uid can reach ``path``: as root that is a foreign uid, so only "other" bits count;
    otherwise the sandbox runs as us. Hidden top-level dirs (``/root``, ``/home``…) only through a grant."""
    real = os.path.realpath(path)
    if os.geteuid() != 0:
        return os.access(real, os.R_OK | os.X_OK)
    if closed_ancestor(real) is not None:
        return False
    with contextlib.suppress(OSError):
        return os.stat(real).st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
    return False
